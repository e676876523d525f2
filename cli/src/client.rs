//! The HTTP client of the CLI: resolves URL and credentials, and turns the API's error
//! bodies into readable errors.

use anyhow::Context;
use reqwest::{Method, StatusCode};
use sandbase_api::ErrorBody;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::args::GlobalArgs;
use crate::credentials;

pub const DEFAULT_URL: &str = "http://127.0.0.1:8080";

pub struct Client {
    http: reqwest::Client,
    pub base_url: String,
    token: Option<String>,
}

impl Client {
    /// URL: `--url`/SANDBASE_URL, else the saved one, else the local default.
    /// Credentials: `--api-key`/SANDBASE_API_KEY, else SANDBASE_TOKEN (a session), else saved.
    pub fn new(global: &GlobalArgs) -> anyhow::Result<Client> {
        let saved = credentials::load()?;
        let base_url = global
            .url
            .clone()
            .or_else(|| saved.as_ref().map(|saved| saved.url.clone()))
            .unwrap_or_else(|| DEFAULT_URL.to_owned());
        let token = global
            .api_key
            .clone()
            .or_else(|| {
                std::env::var("SANDBASE_TOKEN")
                    .ok()
                    .filter(|token| !token.is_empty())
            })
            .or_else(|| saved.map(|saved| saved.api_key));
        Client::with_token(base_url, token)
    }

    pub fn with_token(base_url: String, token: Option<String>) -> anyhow::Result<Client> {
        let http = reqwest::Client::builder()
            .user_agent(concat!("sandbase-cli/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(std::time::Duration::from_secs(10))
            .build()
            .context("building the HTTP client")?;
        Ok(Client {
            http,
            base_url: base_url.trim_end_matches('/').to_owned(),
            token,
        })
    }

    pub fn require_token(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.token.is_some(),
            "no credentials: set SANDBASE_API_KEY, or run `sandbase login` or `sandbase signup`"
        );
        Ok(())
    }

    pub async fn get<T: DeserializeOwned>(
        &self,
        path: &str,
        query: &[(&str, String)],
    ) -> anyhow::Result<T> {
        self.send(Method::GET, path, query, Option::<&()>::None)
            .await
    }

    pub async fn post<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> anyhow::Result<T> {
        self.send(Method::POST, path, &[], Some(body)).await
    }

    pub async fn put<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> anyhow::Result<T> {
        self.send(Method::PUT, path, &[], Some(body)).await
    }

    pub async fn patch<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> anyhow::Result<T> {
        self.send(Method::PATCH, path, &[], Some(body)).await
    }

    pub async fn delete(&self, path: &str) -> anyhow::Result<()> {
        let response = self
            .request(Method::DELETE, path, &[], Option::<&()>::None)
            .await?;
        check(response).await.map(|_| ())
    }

    /// A request whose answer is read as a stream (commands, files, archives): no overall
    /// timeout; errors become readable errors.
    pub async fn stream(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<reqwest::Body>,
        json: Option<&serde_json::Value>,
    ) -> anyhow::Result<reqwest::Response> {
        let url = format!("{}{path}", self.base_url);
        let mut request = self.http.request(method, &url).query(query);
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.body(body);
        }
        if let Some(json) = json {
            request = request.json(json);
        }
        let response = request
            .send()
            .await
            .with_context(|| format!("cannot reach the SandBase API at {}", self.base_url))?;
        check(response).await
    }

    /// A request whose answer, error or not, is the caller's to read (the MCP server's
    /// tools report refusals themselves). `path` carries its query.
    pub async fn exchange(
        &self,
        method: Method,
        path: &str,
        body: Option<(&'static str, Vec<u8>)>,
    ) -> anyhow::Result<reqwest::Response> {
        let url = format!("{}{path}", self.base_url);
        let mut request = self.http.request(method, &url);
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        if let Some((content_type, bytes)) = body {
            request = request
                .header(reqwest::header::CONTENT_TYPE, content_type)
                .body(bytes);
        }
        request
            .send()
            .await
            .with_context(|| format!("cannot reach the SandBase API at {}", self.base_url))
    }

    /// An operator call on the internal listener, with the operator token instead of an API
    /// key.
    pub async fn operator(
        &self,
        method: Method,
        path: &str,
        (internal_url, operator_token, ca): (&str, &str, Option<&std::path::Path>),
        content_type: &str,
        body: reqwest::Body,
    ) -> anyhow::Result<reqwest::Response> {
        let base = internal_url.trim_end_matches('/');
        let http = match ca {
            None => self.http.clone(),
            Some(ca) => {
                let pem = std::fs::read(ca)
                    .with_context(|| format!("reading the internal CA {}", ca.display()))?;
                let tls = sandbase_egress::channel::client_trusting(&pem)
                    .map_err(|error| anyhow::anyhow!("the internal CA: {error}"))?;
                reqwest::Client::builder()
                    .use_preconfigured_tls(tls)
                    .build()?
            }
        };
        let response = http
            .request(method, format!("{base}{path}"))
            .bearer_auth(operator_token)
            .header("content-type", content_type)
            .body(body)
            .send()
            .await
            .with_context(|| format!("cannot reach the gateway's internal listener at {base}"))?;
        check(response).await
    }

    pub async fn send<B: Serialize, T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&B>,
    ) -> anyhow::Result<T> {
        let response = self.request(method, path, query, body).await?;
        let response = check(response).await?;
        response
            .json()
            .await
            .with_context(|| format!("reading the answer of {path}"))
    }

    async fn request<B: Serialize>(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&B>,
    ) -> anyhow::Result<reqwest::Response> {
        let url = format!("{}{path}", self.base_url);
        let mut request = self
            .http
            .request(method, &url)
            .query(query)
            .timeout(std::time::Duration::from_secs(120));
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        request
            .send()
            .await
            .with_context(|| format!("cannot reach the SandBase API at {}", self.base_url))
    }
}

async fn check(response: reqwest::Response) -> anyhow::Result<reqwest::Response> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let text = response.text().await.unwrap_or_default();
    match serde_json::from_str::<ErrorBody>(&text) {
        Ok(body) => anyhow::bail!(
            "{} ({}, HTTP {})",
            body.error.message,
            body.error.code,
            status.as_u16()
        ),
        Err(_) if status == StatusCode::NOT_FOUND => {
            anyhow::bail!("HTTP 404: is this a SandBase API?")
        }
        Err(_) => anyhow::bail!(
            "HTTP {}: {}",
            status.as_u16(),
            text.chars().take(200).collect::<String>()
        ),
    }
}
