//! Buying credits: Checkout against a local stand-in for Stripe's API, and webhooks signed
//! with Stripe's real scheme.

use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use axum::{Json, Router};
use hmac::{Hmac, Mac};
use reqwest::StatusCode;
use serde_json::{Value, json};
use sha2::Sha256;

use crate::helpers::{TestApp, email, spawn_app_with};

const WEBHOOK_SECRET: &str = "whsec_test_secret";

/// What the stand-in received: (path, idempotency key, authorization, form body).
type Calls = Arc<Mutex<Vec<(String, String, String, String)>>>;

async fn stripe_stand_in() -> (String, Calls) {
    let calls: Calls = Arc::default();
    async fn record(state: &Calls, path: &str, headers: &HeaderMap, body: String) {
        let header = |name: &str| {
            headers
                .get(name)
                .and_then(|value| value.to_str().ok())
                .unwrap_or_default()
                .to_owned()
        };
        state.lock().unwrap().push((
            path.to_owned(),
            header("idempotency-key"),
            header("authorization"),
            body,
        ));
    }
    let app = Router::new()
        .route(
            "/v1/customers",
            post(
                |State(calls): State<Calls>, headers: HeaderMap, body: String| async move {
                    record(&calls, "/v1/customers", &headers, body).await;
                    Json(json!({ "id": "cus_test_1", "object": "customer" }))
                },
            ),
        )
        .route(
            "/v1/checkout/sessions",
            post(
                |State(calls): State<Calls>, headers: HeaderMap, body: String| async move {
                    record(&calls, "/v1/checkout/sessions", &headers, body).await;
                    let number = calls.lock().unwrap().len();
                    Json(json!({
                        "id": format!("cs_test_{number}"),
                        "object": "checkout.session",
                        "url": format!("https://checkout.stripe.test/pay/cs_test_{number}"),
                    }))
                },
            ),
        )
        .with_state(Arc::clone(&calls));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{address}"), calls)
}

async fn stripe_app(api_base: &str) -> TestApp {
    let api_base = api_base.to_owned();
    spawn_app_with(move |settings| {
        settings.stripe.secret_key = Some("sk_test_123".to_owned().into());
        settings.stripe.webhook_secret = Some(WEBHOOK_SECRET.to_owned().into());
        settings.stripe.api_base = api_base;
    })
    .await
}

fn signature(secret: &str, timestamp: i64, body: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(format!("{timestamp}.{body}").as_bytes());
    format!(
        "t={timestamp},v1={}",
        hex::encode(mac.finalize().into_bytes())
    )
}

async fn deliver(
    app: &TestApp,
    event: &Value,
    signature_header: Option<String>,
) -> (StatusCode, Value) {
    let body = event.to_string();
    let header = signature_header
        .unwrap_or_else(|| signature(WEBHOOK_SECRET, chrono::Utc::now().timestamp(), &body));
    let response = app
        .http
        .post(format!("{}/v1/billing/stripe/webhook", app.address))
        .header("stripe-signature", header)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

fn session_event(id: &str, kind: &str, session: &str, paid: bool) -> Value {
    json!({
        "id": id,
        "object": "event",
        "type": kind,
        "data": { "object": {
            "id": session,
            "object": "checkout.session",
            "payment_status": if paid { "paid" } else { "unpaid" },
            "payment_intent": format!("pi_{session}"),
        } },
    })
}

async fn available(app: &TestApp, token: &str) -> String {
    app.get("/v1/billing/balance", token).await.body["available"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[allow(
    clippy::too_many_lines,
    reason = "one end-to-end scenario whose steps build on each other"
)]
#[tokio::test(flavor = "multi_thread")]
async fn paid_checkouts_grant_once_and_refunds_take_back() {
    let (api_base, calls) = stripe_stand_in().await;
    let app = stripe_app(&api_base).await;
    let alice = app.signup("alice@example.com", "Alice").await;
    let token = alice.api_key.token.as_str();

    let answer = app
        .post("/v1/billing/checkout", token, json!({ "credits": 50 }))
        .await;
    assert_eq!(answer.status, StatusCode::CREATED, "{}", answer.body);
    let session = answer.body["session_id"].as_str().unwrap().to_owned();
    assert!(
        answer.body["url"]
            .as_str()
            .unwrap()
            .starts_with("https://checkout.stripe.test/")
    );
    {
        let calls = calls.lock().unwrap();
        assert_eq!(calls.len(), 2, "a customer, then a session");
        for (_, key, authorization, _) in calls.iter() {
            assert!(!key.is_empty(), "every call carries an Idempotency-Key");
            assert_eq!(authorization, "Bearer sk_test_123");
        }
        let form = &calls[1].3;
        assert!(form.contains("customer=cus_test_1"), "{form}");
        assert!(
            form.contains("line_items%5B0%5D%5Bquantity%5D=50"),
            "{form}"
        );
        assert!(
            form.contains("line_items%5B0%5D%5Bprice_data%5D%5Bunit_amount%5D=100"),
            "{form}"
        );
    }
    // A second checkout reuses the team's customer.
    app.post("/v1/billing/checkout", token, json!({ "credits": 5 }))
        .await;
    assert_eq!(
        calls
            .lock()
            .unwrap()
            .iter()
            .filter(|call| call.0 == "/v1/customers")
            .count(),
        1
    );
    app.post("/v1/billing/checkout", token, json!({ "credits": 1 }))
        .await
        .assert_error(422, "invalid_request");

    // Refused: a bad signature, an old timestamp, a missing header — nothing granted.
    let paid = session_event("evt_paid", "checkout.session.completed", &session, true);
    let (status, _) = deliver(
        &app,
        &paid,
        Some(signature(
            "whsec_wrong",
            chrono::Utc::now().timestamp(),
            &paid.to_string(),
        )),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _) = deliver(
        &app,
        &paid,
        Some(signature(
            WEBHOOK_SECRET,
            chrono::Utc::now().timestamp() - 301,
            &paid.to_string(),
        )),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _) = deliver(&app, &paid, Some(String::new())).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(available(&app, token).await, "10");

    // An unpaid completion (a delayed payment method) grants nothing.
    let unpaid = session_event("evt_unpaid", "checkout.session.completed", &session, false);
    let (status, body) = deliver(&app, &unpaid, None).await;
    assert_eq!(
        (status, body["outcome"].as_str()),
        (StatusCode::OK, Some("not paid yet"))
    );
    assert_eq!(available(&app, token).await, "10");

    // The paid event, delivered twice at once: granted exactly once.
    let (first, second) = tokio::join!(deliver(&app, &paid, None), deliver(&app, &paid, None));
    assert_eq!((first.0, second.0), (StatusCode::OK, StatusCode::OK));
    assert_eq!(available(&app, token).await, "60");
    // Replayed later, and the async success of the same session: still once.
    deliver(&app, &paid, None).await;
    let succeeded = session_event(
        "evt_async",
        "checkout.session.async_payment_succeeded",
        &session,
        true,
    );
    let (_, body) = deliver(&app, &succeeded, None).await;
    assert_eq!(body["outcome"], "already granted");
    assert_eq!(available(&app, token).await, "60");

    // A partial refund takes back what it paid for; its redelivery takes nothing more.
    let refund = |id: &str, refunded: i64| {
        json!({ "id": id, "type": "charge.refunded", "data": { "object": {
            "id": "ch_1", "object": "charge", "amount": 5000, "amount_refunded": refunded,
            "payment_intent": format!("pi_{session}"),
        } } })
    };
    deliver(&app, &refund("evt_refund_1", 2000), None).await;
    assert_eq!(available(&app, token).await, "40");
    deliver(&app, &refund("evt_refund_1", 2000), None).await;
    deliver(&app, &refund("evt_refund_2", 2000), None).await;
    assert_eq!(available(&app, token).await, "40");
    deliver(&app, &refund("evt_refund_3", 2500), None).await;
    assert_eq!(available(&app, token).await, "35");

    // Unknown event types are acknowledged and ignored.
    let (status, body) = deliver(
        &app,
        &json!({ "id": "evt_other", "type": "customer.created", "data": { "object": {} } }),
        None,
    )
    .await;
    assert_eq!(
        (status, body["outcome"].as_str()),
        (StatusCode::OK, Some("ignored"))
    );
    let grants = app
        .count("SELECT count(*) FROM grants WHERE source = 'purchase'")
        .await;
    assert_eq!(grants, 1);
    let mut connection = app.db.acquire().await.unwrap();
    assert!(
        sandbase_billing::reconcile(&mut connection)
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn without_stripe_checkout_says_so_and_admins_still_grant() {
    let app = crate::helpers::spawn_app().await;
    let alice = app.signup("alice@example.com", "Alice").await;
    app.post(
        "/v1/billing/checkout",
        &alice.api_key.token,
        json!({ "credits": 10 }),
    )
    .await
    .assert_error(501, "billing_not_configured");
    let (status, _) = deliver(&app, &json!({ "id": "evt", "type": "x" }), None).await;
    assert_eq!(status, StatusCode::NOT_IMPLEMENTED);
    assert_eq!(available(&app, &alice.api_key.token).await, "10");
}

#[tokio::test(flavor = "multi_thread")]
async fn disputes_take_credits_back_and_early_refunds_wait_for_their_payment() {
    let (api_base, _calls) = stripe_stand_in().await;
    let app = stripe_app(&api_base).await;
    let owner = app.signup(&email("disputed"), "Disputed").await;
    let token = owner.api_key.token.as_str();
    let answer = app
        .post("/v1/billing/checkout", token, json!({ "credits": 50 }))
        .await;
    assert_eq!(answer.status, StatusCode::CREATED, "{}", answer.body);
    let session = answer.body["session_id"].as_str().unwrap().to_owned();
    let charge_event = |id: &str, kind: &str, object: Value| json!({ "id": id, "type": kind, "data": { "object": object } });
    // Stripe's events are not ordered: a refund of 10 credits' worth comes before the
    // session's completion. It is kept, not lost…
    let refund = charge_event(
        "evt_early_refund",
        "charge.refunded",
        json!({ "id": "ch_1", "object": "charge", "amount": 5000, "amount_refunded": 1000,
                "payment_intent": format!("pi_{session}") }),
    );
    let (status, body) = deliver(&app, &refund, None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(available(&app, token).await, "10");
    // …and applied when the payment completes: 10 + 50 − 10.
    deliver(
        &app,
        &session_event("evt_done", "checkout.session.completed", &session, true),
        None,
    )
    .await;
    assert_eq!(available(&app, token).await, "50");
    // A dispute takes the disputed 20 credits back at once, once.
    let dispute = |id: &str, kind: &str, status: &str| {
        charge_event(
            id,
            kind,
            json!({ "id": "dp_1", "object": "dispute", "amount": 2000, "status": status,
                    "charge": "ch_1", "payment_intent": format!("pi_{session}") }),
        )
    };
    let (_, body) = deliver(
        &app,
        &dispute("evt_dispute", "charge.dispute.created", "needs_response"),
        None,
    )
    .await;
    assert_eq!(body["outcome"], "dispute taken back");
    assert_eq!(available(&app, token).await, "30");
    deliver(
        &app,
        &dispute(
            "evt_dispute_again",
            "charge.dispute.created",
            "needs_response",
        ),
        None,
    )
    .await;
    assert_eq!(available(&app, token).await, "30");
    // Won: the credits come back, once.
    for id in ["evt_won", "evt_won_again"] {
        deliver(&app, &dispute(id, "charge.dispute.closed", "won"), None).await;
    }
    assert_eq!(available(&app, token).await, "50");
    // Lost: nothing more happens (the credits were taken back when it opened).
    let (_, body) = deliver(
        &app,
        &dispute("evt_lost", "charge.dispute.closed", "lost"),
        None,
    )
    .await;
    assert_eq!(body["outcome"], "ignored");
    let mut connection = app.db.acquire().await.unwrap();
    assert!(
        sandbase_billing::reconcile(&mut connection)
            .await
            .unwrap()
            .is_empty()
    );
}
