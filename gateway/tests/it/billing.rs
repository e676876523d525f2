//! Credits: starter grants, burn order, idempotent debits, overdraft, expiry to breakage,
//! an append-only ledger that always balances, and another team seeing none of it.

use chrono::{Duration, Utc};
use sandbase_billing::{Credits, Debit, GrantSource, Mismatch, NewGrant};
use serde_json::json;
use uuid::Uuid;

use crate::helpers::{TestApp, spawn_app};

fn credits(value: i64) -> Credits {
    Credits::from_credits(value).unwrap()
}

async fn debit(
    app: &TestApp,
    team: Uuid,
    amount: Credits,
    key: &str,
) -> Option<sandbase_billing::DebitOutcome> {
    let mut transaction = app.db.begin().await.unwrap();
    let outcome = sandbase_billing::debit(
        &mut transaction,
        Debit {
            team_id: team,
            amount,
            idempotency_key: key.to_owned(),
            description: "test usage".to_owned(),
            details: json!({ "usage": key }),
        },
    )
    .await
    .unwrap();
    transaction.commit().await.unwrap();
    outcome
}

async fn admin_grant(
    app: &TestApp,
    team: Uuid,
    amount: Credits,
    priority: i32,
    expires_in: Option<Duration>,
) -> Uuid {
    let mut transaction = app.db.begin().await.unwrap();
    let grant = sandbase_billing::grant(
        &mut transaction,
        NewGrant {
            team_id: team,
            source: GrantSource::Admin,
            amount,
            priority,
            effective_at: None,
            expires_at: expires_in.map(|delta| Utc::now() + delta),
            idempotency_key: format!("test:{}", Uuid::new_v4()),
            description: "test grant".to_owned(),
            details: json!({}),
        },
    )
    .await
    .unwrap()
    .unwrap();
    transaction.commit().await.unwrap();
    grant
}

async fn assert_consistent(app: &TestApp) {
    let mut connection = app.db.acquire().await.unwrap();
    let mismatches = sandbase_billing::reconcile(&mut connection).await.unwrap();
    assert_eq!(mismatches, Vec::<Mismatch>::new());
}

#[allow(
    clippy::too_many_lines,
    reason = "one end-to-end scenario whose steps build on each other"
)]
#[tokio::test]
async fn credits_are_granted_burned_in_order_and_the_ledger_balances() {
    let app = spawn_app().await;
    let alice = app.signup("alice@example.com", "Alice").await;
    let mallory = app.signup("mallory@example.com", "Mallory").await;
    let token = alice.api_key.token.as_str();
    let team = alice.team.id;

    // Starter credits on sign-up, expiring in 30 days.
    let balance = app.get("/v1/billing/balance", token).await.body;
    assert_eq!(balance["available"], "10", "{balance}");
    assert_eq!(balance["available_micro"], 10_000_000);
    assert_eq!(balance["grants"][0]["source"], "starter");
    let expires: chrono::DateTime<Utc> = balance["grants"][0]["expires_at"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (expires - Utc::now() - Duration::days(30))
            .num_minutes()
            .abs()
            < 5
    );

    // Burn order: priority first (starter 0 before admin 5 and 10), then earliest expiry.
    let late = admin_grant(&app, team, credits(4), 5, None).await;
    let soon = admin_grant(&app, team, credits(3), 5, Some(Duration::days(1))).await;
    let low = admin_grant(&app, team, credits(6), 10, None).await;
    let outcome = debit(&app, team, credits(15), "usage-1").await.unwrap();
    let starter = balance["grants"][0]["id"]
        .as_str()
        .unwrap()
        .parse::<Uuid>()
        .unwrap();
    assert_eq!(
        outcome.drawn,
        vec![
            (starter, credits(10)),
            (soon, credits(3)),
            (late, credits(2))
        ]
    );
    assert_eq!(outcome.overdraft, Credits(0));
    assert_eq!(
        app.get("/v1/billing/balance", token).await.body["available"],
        "8"
    );

    // The same charge again (a retried event) is not booked twice.
    assert!(debit(&app, team, credits(15), "usage-1").await.is_none());
    assert_eq!(
        app.get("/v1/billing/balance", token).await.body["available"],
        "8"
    );

    // Beyond every grant: the rest is an overdraft, and the balance goes negative.
    let outcome = debit(&app, team, Credits::parse("9.5").unwrap(), "usage-2")
        .await
        .unwrap();
    assert_eq!(outcome.drawn, vec![(late, credits(2)), (low, credits(6))]);
    assert_eq!(outcome.overdraft, Credits::parse("1.5").unwrap());
    assert_eq!(
        app.get("/v1/billing/balance", token).await.body["available"],
        "-1.5"
    );
    assert_consistent(&app).await;

    // The ledger: newest first, every transaction's entries sum to zero, paginated.
    let page = app.get("/v1/billing/ledger?limit=2", token).await.body;
    let transactions = page["transactions"].as_array().unwrap();
    assert_eq!(transactions.len(), 2);
    assert_eq!(transactions[0]["kind"], "debit");
    assert_eq!(transactions[0]["amount"], "-9.5");
    for transaction in transactions {
        let total: i64 = transaction["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|entry| entry["amount_micro"].as_i64().unwrap())
            .sum();
        assert_eq!(total, 0, "{transaction}");
    }
    let cursor = page["next_cursor"].as_str().unwrap();
    let older = app
        .get(
            &format!("/v1/billing/ledger?before={cursor}&limit=200"),
            token,
        )
        .await
        .body;
    assert_eq!(older["transactions"].as_array().unwrap().len(), 4);
    assert!(older["next_cursor"].is_null());
    app.get("/v1/billing/ledger?limit=0", token)
        .await
        .assert_error(422, "invalid_request");

    // Another team sees only its own.
    let theirs = app
        .get("/v1/billing/ledger", &mallory.api_key.token)
        .await
        .body;
    assert_eq!(theirs["transactions"].as_array().unwrap().len(), 1);
    assert_eq!(
        app.get("/v1/billing/balance", &mallory.api_key.token)
            .await
            .body["available"],
        "10"
    );
    let foreign = app
        .get(
            &format!("/v1/billing/ledger?before={cursor}"),
            &mallory.api_key.token,
        )
        .await
        .body;
    assert_eq!(
        foreign["transactions"],
        json!([]),
        "a foreign cursor matches none of the team's own"
    );
    assert_consistent(&app).await;
}

#[tokio::test]
async fn expiry_moves_what_is_left_to_breakage() {
    let app = spawn_app().await;
    let alice = app.signup("alice@example.com", "Alice").await;
    let team = alice.team.id;
    let grant = admin_grant(&app, team, credits(5), 1, Some(Duration::seconds(2))).await;
    debit(&app, team, credits(12), "before-expiry")
        .await
        .unwrap();
    // Starter 10 then 2 of the 5: 3 left to expire.
    tokio::time::sleep(std::time::Duration::from_millis(3000)).await;
    let mut connection = app.db.acquire().await.unwrap();
    sandbase_billing::expire_grants(&mut connection)
        .await
        .unwrap();
    let breakage: Option<i64> = sqlx::query_scalar(
        "SELECT sum(amount)::bigint FROM ledger_entries WHERE account = 'system:breakage'",
    )
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(breakage, Some(3_000_000));
    let (remaining, expired): (i64, bool) =
        sqlx::query_as("SELECT remaining, expired FROM grants WHERE id = $1")
            .bind(grant)
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert_eq!((remaining, expired), (0, true));
    assert_eq!(
        app.get("/v1/billing/balance", &alice.api_key.token)
            .await
            .body["available"],
        "0"
    );
    // Expiring again changes nothing.
    sandbase_billing::expire_grants(&mut connection)
        .await
        .unwrap();
    drop(connection);
    assert_consistent(&app).await;
}

#[tokio::test]
async fn the_ledger_is_append_only_and_refuses_unbalanced_transactions() {
    let app = spawn_app().await;
    app.signup("alice@example.com", "Alice").await;
    for statement in [
        "UPDATE ledger_entries SET amount = amount + 1",
        "DELETE FROM ledger_entries",
        "DELETE FROM ledger_transactions",
        "TRUNCATE ledger_entries",
    ] {
        assert!(
            sqlx::query(statement).execute(&app.db).await.is_err(),
            "{statement}"
        );
    }
    // A transaction whose entries do not sum to zero cannot commit.
    let mut transaction = app.db.begin().await.unwrap();
    let team: Uuid = sqlx::query_scalar("SELECT id FROM teams LIMIT 1")
        .fetch_one(&mut *transaction)
        .await
        .unwrap();
    let id = Uuid::now_v7();
    sqlx::query("INSERT INTO ledger_transactions (id, team_id, kind, idempotency_key, description) VALUES ($1, $2, 'grant', 'forged', 'forged')")
        .bind(id)
        .bind(team)
        .execute(&mut *transaction)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO ledger_entries (transaction_id, account, amount) VALUES ($1, $2, 1000000000)",
    )
    .bind(id)
    .bind(format!("team:{team}"))
    .execute(&mut *transaction)
    .await
    .unwrap();
    assert!(transaction.commit().await.is_err());
    assert_consistent(&app).await;
}

/// Concurrent charges serialize on the team's grants: each is booked exactly once, the
/// grants are used up exactly, and the rest is overdraft.
#[tokio::test(flavor = "multi_thread")]
async fn concurrent_debits_are_each_booked_once() {
    let app = spawn_app().await;
    let alice = app.signup("alice@example.com", "Alice").await;
    let team = alice.team.id;
    let mut tasks = Vec::new();
    for index in 0..40 {
        let db = app.db.clone();
        tasks.push(tokio::spawn(async move {
            let mut transaction = db.begin().await.unwrap();
            let outcome = sandbase_billing::debit(
                &mut transaction,
                Debit {
                    team_id: team,
                    amount: Credits::parse("0.5").unwrap(),
                    idempotency_key: format!("concurrent-{}", index % 30),
                    description: "concurrent".to_owned(),
                    details: json!({}),
                },
            )
            .await
            .unwrap();
            transaction
                .commit()
                .await
                .map(|_| outcome.is_some())
                .unwrap_or(false)
        }));
    }
    let mut booked = 0;
    for task in tasks {
        if task.await.unwrap() {
            booked += 1;
        }
    }
    assert_eq!(booked, 30, "30 distinct keys, each booked once");
    // 30 × 0.5 = 15 against 10 of starter credits.
    assert_eq!(
        app.get("/v1/billing/balance", &alice.api_key.token)
            .await
            .body["available"],
        "-5"
    );
    assert_consistent(&app).await;
}

#[tokio::test]
async fn usage_is_grouped_for_charts() {
    let app = spawn_app().await;
    let alice = app.signup("alice@example.com", "Alice").await;
    let mallory = app.signup("mallory@example.com", "Mallory").await;
    let team = alice.team.id;
    let sandbox = Uuid::new_v4();
    for (key, amount, details) in [
        ("a", "0.5", json!({ "kind": "runtime", "sandbox": sandbox })),
        (
            "b",
            "0.25",
            json!({ "kind": "runtime", "sandbox": sandbox }),
        ),
        ("c", "1", json!({ "kind": "model" })),
    ] {
        let mut transaction = app.db.begin().await.unwrap();
        sandbase_billing::debit(
            &mut transaction,
            Debit {
                team_id: team,
                amount: Credits::parse(amount).unwrap(),
                idempotency_key: key.to_owned(),
                description: "usage".to_owned(),
                details,
            },
        )
        .await
        .unwrap();
        transaction.commit().await.unwrap();
    }
    let token = alice.api_key.token.as_str();
    let by_kind = app.get("/v1/usage?group_by=kind", token).await.body;
    assert_eq!(by_kind["total"], "1.75");
    assert_eq!(by_kind["series"][0]["key"], "model");
    assert_eq!(
        by_kind["series"][1],
        json!({ "key": "runtime", "amount": "0.75", "amount_micro": 750_000 })
    );
    let by_day = app.get("/v1/usage", token).await.body;
    assert_eq!(by_day["series"].as_array().unwrap().len(), 1);
    assert_eq!(
        by_day["series"][0]["key"],
        Utc::now().format("%Y-%m-%d").to_string()
    );
    let by_sandbox = app.get("/v1/usage?group_by=sandbox", token).await.body;
    assert!(
        by_sandbox["series"]
            .as_array()
            .unwrap()
            .iter()
            .any(|point| point["key"] == sandbox.to_string())
    );
    app.get("/v1/usage?group_by=week", token)
        .await
        .assert_error(422, "invalid_request");
    app.get(
        "/v1/usage?from=2030-01-01T00:00:00Z&to=2029-01-01T00:00:00Z",
        token,
    )
    .await
    .assert_error(422, "invalid_request");
    let theirs = app
        .get("/v1/usage?group_by=kind", &mallory.api_key.token)
        .await
        .body;
    assert_eq!(theirs["series"], json!([]));
}
