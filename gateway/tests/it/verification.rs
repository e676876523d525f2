//! Sign-up as a free-compute faucet, with e-mail verification on: accounts signed up in bulk
//! get no credits and no key until each address proves itself with the code mailed to it
//! (through a real SMTP exchange with a sink this test runs), and sign-up tells nobody which
//! addresses are registered.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

use crate::helpers::{PASSWORD, TestApp, spawn_app_with};

/// A minimal SMTP server that accepts every mail and keeps its recipients and text.
struct SmtpSink {
    port: u16,
    mails: Arc<Mutex<Vec<(String, String)>>>,
}

impl SmtpSink {
    async fn start() -> SmtpSink {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let mails: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
        let kept = Arc::clone(&mails);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(session(stream, Arc::clone(&kept)));
            }
        });
        SmtpSink { port, mails }
    }

    /// The mails to `to` so far, waiting up to 10 s for at least `count`.
    async fn mails_to(&self, to: &str, count: usize) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let found: Vec<String> = self
                .mails
                .lock()
                .unwrap()
                .iter()
                .filter(|(recipient, _)| recipient.contains(to))
                .map(|(_, text)| text.clone())
                .collect();
            if found.len() >= count || Instant::now() > deadline {
                return found;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

async fn session(stream: tokio::net::TcpStream, mails: Arc<Mutex<Vec<(String, String)>>>) {
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    let _ = write.write_all(b"220 sink ESMTP\r\n").await;
    let mut recipient = String::new();
    while let Ok(Some(line)) = lines.next_line().await {
        let verb = line.to_ascii_uppercase();
        let reply: &[u8] = if verb.starts_with("EHLO") || verb.starts_with("HELO") {
            b"250-sink\r\n250 8BITMIME\r\n"
        } else if verb.starts_with("RCPT TO:") {
            recipient = line[8..].trim().to_owned();
            b"250 OK\r\n"
        } else if verb.starts_with("DATA") {
            let _ = write.write_all(b"354 go on\r\n").await;
            let mut text = String::new();
            while let Ok(Some(data)) = lines.next_line().await {
                if data == "." {
                    break;
                }
                text.push_str(&data);
                text.push('\n');
            }
            mails.lock().unwrap().push((recipient.clone(), text));
            b"250 kept\r\n"
        } else if verb.starts_with("QUIT") {
            let _ = write.write_all(b"221 bye\r\n").await;
            return;
        } else {
            b"250 OK\r\n"
        };
        if write.write_all(reply).await.is_err() {
            return;
        }
    }
}

async fn verifying_app(sink: &SmtpSink) -> TestApp {
    let port = sink.port;
    spawn_app_with(move |settings| {
        settings.auth.verify_email = true;
        settings.smtp.host = "127.0.0.1".to_owned();
        settings.smtp.port = port;
        settings.smtp.security = sandbase_gateway::config::SmtpSecurity::None;
    })
    .await
}

async fn signup(app: &TestApp, email: &str) -> (StatusCode, Value) {
    let answer = app
        .post(
            "/v1/auth/signup",
            "",
            json!({ "email": email, "password": PASSWORD, "team_name": "Faucet" }),
        )
        .await;
    (answer.status, answer.body)
}

/// The code in a verification mail (after `"token": "`).
fn code_in(mail: &str) -> String {
    let unfolded = mail.replace("=\n", "");
    let start = unfolded.find("\"token\": \"").expect("a code in the mail") + 10;
    unfolded[start..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .collect()
}

#[tokio::test]
async fn bulk_sign_ups_get_nothing_until_each_address_proves_itself() {
    let sink = SmtpSink::start().await;
    let app = verifying_app(&sink).await;
    // Ten sign-ups from one script: each answered 202, none holding credits or a key.
    for index in 0..10 {
        let (status, body) = signup(&app, &format!("bot{index}@example.com")).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        assert_eq!(body["status"], "verification_sent");
        assert!(body.get("api_key").is_none());
    }
    let granted = app.count("SELECT count(*) FROM grants").await;
    assert_eq!(granted, 0, "credits were granted before any verification");
    assert_eq!(app.count("SELECT count(*) FROM api_keys").await, 0);
    // Nor can such an account log in.
    let login = app
        .post(
            "/v1/auth/login",
            "",
            json!({ "email": "bot0@example.com", "password": PASSWORD }),
        )
        .await;
    login.assert_error(403, "email_not_verified");
    // The code from the mail unlocks the account once: credits, a key, a session.
    let mail = sink.mails_to("bot0@example.com", 1).await;
    assert_eq!(mail.len(), 1);
    let token = code_in(&mail[0]);
    app.post("/v1/auth/verify", "", json!({ "token": "made-up" }))
        .await
        .assert_error(422, "invalid_verification");
    let verified = app
        .post("/v1/auth/verify", "", json!({ "token": token }))
        .await;
    assert_eq!(verified.status, StatusCode::CREATED, "{}", verified.body);
    let key = verified.body["api_key"]["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let balance = app.get("/v1/billing/balance", &key).await.body;
    assert_eq!(balance["available_micro"], 10_000_000);
    app.post("/v1/auth/verify", "", json!({ "token": token }))
        .await
        .assert_error(422, "invalid_verification");
    assert_eq!(app.count("SELECT count(*) FROM grants").await, 1);
    app.login("bot0@example.com", None).await;
}

#[tokio::test]
async fn sign_up_does_not_tell_which_addresses_are_registered() {
    let sink = SmtpSink::start().await;
    let app = verifying_app(&sink).await;
    let (first_status, first) = signup(&app, "owner@example.com").await;
    let token = code_in(&sink.mails_to("owner@example.com", 1).await[0]);
    assert_eq!(
        app.post("/v1/auth/verify", "", json!({ "token": token }))
            .await
            .status,
        StatusCode::CREATED
    );
    // Someone tries the registered address: the very same answer as for a new one…
    let (again_status, again) = signup(&app, "owner@example.com").await;
    assert_eq!((again_status, &again), (first_status, &first));
    let (new_status, new) = signup(&app, "newcomer@example.com").await;
    assert_eq!(new_status, again_status);
    assert_eq!(new["status"], again["status"]);
    // …while the owner is told, with no code in the notice, and nothing else changed.
    let mails = sink.mails_to("owner@example.com", 2).await;
    assert_eq!(mails.len(), 2);
    assert!(mails[1].contains("already has one"), "{}", mails[1]);
    assert!(!mails[1].contains("\"token\""));
    assert_eq!(
        app.count("SELECT count(*) FROM users WHERE lower(email) = 'owner@example.com'")
            .await,
        1
    );
}
