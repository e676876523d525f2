//! `sandbase credits`: the team's balance and grants.

use sandbase_api::billing::BalanceAnswer;
use sandbase_billing::Credits;

use crate::GlobalArgs;
use crate::client::Client;
use crate::output::{optional_time, table};

pub async fn credits(global: &GlobalArgs) -> anyhow::Result<()> {
    let client = Client::new(global)?;
    client.require_token()?;
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
