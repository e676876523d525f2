//! `sandbase credits`: the team's balance and grants.

use sandbase_api::billing::BalanceAnswer;
use sandbase_billing::Credits;

use crate::args::GlobalArgs;
use crate::client::Client;
use crate::output::{emit, optional_time, table};

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
        return emit(global.json, &answer, |answer| {
            println!("Pay for {credits} credits at:\n{}", answer.url);
            println!("(the credits arrive once Stripe confirms the payment)");
        });
    }
    let balance: BalanceAnswer = client.get("/v1/billing/balance", &[]).await?;
    emit(global.json, &balance, |_| {
        println!("available: {} credits", balance.available);
        if balance.reserved_micro > 0 {
            println!(
                "reserved:  {} credits (first minutes of new sandboxes)",
                balance.reserved
            );
        }
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
    })
}

#[derive(clap::Args)]
pub struct UsageArgs {
    /// hour, day, sandbox, kind, key or model.
    #[arg(long, default_value = "day")]
    group_by: String,
    /// Start (RFC 3339; default 7 days ago).
    #[arg(long)]
    from: Option<chrono::DateTime<chrono::Utc>>,
    /// End (RFC 3339; default now).
    #[arg(long)]
    to: Option<chrono::DateTime<chrono::Utc>>,
}

/// `sandbase usage`: a table, and a bar per group.
pub async fn usage(global: &GlobalArgs, args: UsageArgs) -> anyhow::Result<()> {
    let client = Client::new(global)?;
    client.require_token()?;
    let mut query = vec![("group_by", args.group_by)];
    if let Some(from) = args.from {
        query.push(("from", from.to_rfc3339()));
    }
    if let Some(to) = args.to {
        query.push(("to", to.to_rfc3339()));
    }
    let usage: sandbase_api::billing::UsageAnswer = client.get("/v1/usage", &query).await?;
    emit(global.json, &usage, |_| {
        let largest = usage
            .series
            .iter()
            .map(|point| point.amount_micro)
            .max()
            .unwrap_or(0)
            .max(1);
        let rows: Vec<Vec<String>> = usage
            .series
            .iter()
            .map(|point| {
                vec![
                    point.key.clone(),
                    point.amount.clone(),
                    bar(point.amount_micro, largest, 40),
                ]
            })
            .collect();
        table(&[&usage.group_by.to_uppercase(), "CREDITS", ""], &rows);
        println!();
        println!("total: {} credits", usage.total);
    })
}

/// A horizontal bar of `width` cells for `value` out of `largest`, in eighths of a cell.
fn bar(value: i64, largest: i64, width: usize) -> String {
    const PARTS: [&str; 8] = ["", "▏", "▎", "▍", "▌", "▋", "▊", "▉"];
    let eighths = (value.max(0) as u128 * (width as u128 * 8) / largest.max(1) as u128) as usize;
    let mut text = "█".repeat(eighths / 8);
    text.push_str(PARTS[eighths % 8]);
    text
}

#[cfg(test)]
mod tests {
    #[test]
    fn bars_scale_to_the_largest() {
        assert_eq!(super::bar(10, 10, 4), "████");
        assert_eq!(super::bar(5, 10, 4), "██");
        assert_eq!(super::bar(1, 16, 4), "▎");
        assert_eq!(super::bar(0, 10, 4), "");
    }
}
