//! The client verbs.

use std::io::{BufRead, IsTerminal};

use anyhow::Context;
use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};
use sandbase_api::{
    AddMemberRequest, ApiKey, ApiKeyList, AuditPage, CreateApiKeyRequest, CreatedApiKey,
    Invitation, LoginRequest, LoginResponse, Me, Member, MemberList, Role, SignupRequest,
    SignupResponse, UpdateMemberRequest,
};
use uuid::Uuid;

use crate::args::GlobalArgs;
use crate::client::Client;
use crate::credentials;
use crate::output::{emit, optional_time, table, time};

#[derive(Args)]
pub struct SignupArgs {
    #[arg(long)]
    email: String,
    /// Name of the team to create.
    #[arg(long)]
    team: String,
    #[command(flatten)]
    password: PasswordArgs,
    /// Do not save the new API key for the CLI.
    #[arg(long)]
    no_save: bool,
}

#[derive(Args)]
pub struct LoginArgs {
    #[arg(long)]
    email: String,
    /// Team to log into (default: the oldest one).
    #[arg(long)]
    team: Option<Uuid>,
    #[command(flatten)]
    password: PasswordArgs,
    /// Only print a session token; do not create and save an API key.
    #[arg(long)]
    no_save: bool,
}

#[derive(Args)]
struct PasswordArgs {
    /// Read the password from the first line of standard input.
    #[arg(long)]
    password_stdin: bool,
}

impl PasswordArgs {
    /// SANDBASE_PASSWORD, else standard input with `--password-stdin`, else a prompt.
    fn read(&self) -> anyhow::Result<String> {
        if let Ok(password) = std::env::var("SANDBASE_PASSWORD")
            && !password.is_empty()
        {
            return Ok(password);
        }
        if self.password_stdin || !std::io::stdin().is_terminal() {
            let mut line = String::new();
            std::io::stdin()
                .lock()
                .read_line(&mut line)
                .context("reading the password")?;
            let password = line.trim_end_matches(['\r', '\n']).to_owned();
            anyhow::ensure!(!password.is_empty(), "no password on standard input");
            return Ok(password);
        }
        rpassword::prompt_password("Password: ").context("reading the password")
    }
}

#[derive(Subcommand)]
pub enum KeysCommand {
    /// Create an API key and print its token (shown once).
    Create {
        name: String,
        #[arg(long)]
        role: Option<Role>,
        /// Lifetime in seconds.
        #[arg(long)]
        expires_in: Option<u64>,
        /// Spend cap in credits: what the key's sandboxes may cost in all.
        #[arg(long = "max-credits")]
        max_credits: Option<String>,
        /// A store model the key may call (a pattern such as `openai/*`; repeat for more).
        /// Without it, any model.
        #[arg(long = "allow-model")]
        allow_model: Vec<String>,
    },
    /// List the team's active API keys.
    Ls,
    /// Revoke an API key by id.
    Revoke { id: Uuid },
}

#[derive(Subcommand)]
pub enum MembersCommand {
    /// List the team's members.
    Ls,
    /// Invite a person by e-mail; they join when they accept.
    Add {
        email: String,
        #[arg(long, default_value = "member")]
        role: Role,
    },
    /// Change a member's role.
    SetRole { user_id: Uuid, role: Role },
    /// Remove a member (their API keys for this team are revoked).
    Rm { user_id: Uuid },
}

#[derive(Args)]
pub struct AuditArgs {
    /// Events at or after this time (RFC 3339).
    #[arg(long)]
    from: Option<DateTime<Utc>>,
    /// Events before this time (RFC 3339).
    #[arg(long)]
    to: Option<DateTime<Utc>>,
    /// A user id or API key id.
    #[arg(long)]
    actor: Option<String>,
    /// An action such as `api_key.create`, or a prefix such as `member.*`.
    #[arg(long)]
    action: Option<String>,
    /// Most events to show.
    #[arg(long, default_value_t = 50)]
    limit: usize,
}

pub async fn signup(global: &GlobalArgs, args: SignupArgs) -> anyhow::Result<()> {
    let password = args.password.read()?;
    let client = Client::with_token(resolve_url(global)?, None)?;
    let response: SignupResponse = client
        .post(
            "/v1/auth/signup",
            &SignupRequest {
                email: args.email,
                password,
                team_name: args.team,
            },
        )
        .await?;
    let saved = if args.no_save {
        None
    } else {
        Some(credentials::save(
            &client.base_url,
            &response.api_key.token,
        )?)
    };
    emit(global.json, &response, |_| {
        println!(
            "Signed up {} (team {} {})",
            response.user.email, response.team.name, response.team.id
        );
        println!("API key:  {}", response.api_key.token);
        println!("          shown only now; keep it somewhere safe");
        if let Some(path) = saved {
            println!("Saved for the CLI in {}", path.display());
        }
    })
}

pub async fn login(global: &GlobalArgs, args: LoginArgs) -> anyhow::Result<()> {
    let password = args.password.read()?;
    let base_url = resolve_url(global)?;
    let client = Client::with_token(base_url.clone(), None)?;
    let response: LoginResponse = client
        .post(
            "/v1/auth/login",
            &LoginRequest {
                email: args.email,
                password,
                team_id: args.team,
            },
        )
        .await?;
    if args.no_save {
        return emit(global.json, &response, |_| {
            println!(
                "Logged in as {} ({} in {})",
                response.user.email, response.role, response.team.name
            );
            println!("export SANDBASE_TOKEN={}", response.session.token);
            println!("(session expires {})", time(&response.session.expires_at));
        });
    }
    let session_client = Client::with_token(base_url, Some(response.session.token.clone()))?;
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "this machine".to_owned());
    let created: CreatedApiKey = session_client
        .post(
            "/v1/api-keys",
            &CreateApiKeyRequest {
                name: format!("cli on {host}"),
                // The person's own role: the terminal is them (a key's default is `member`).
                role: Some(response.role),
                ..CreateApiKeyRequest::default()
            },
        )
        .await?;
    let path = credentials::save(&session_client.base_url, &created.token)?;
    emit(
        global.json,
        &serde_json::json!({ "login": response, "api_key": created }),
        |_| {
            println!(
                "Logged in as {} ({} in {})",
                response.user.email, response.role, response.team.name
            );
            println!(
                "Created API key {} and saved it in {}",
                created.key.public_id,
                path.display()
            );
        },
    )
}

pub async fn whoami(global: &GlobalArgs) -> anyhow::Result<()> {
    let client = Client::new(global)?;
    client.require_token()?;
    let me: Me = client.get("/v1/me", &[]).await?;
    emit(global.json, &me, |_| {
        println!("Team:  {} ({})", me.team.name, me.team.id);
        println!("Role:  {}", me.role);
        if let Some(user) = &me.user {
            println!("User:  {} ({})", user.email, user.id);
        }
        match &me.api_key {
            Some(key) => println!("Auth:  API key {} \"{}\"", key.public_id, key.name),
            None => println!("Auth:  session"),
        }
        println!("API:   {}", client.base_url);
    })
}

pub async fn keys(global: &GlobalArgs, command: KeysCommand) -> anyhow::Result<()> {
    let client = Client::new(global)?;
    client.require_token()?;
    match command {
        KeysCommand::Create {
            name,
            role,
            expires_in,
            max_credits,
            allow_model,
        } => {
            let created: CreatedApiKey = client
                .post(
                    "/v1/api-keys",
                    &CreateApiKeyRequest {
                        name,
                        role,
                        expires_at: None,
                        expires_in_secs: expires_in,
                        max_credits,
                        allowed_models: (!allow_model.is_empty()).then_some(allow_model),
                    },
                )
                .await?;
            emit(global.json, &created, |_| {
                println!(
                    "Created API key {} ({})",
                    created.key.public_id, created.key.id
                );
                println!("{}", created.token);
                println!("shown only now; keep it somewhere safe");
            })?;
        }
        KeysCommand::Ls => {
            let list: ApiKeyList = client.get("/v1/api-keys", &[]).await?;
            emit(global.json, &list, |_| {
                let rows: Vec<Vec<String>> = list.items.iter().map(key_row).collect();
                table(
                    &[
                        "ID",
                        "PUBLIC ID",
                        "NAME",
                        "ROLE",
                        "CREATED",
                        "LAST USED",
                        "EXPIRES",
                        "SPENT / CAP",
                    ],
                    &rows,
                );
            })?;
        }
        KeysCommand::Revoke { id } => {
            client.delete(&format!("/v1/api-keys/{id}")).await?;
            emit(global.json, &serde_json::json!({ "revoked": id }), |_| {
                println!("Revoked API key {id}");
            })?;
        }
    }
    Ok(())
}

fn key_row(key: &ApiKey) -> Vec<String> {
    vec![
        key.id.to_string(),
        key.public_id.clone(),
        key.name.clone(),
        key.role.to_string(),
        time(&key.created_at),
        optional_time(&key.last_used_at),
        optional_time(&key.expires_at),
        format!(
            "{} / {}",
            sandbase_billing::Credits(key.spent_micro.unwrap_or(0)),
            key.max_credits_micro
                .map_or("-".to_owned(), |cap| sandbase_billing::Credits(cap)
                    .to_string())
        ),
    ]
}

pub async fn members(global: &GlobalArgs, command: MembersCommand) -> anyhow::Result<()> {
    let client = Client::new(global)?;
    client.require_token()?;
    match command {
        MembersCommand::Ls => {
            let list: MemberList = client.get("/v1/team/members", &[]).await?;
            emit(global.json, &list, |_| {
                let rows: Vec<Vec<String>> = list
                    .items
                    .iter()
                    .map(|member| {
                        vec![
                            member.user_id.to_string(),
                            member.email.clone(),
                            member.role.to_string(),
                            time(&member.joined_at),
                        ]
                    })
                    .collect();
                table(&["USER ID", "EMAIL", "ROLE", "JOINED"], &rows);
            })?;
        }
        MembersCommand::Add { email, role } => {
            let invitation: Invitation = client
                .post("/v1/team/members", &AddMemberRequest { email, role })
                .await?;
            emit(global.json, &invitation, |_| {
                println!(
                    "Invited {} as {} (until {}): they join once they accept it, logged in \
                     (POST /v1/invitations/{}/accept)",
                    invitation.email,
                    invitation.role,
                    time(&invitation.expires_at),
                    invitation.id
                );
            })?;
        }
        MembersCommand::SetRole { user_id, role } => {
            let member: Member = client
                .patch(
                    &format!("/v1/team/members/{user_id}"),
                    &UpdateMemberRequest { role },
                )
                .await?;
            emit(global.json, &member, |_| {
                println!("{} is now {}", member.email, member.role);
            })?;
        }
        MembersCommand::Rm { user_id } => {
            client
                .delete(&format!("/v1/team/members/{user_id}"))
                .await?;
            emit(
                global.json,
                &serde_json::json!({ "removed": user_id }),
                |_| {
                    println!("Removed {user_id}");
                },
            )?;
        }
    }
    Ok(())
}

pub async fn audit(global: &GlobalArgs, args: AuditArgs) -> anyhow::Result<()> {
    let client = Client::new(global)?;
    client.require_token()?;
    let mut events = Vec::new();
    let mut cursor: Option<String> = None;
    while events.len() < args.limit {
        let mut query: Vec<(&str, String)> =
            vec![("limit", (args.limit - events.len()).min(500).to_string())];
        if let Some(from) = args.from {
            query.push(("from", from.to_rfc3339()));
        }
        if let Some(to) = args.to {
            query.push(("to", to.to_rfc3339()));
        }
        if let Some(actor) = &args.actor {
            query.push(("actor", actor.clone()));
        }
        if let Some(action) = &args.action {
            query.push(("action", action.clone()));
        }
        if let Some(cursor) = &cursor {
            query.push(("cursor", cursor.clone()));
        }
        let page: AuditPage = client.get("/v1/audit", &query).await?;
        events.extend(page.items);
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    emit(global.json, &events, |_| {
        let rows: Vec<Vec<String>> = events
            .iter()
            .map(|event| {
                vec![
                    time(&event.occurred_at),
                    event.action.clone(),
                    event.outcome.clone(),
                    format!(
                        "{}:{}",
                        event.actor_type,
                        event.actor_id.as_deref().unwrap_or("-")
                    ),
                    event.target.clone().unwrap_or_else(|| "-".to_owned()),
                    event.source_ip.clone().unwrap_or_else(|| "-".to_owned()),
                ]
            })
            .collect();
        table(
            &["TIME", "ACTION", "OUTCOME", "ACTOR", "TARGET", "SOURCE"],
            &rows,
        );
    })
}

fn resolve_url(global: &GlobalArgs) -> anyhow::Result<String> {
    Ok(global
        .url
        .clone()
        .or(credentials::load()?.map(|saved| saved.url))
        .unwrap_or_else(|| crate::client::DEFAULT_URL.to_owned()))
}
