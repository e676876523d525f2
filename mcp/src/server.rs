//! The server: its backend, the calls the tools share (an API call, its JSON as a result,
//! a command with progress), and the MCP handler (tool listing with the backend's extra
//! tools, calls routed to SandBase's tools or the backend's).

use std::sync::Arc;
use std::time::Duration;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ListToolsResult,
    PaginatedRequestParams, ProgressNotificationParam, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::Value;

use crate::backend::{ApiAnswer, ApiRequest, Backend};
use crate::output;

/// SandBase's MCP server over `backend`.
pub struct Sandbase<B: Backend> {
    backend: Arc<B>,
    tool_router: ToolRouter<Self>,
}

impl<B: Backend> Clone for Sandbase<B> {
    fn clone(&self) -> Self {
        Sandbase {
            backend: Arc::clone(&self.backend),
            tool_router: self.tool_router.clone(),
        }
    }
}

/// A tool's outcome: its result, or the tool error that ended it early (`?` on any step).
pub(crate) type Outcome = Result<CallToolResult, CallToolResult>;

/// What a tool answers rmcp: its result either way (refusals are results, not protocol
/// errors).
pub(crate) fn done(outcome: Outcome) -> Result<CallToolResult, ErrorData> {
    Ok(outcome.unwrap_or_else(|error| error))
}

impl<B: Backend> Sandbase<B> {
    pub fn new(backend: Arc<B>) -> Sandbase<B> {
        Sandbase {
            backend,
            tool_router: Self::tool_router(),
        }
    }

    pub(crate) async fn api(
        &self,
        context: &RequestContext<RoleServer>,
        request: ApiRequest,
    ) -> Result<ApiAnswer, CallToolResult> {
        let parts = context.extensions.get::<http::request::Parts>();
        self.backend
            .call(parts, request)
            .await
            .map_err(|why| output::tool_error(502, "unavailable", &why))
    }

    /// An API call that must succeed: its answer, or the refusal as a tool error.
    pub(crate) async fn api_ok(
        &self,
        context: &RequestContext<RoleServer>,
        request: ApiRequest,
    ) -> Result<ApiAnswer, CallToolResult> {
        let answer = self.api(context, request).await?;
        if answer.is_success() {
            Ok(answer)
        } else {
            Err(output::refusal(&answer))
        }
    }

    /// An API call whose JSON answer is the tool's result (with `summary` of it as text).
    pub(crate) async fn api_json(
        &self,
        context: &RequestContext<RoleServer>,
        request: ApiRequest,
        summary: impl FnOnce(&Value) -> String,
    ) -> Outcome {
        let value = self
            .api_ok(context, request)
            .await?
            .json()
            .unwrap_or(Value::Null);
        Ok(output::success(summary(&value), value))
    }

    /// Runs an exec request, telling a client that asked for progress how long it has run.
    pub(crate) async fn run(
        &self,
        context: &RequestContext<RoleServer>,
        path: &str,
        body: Value,
    ) -> Result<Value, CallToolResult> {
        let call = self.api_ok(context, ApiRequest::post(format!("{path}/exec"), body));
        let answer = match context.meta.get_progress_token() {
            None => call.await?,
            Some(token) => {
                let peer = context.peer.clone();
                let ticker = tokio::spawn(async move {
                    let mut seconds = 0u32;
                    loop {
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        seconds += 1;
                        let progress =
                            ProgressNotificationParam::new(token.clone(), seconds.into())
                                .with_message(format!("running for {seconds} s"));
                        if peer.notify_progress(progress).await.is_err() {
                            return;
                        }
                    }
                });
                let answer = call.await;
                ticker.abort();
                answer?
            }
        };
        Ok(answer.json().unwrap_or(Value::Null))
    }
}

impl<B: Backend> ServerHandler for Sandbase<B> {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_instructions(crate::INSTRUCTIONS)
    }

    /// The tools; `store_models` only when the store offers models.
    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let mut tools = self.tool_router.list_all();
        let offered = match self
            .api(&context, ApiRequest::get("/v1/store/models"))
            .await
        {
            Ok(answer) if answer.is_success() => answer
                .json()
                .and_then(|list| list["models"].as_array().map(|models| !models.is_empty()))
                .unwrap_or(false),
            _ => false,
        };
        if !offered {
            tools.retain(|tool| tool.name != "store_models");
        }
        let parts = context.extensions.get::<http::request::Parts>();
        tools.extend(self.backend.extra_tools(parts).await);
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        // The operator's servers' tools are named `server.tool`; SandBase's own have no dot.
        if request.name.contains('.') {
            let parts = context.extensions.get::<http::request::Parts>();
            let arguments = request.arguments.clone();
            if let Some(mut result) = self
                .backend
                .call_extra(parts, &request.name, arguments)
                .await
            {
                // An upstream of an older revision sends no result type; this one is complete
                // (the handler drops the field again for clients of older revisions).
                result.result_type = Some(rmcp::model::ResultType::COMPLETE);
                return Ok(CallToolResponse::Complete(result));
            }
        }
        let context = rmcp::handler::server::tool::ToolCallContext::new(self, request, context);
        self.tool_router.call(context).await
    }
}
