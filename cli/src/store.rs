//! `sandbase store`: the models the gateway offers with one key, and the team's calls.

use sandbase_api::store::{StoreApiList, StoreModelList, StoreRequestList};

use crate::args::GlobalArgs;
use crate::client::Client;
use crate::output::{emit, table, time};

#[derive(clap::Subcommand)]
pub enum StoreCommand {
    /// The models offered, with prices in credits per million tokens.
    Models,
    /// The paid APIs offered (at `<gateway>/store/apis/NAME/…`), with their prices.
    Apis,
    /// The team's calls to the store, newest first: model, tokens, credits, latency.
    Requests {
        /// How many (1–500).
        #[arg(long, default_value_t = 20)]
        limit: u32,
    },
}

pub async fn run(global: &GlobalArgs, command: StoreCommand) -> anyhow::Result<()> {
    let client = Client::new(global)?;
    client.require_token()?;
    match command {
        StoreCommand::Models => models(&client, global.json).await,
        StoreCommand::Apis => apis(&client, global.json).await,
        StoreCommand::Requests { limit } => requests(&client, global.json, limit).await,
    }
}

async fn models(client: &Client, json: bool) -> anyhow::Result<()> {
    let list: StoreModelList = client.get("/v1/store/models", &[]).await?;
    emit(json, &list, |list| {
        if list.models.is_empty() {
            println!(
                "The store offers no models yet. An operator adds a provider and its models \
                 under [store] in the gateway's configuration (see sandbase.example.toml), or \
                 starts `sandbase dev` with OPENAI_API_KEY or ANTHROPIC_API_KEY set."
            );
            return;
        }
        let rows: Vec<Vec<String>> = list
            .models
            .iter()
            .map(|model| {
                vec![
                    model.id.clone(),
                    model.family.clone(),
                    model.context_window.to_string(),
                    model.prices.input.clone(),
                    model.prices.cached_input.clone(),
                    model.prices.cache_write.clone(),
                    model.prices.output.clone(),
                ]
            })
            .collect();
        table(
            &[
                "MODEL",
                "FAMILY",
                "CONTEXT",
                "INPUT/M",
                "CACHED/M",
                "CACHE WRITE/M",
                "OUTPUT/M",
            ],
            &rows,
        );
        println!(
            "\nOpenAI SDKs: base_url = <gateway>/openai/v1; Anthropic SDKs: <gateway>/anthropic; the key is your SandBase key."
        );
    })
}

async fn apis(client: &Client, json: bool) -> anyhow::Result<()> {
    let list: StoreApiList = client.get("/v1/store/apis", &[]).await?;
    emit(json, &list, |list| {
        if list.apis.is_empty() {
            println!("The store offers no paid APIs: an operator adds them under [[store.apis]].");
            return;
        }
        let rows: Vec<Vec<String>> = list
            .apis
            .iter()
            .map(|api| {
                vec![
                    api.name.clone(),
                    api.price_per_call.clone(),
                    api.price_per_mib.clone(),
                ]
            })
            .collect();
        table(&["API", "PER CALL", "PER MIB"], &rows);
        println!("\nCall them at <gateway>/store/apis/NAME/PATH with your SandBase key.");
    })
}

async fn requests(client: &Client, json: bool, limit: u32) -> anyhow::Result<()> {
    let list: StoreRequestList = client
        .get("/v1/store/requests", &[("limit", limit.to_string())])
        .await?;
    emit(json, &list, |list| {
        let rows: Vec<Vec<String>> = list
            .requests
            .iter()
            .map(|request| {
                let tokens = request.tokens;
                vec![
                    request.id.to_string(),
                    time(&request.created_at),
                    request.name.clone(),
                    request.endpoint.clone(),
                    request.status.to_string(),
                    format!(
                        "{}/{}/{}/{}",
                        tokens.input, tokens.cached_input, tokens.cache_write, tokens.output
                    ),
                    if request.estimated {
                        format!("{} (estimated)", request.credits)
                    } else {
                        request.credits.clone()
                    },
                    format!("{} ms", request.latency_ms),
                ]
            })
            .collect();
        table(
            &[
                "REQUEST",
                "AT",
                "MODEL",
                "ENDPOINT",
                "STATUS",
                "IN/CACHED/WRITE/OUT",
                "CREDITS",
                "LATENCY",
            ],
            &rows,
        );
    })
}
