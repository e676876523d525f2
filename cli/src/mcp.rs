//! `sandbase mcp`: SandBase's MCP server over stdio, for clients that only start local
//! servers. The same tools as the gateway's `/mcp`, each a call of the gateway's API with
//! the CLI's key (`SANDBASE_API_KEY`, `--api-key` or the saved one).

use std::sync::Arc;

use rmcp::ServiceExt as _;
use sandbase_mcp::{ApiBody, ApiRequest, ApiStream, Backend, Sandbase};

use crate::args::GlobalArgs;
use crate::client::Client;

/// The gateway, over HTTP.
struct Remote(Client);

impl Backend for Remote {
    async fn stream(
        &self,
        _caller: Option<&http::request::Parts>,
        request: ApiRequest,
    ) -> Result<ApiStream, String> {
        let body = match request.body {
            None => None,
            Some(ApiBody::Json(value)) => Some((
                "application/json",
                serde_json::to_vec(&value).map_err(|error| error.to_string())?,
            )),
            Some(ApiBody::Bytes(bytes)) => Some(("application/octet-stream", bytes)),
        };
        let method = reqwest::Method::from_bytes(request.method.as_str().as_bytes())
            .map_err(|error| error.to_string())?;
        let response = self
            .0
            .exchange(method, &request.path, body)
            .await
            .map_err(|error| format!("{error:#}"))?;
        let status = response.status().as_u16();
        let content_type = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned);
        Ok(ApiStream::new(
            status,
            content_type.as_deref(),
            response.bytes_stream(),
        ))
    }
}

/// Serves MCP on standard input and output until the client closes them.
pub async fn serve(global: &GlobalArgs) -> anyhow::Result<()> {
    let client = Client::new(global)?;
    client.require_token()?;
    let server = Sandbase::new(Arc::new(Remote(client)));
    let running = server
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|error| anyhow::anyhow!("starting the MCP server: {error}"))?;
    running.waiting().await?;
    Ok(())
}
