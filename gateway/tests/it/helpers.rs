//! `spawn_app()`: a real gateway on a random port, with its own database and Redis prefix.

use std::sync::Once;

use reqwest::{Method, StatusCode};
use sandbase_api::SignupResponse;
use sandbase_gateway::{Application, Settings, testing};
use secrecy::ExposeSecret;
use serde_json::{Value, json};
use sqlx::PgPool;
use tokio::sync::oneshot;
use uuid::Uuid;

pub struct TestApp {
    pub address: String,
    /// The internal listener (`https://…` with the test channel's TLS): workers' and
    /// operator routes, `/metrics`.
    pub internal: String,
    /// A client of the internal listener, trusting the test channel's CA.
    pub internal_http: reqwest::Client,
    pub db: PgPool,
    pub settings: Settings,
    pub http: reqwest::Client,
    /// The gateway's own state, for what a test cannot see over HTTP.
    pub state: testing::Inspector,
    _shutdown: oneshot::Sender<()>,
}

/// The answer of a request: status, headers and JSON body (`Value::Null` when not JSON).
pub struct Answer {
    pub status: StatusCode,
    pub headers: reqwest::header::HeaderMap,
    pub body: Value,
}

impl Answer {
    /// The `error.code` of an error body.
    pub fn code(&self) -> &str {
        self.body["error"]["code"]
            .as_str()
            .unwrap_or("<no error code>")
    }

    #[track_caller]
    pub fn assert_error(&self, status: u16, code: &str) {
        assert_eq!(
            (self.status.as_u16(), self.code()),
            (status, code),
            "unexpected answer: {}",
            self.body
        );
        assert!(
            self.body["error"]["message"]
                .as_str()
                .is_some_and(|message| !message.is_empty()),
            "error without a message: {}",
            self.body
        );
    }
}

/// Everything this test process has logged (gateways and workers, and through the workers
/// their egress proxies) since the first call, which starts the capture: plain text, at
/// debug for SandBase's own targets.
pub fn captured_logs() -> String {
    static LOGS: std::sync::OnceLock<std::sync::Arc<std::sync::Mutex<Vec<u8>>>> =
        std::sync::OnceLock::new();
    struct Sink(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Sink {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let logs = LOGS.get_or_init(|| {
        let logs = std::sync::Arc::default();
        let sink = std::sync::Arc::clone(&logs);
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(
                "info,sandbase_gateway=debug,sandbase_worker=debug,sandbase_egress=debug,sandbase_vault=debug,egress_proxy=debug",
            ))
            .with_ansi(false)
            .with_writer(move || Sink(std::sync::Arc::clone(&sink)))
            .try_init();
        logs
    });
    String::from_utf8_lossy(&logs.lock().unwrap_or_else(|p| p.into_inner())).into_owned()
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with(|_| {}).await
}

pub async fn spawn_app_with(configure: impl FnOnce(&mut Settings)) -> TestApp {
    let mut settings = testing::settings().await;
    configure(&mut settings);
    spawn_with_settings(settings).await
}

/// Starts a gateway with exactly these settings (a second instance on the same database
/// and Redis prefix behaves like another replica).
pub async fn spawn_with_settings(settings: Settings) -> TestApp {
    static PROVIDER: Once = Once::new();
    PROVIDER.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
    let application = Application::build(settings.clone())
        .await
        .expect("build the application");
    let address = format!("http://{}", application.local_addr());
    let scheme = if settings.internal_tls.is_some() {
        "https"
    } else {
        "http"
    };
    let internal = format!("{scheme}://{}", application.internal_addr());
    let internal_http = reqwest::Client::builder()
        .use_preconfigured_tls(testing::channel().client.as_ref().clone())
        .build()
        .expect("a client of the internal listener");
    let state = testing::Inspector::new(&application);
    let (shutdown, stopped) = oneshot::channel::<()>();
    tokio::spawn(application.run_until_stopped(async move {
        let _ = stopped.await;
    }));
    let db = PgPool::connect(
        settings
            .database
            .url
            .as_ref()
            .expect("test settings have a database")
            .expose_secret(),
    )
    .await
    .expect("connect to the test database");
    TestApp {
        address,
        internal,
        internal_http,
        db,
        settings,
        http: reqwest::Client::new(),
        state,
        _shutdown: shutdown,
    }
}

impl TestApp {
    pub async fn request(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> Answer {
        let mut request = self.http.request(method, format!("{}{path}", self.address));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        answer(request.send().await.expect("send the request")).await
    }

    pub async fn get(&self, path: &str, token: &str) -> Answer {
        self.request(Method::GET, path, Some(token), None).await
    }

    /// A GET whose answer is text (a recording, a file): the body, which must be 200.
    pub async fn get_text(&self, path: &str, token: &str) -> String {
        let answer = self
            .http
            .get(format!("{}{path}", self.address))
            .bearer_auth(token)
            .send()
            .await
            .expect("send the request");
        assert_eq!(answer.status().as_u16(), 200, "GET {path}");
        answer.text().await.expect("a text body")
    }

    pub async fn post(&self, path: &str, token: &str, body: Value) -> Answer {
        self.request(Method::POST, path, Some(token), Some(body))
            .await
    }

    pub async fn patch(&self, path: &str, token: &str, body: Value) -> Answer {
        self.request(Method::PATCH, path, Some(token), Some(body))
            .await
    }

    pub async fn delete(&self, path: &str, token: &str) -> Answer {
        self.request(Method::DELETE, path, Some(token), None).await
    }

    /// Sends raw bytes with a content type, for malformed-input tests.
    pub async fn post_raw(
        &self,
        path: &str,
        token: Option<&str>,
        content_type: &str,
        body: Vec<u8>,
    ) -> Answer {
        let mut request = self
            .http
            .post(format!("{}{path}", self.address))
            .header("content-type", content_type)
            .body(body);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        answer(request.send().await.expect("send the request")).await
    }

    /// Signs up a new account; panics unless it answers 201.
    pub async fn signup(&self, email: &str, team: &str) -> SignupResponse {
        let answer = self
            .request(
                Method::POST,
                "/v1/auth/signup",
                None,
                Some(json!({ "email": email, "password": PASSWORD, "team_name": team })),
            )
            .await;
        assert_eq!(
            answer.status,
            StatusCode::CREATED,
            "signup failed: {}",
            answer.body
        );
        serde_json::from_value(answer.body).expect("a signup response")
    }

    /// Logs in and returns the session token.
    pub async fn login(&self, email: &str, team_id: Option<Uuid>) -> String {
        let answer = self
            .request(
                Method::POST,
                "/v1/auth/login",
                None,
                Some(json!({ "email": email, "password": PASSWORD, "team_id": team_id })),
            )
            .await;
        assert_eq!(
            answer.status,
            StatusCode::OK,
            "login failed: {}",
            answer.body
        );
        answer.body["session"]["token"]
            .as_str()
            .expect("a session token")
            .to_owned()
    }

    /// Invites `email` with `inviter`'s token and has its owner (signed up already) accept,
    /// from a session of their own.
    pub async fn add_member(&self, inviter: &str, email: &str, role: &str) {
        let invited = self
            .post(
                "/v1/team/members",
                inviter,
                json!({ "email": email, "role": role }),
            )
            .await;
        assert_eq!(invited.status, StatusCode::CREATED, "{}", invited.body);
        let id = invited.body["id"]
            .as_str()
            .expect("an invitation id")
            .to_owned();
        let session = self.login(email, None).await;
        let accepted = self
            .post(&format!("/v1/invitations/{id}/accept"), &session, json!({}))
            .await;
        assert_eq!(accepted.status, StatusCode::CREATED, "{}", accepted.body);
        assert_eq!(accepted.body["role"], role);
    }

    /// Creates an API key with the given token and returns (id, token).
    pub async fn create_key(&self, token: &str, body: Value) -> (Uuid, String) {
        let answer = self.post("/v1/api-keys", token, body).await;
        assert_eq!(
            answer.status,
            StatusCode::CREATED,
            "key creation failed: {}",
            answer.body
        );
        (
            answer.body["id"]
                .as_str()
                .expect("id")
                .parse()
                .expect("uuid"),
            answer.body["token"].as_str().expect("token").to_owned(),
        )
    }

    /// Sets a team's rate limit the way `sandbase admin rate-limit` does.
    pub async fn set_rate_limit(&self, team_id: Uuid, limit: Option<(u32, u32)>) {
        let redis = sandbase_gateway::connect_redis(&self.settings)
            .await
            .unwrap();
        sandbase_gateway::operator::set_team_rate_limit(
            &self.db,
            redis,
            &self.settings.redis.key_prefix,
            team_id,
            limit,
        )
        .await
        .unwrap();
    }

    pub async fn count(&self, sql: &str) -> i64 {
        sqlx::query_scalar(sql)
            .fetch_one(&self.db)
            .await
            .expect("count query")
    }
}

pub const PASSWORD: &str = "correct horse battery staple";

async fn answer(response: reqwest::Response) -> Answer {
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response.bytes().await.expect("read the body");
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Answer {
        status,
        headers,
        body,
    }
}

/// A unique e-mail address for this test.
pub fn email(name: &str) -> String {
    format!("{name}-{}@example.com", Uuid::new_v4().simple())
}

/// The test Redis's address (from `SANDBASE_TEST_REDIS_URL`).
pub fn redis_address() -> std::net::SocketAddr {
    let url = testing::redis_url();
    let authority = url
        .trim_start_matches("redis://")
        .split('/')
        .next()
        .unwrap_or_default()
        .rsplit('@')
        .next()
        .unwrap_or_default()
        .to_owned();
    std::net::ToSocketAddrs::to_socket_addrs(&authority)
        .expect("a Redis address")
        .next()
        .expect("a Redis address")
}
