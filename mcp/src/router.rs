//! The tools as rmcp serves them: each a thin wrapper that turns the MCP request into a
//! [`Caller`] and calls the plain function of `tools.rs`. Descriptions and hints are fixed
//! text: nothing from a sandbox.

use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, tool, tool_router};

use crate::agent_tools::{self, AgentRunCreateParams, AgentRunEventsParams, AgentRunParams};
use crate::backend::Backend;
use crate::call::{Outcome, caller};
use crate::params::{
    CreateParams, ExecParams, ExtendParams, ListParams, PathParams, RunCodeParams, SandboxParams,
    WriteParams,
};
use crate::server::Sandbase;
use crate::tools;

/// What a tool answers rmcp: its result either way (refusals are results, not protocol
/// errors).
fn done(outcome: Outcome) -> Result<CallToolResult, ErrorData> {
    Ok(outcome.unwrap_or_else(|error| error))
}

#[tool_router(vis = "pub(crate)")]
impl<B: Backend> Sandbase<B> {
    #[tool(
        description = "Create a sandbox: an isolated machine to run code in, destroyed when its time is up.",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            open_world_hint = false
        )
    )]
    async fn sandbox_create(
        &self,
        Parameters(params): Parameters<CreateParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        done(tools::sandbox_create(&*self.backend, &caller(&context), params).await)
    }

    #[tool(
        description = "List the team's sandboxes with their state, template and expiry.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn sandbox_list(
        &self,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        done(tools::sandbox_list(&*self.backend, &caller(&context)).await)
    }

    #[tool(
        description = "Give a sandbox more time: it will live timeout_secs from now.",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn sandbox_extend(
        &self,
        Parameters(params): Parameters<ExtendParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        done(tools::sandbox_extend(&*self.backend, &caller(&context), params).await)
    }

    #[tool(
        description = "Destroy a sandbox and everything in it.",
        annotations(
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn sandbox_destroy(
        &self,
        Parameters(params): Parameters<SandboxParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        done(tools::sandbox_destroy(&*self.backend, &caller(&context), params).await)
    }

    #[tool(
        description = "Run a command in a sandbox and return its exit code, stdout and stderr (each capped).",
        annotations(
            read_only_hint = false,
            destructive_hint = true,
            open_world_hint = true
        )
    )]
    async fn exec(
        &self,
        Parameters(params): Parameters<ExecParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        done(tools::exec(&*self.backend, &caller(&context), params).await)
    }

    #[tool(
        description = "Run Python, Bash or Node code. Without sandbox_id a short-lived sandbox is created for it (its id is returned, to reuse or destroy).",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            open_world_hint = true
        )
    )]
    async fn run_code(
        &self,
        Parameters(params): Parameters<RunCodeParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        done(tools::run_code(&*self.backend, &caller(&context), params).await)
    }

    #[tool(
        description = "Read a file from a sandbox: text as is, other content as base64.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn files_read(
        &self,
        Parameters(params): Parameters<PathParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        done(tools::files_read(&*self.backend, &caller(&context), params).await)
    }

    #[tool(
        description = "Write a file in a sandbox (text, or base64 for binary content); parents are created.",
        annotations(
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn files_write(
        &self,
        Parameters(params): Parameters<WriteParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        done(tools::files_write(&*self.backend, &caller(&context), params).await)
    }

    #[tool(
        description = "List a directory of a sandbox: names, kinds, sizes.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn files_list(
        &self,
        Parameters(params): Parameters<ListParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        done(tools::files_list(&*self.backend, &caller(&context), params).await)
    }

    #[tool(
        description = "A sandbox's egress flow log: each connection it made or tried, allowed or denied.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn egress_flows(
        &self,
        Parameters(params): Parameters<SandboxParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        done(tools::egress_flows(&*self.backend, &caller(&context), params).await)
    }

    #[tool(
        description = "The team's credit balance (available, reserved, with expiries).",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn credits_balance(
        &self,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        done(tools::credits_balance(&*self.backend, &caller(&context)).await)
    }

    #[tool(
        description = "The models of the store (one key for OpenAI- and Anthropic-shaped calls) with their prices.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn store_models(
        &self,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        done(tools::store_models(&*self.backend, &caller(&context)).await)
    }

    #[tool(
        description = "Hand a task to a SandBase agent run: a model of the store (any family) working in a sandbox of its own with shell, files and python tools. Answers at once with the run's id; follow it with agent_run_events.",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            open_world_hint = true
        )
    )]
    async fn agent_run_create(
        &self,
        Parameters(params): Parameters<AgentRunCreateParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        done(agent_tools::agent_run_create(&*self.backend, &caller(&context), params).await)
    }

    #[tool(
        description = "An agent run's status, turns, tool calls, spending and what it waits for.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn agent_run_get(
        &self,
        Parameters(params): Parameters<AgentRunParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        done(agent_tools::agent_run_get(&*self.backend, &caller(&context), params).await)
    }

    #[tool(
        description = "An agent run's events after a seq (its model calls, tool calls and results, status changes), one per line; call again with next_after to follow it.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn agent_run_events(
        &self,
        Parameters(params): Parameters<AgentRunEventsParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        done(agent_tools::agent_run_events(&*self.backend, &caller(&context), params).await)
    }
}
