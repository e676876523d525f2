//! `sandbase credits`: the team's balance and grants.

use sandbase_api::billing::BalanceAnswer;
use sandbase_billing::Credits;

use crate::GlobalArgs;
use crate::client::Client;
use crate::output::{optional_time, table};

#[derive(clap::Subcommand)]
pub enum CreditsCommand {
    /// Buy credits: prints the Stripe Checkout link to pay at.
    Buy { credits: u64 },
}

pub async fn credits(global: &GlobalArgs, command: Option<CreditsCommand>) -> anyhow::Result<()> {
    let client = Client::new(global)?;
    client.require_token()?;
    if let Some(CreditsCommand::Buy { credits }) = command {
        let answer: sandbase_api::billing::CheckoutAnswer = client
            .post(
                "/v1/billing/checkout",
                &sandbase_api::billing::CheckoutRequest { credits },
            )
            .await?;
        if global.json {
            println!("{}", serde_json::to_string_pretty(&answer)?);
        } else {
            println!("Pay for {credits} credits at:\n{}", answer.url);
            println!("(the credits arrive once Stripe confirms the payment)");
        }
        return Ok(());
    }
    let balance: BalanceAnswer = client.get("/v1/billing/balance", &[]).await?;
    if global.json {
        println!("{}", serde_json::to_string_pretty(&balance)?);
        return Ok(());
    }
    println!("available: {} credits", balance.available);
    println!();
    let rows: Vec<Vec<String>> = balance
        .grants
        .iter()
        .map(|grant| {
            vec![
                grant.source.clone(),
                Credits(grant.amount_micro).to_string(),
                Credits(grant.remaining_micro).to_string(),
                grant.priority.to_string(),
                if grant.expired {
                    "expired".to_owned()
                } else {
                    optional_time(&grant.expires_at)
                },
            ]
        })
        .collect();
    table(
        &["GRANT", "AMOUNT", "REMAINING", "PRIORITY", "EXPIRES"],
        &rows,
    );
    Ok(())
}
