//! The server: its backend and the MCP handler (tool listing with the backend's extra
//! tools, calls routed to SandBase's tools or the backend's).

use std::sync::Arc;

use crate::backend::{ApiRequest, Backend};
use crate::call::caller;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ListToolsResult, PaginatedRequestParams,
    ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};

/// SandBase's MCP server over `backend`.
pub struct Sandbase<B: Backend> {
    pub(crate) backend: Arc<B>,
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

impl<B: Backend> Sandbase<B> {
    pub fn new(backend: Arc<B>) -> Sandbase<B> {
        Sandbase {
            backend,
            tool_router: Self::tool_router(),
        }
    }
}

impl<B: Backend> ServerHandler for Sandbase<B> {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_instructions(crate::INSTRUCTIONS)
    }

    /// The tools; `store_models` and the agent-run tools only when the store offers models.
    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let mut tools = self.tool_router.list_all();
        let request = ApiRequest::get("/v1/store/models");
        let offered = match crate::call::api(&*self.backend, &caller(&context), request).await {
            Ok(answer) if answer.is_success() => answer
                .json()
                .and_then(|list| list["models"].as_array().map(|models| !models.is_empty()))
                .unwrap_or(false),
            _ => false,
        };
        if !offered {
            tools
                .retain(|tool| tool.name != "store_models" && !tool.name.starts_with("agent_run_"));
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
