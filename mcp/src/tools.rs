//! The tools. Each names its sandbox explicitly (`sandbox_id`), checks it is a sandbox id
//! before it becomes part of an API path, and calls the public API through the backend;
//! the API decides who may do what (another team's sandbox is `not_found`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ListToolsResult,
    PaginatedRequestParams, ProgressNotificationParam, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, schemars, tool, tool_router};
use serde::Deserialize;
use serde_json::{Value, json};
use uuid::Uuid;

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

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct CreateParams {
    /// The template (root file system) to start from; the server's default when absent.
    #[serde(default)]
    pub template: Option<String>,
    /// Seconds the sandbox lives before it is destroyed (it can be extended).
    #[serde(default)]
    pub timeout_secs: Option<u64>,
    /// Memory in MiB.
    #[serde(default)]
    pub memory_mb: Option<u32>,
    /// Hosts it may reach (`api.github.com`, `*.example.org`); nothing when empty.
    #[serde(default)]
    pub egress_allow: Vec<String>,
    /// Vault credentials (names) the egress proxy adds to its requests for their hosts.
    #[serde(default)]
    pub credentials: Vec<String>,
    /// Give it the model store: the OpenAI and Anthropic SDKs inside work with no key.
    #[serde(default)]
    pub store: bool,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct SandboxParams {
    /// The sandbox's id (from sandbox_create or sandbox_list).
    pub sandbox_id: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct ExtendParams {
    pub sandbox_id: String,
    /// Seconds from now it should live.
    pub timeout_secs: u64,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct ExecParams {
    pub sandbox_id: String,
    /// A shell command line (run with /bin/sh -c); or give `argv`.
    #[serde(default)]
    pub command: Option<String>,
    /// The program and its arguments, no shell; or give `command`.
    #[serde(default)]
    pub argv: Option<Vec<String>>,
    #[serde(default)]
    pub cwd: Option<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Seconds before the command is killed.
    #[serde(default)]
    pub timeout_secs: Option<u64>,
}

#[derive(Debug, Clone, Copy, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Language {
    Python,
    Bash,
    Node,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct RunCodeParams {
    pub language: Language,
    pub code: String,
    /// Run in this sandbox; when absent a short-lived one is created (its id is returned).
    #[serde(default)]
    pub sandbox_id: Option<String>,
    #[serde(default)]
    pub timeout_secs: Option<u64>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct PathParams {
    pub sandbox_id: String,
    /// An absolute path inside the sandbox.
    pub path: String,
}

#[derive(Debug, Clone, Copy, Default, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    #[default]
    Text,
    Base64,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct WriteParams {
    pub sandbox_id: String,
    /// An absolute path inside the sandbox (parents are created).
    pub path: String,
    pub content: String,
    /// `text` (UTF-8, the default) or `base64` for binary content.
    #[serde(default)]
    pub encoding: Encoding,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct ListParams {
    pub sandbox_id: String,
    /// A directory inside the sandbox (`/work` when absent).
    #[serde(default)]
    pub path: Option<String>,
}

/// How long a sandbox run_code makes for itself lives.
const RUN_CODE_SANDBOX_SECS: u64 = 600;

/// `value` percent-encoded for a query string.
fn encoded(value: &str) -> String {
    value
        .bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                char::from(byte).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}

/// A sandbox id as a path segment, or the tool error a malformed one gets.
fn sandbox_path(id: &str) -> Result<String, CallToolResult> {
    Uuid::parse_str(id.trim())
        .map(|id| format!("/v1/sandboxes/{id}"))
        .map_err(|_| {
            output::tool_error(
                400,
                "invalid_request",
                "`sandbox_id` is not a sandbox id (sandbox_list shows them)",
            )
        })
}

impl<B: Backend> Sandbase<B> {
    pub fn new(backend: Arc<B>) -> Sandbase<B> {
        Sandbase {
            backend,
            tool_router: Self::tool_router(),
        }
    }

    async fn api(
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

    /// An API call whose JSON answer is the tool's result (with `summary` of it as text).
    async fn api_json(
        &self,
        context: &RequestContext<RoleServer>,
        request: ApiRequest,
        summary: impl FnOnce(&Value) -> String,
    ) -> CallToolResult {
        match self.api(context, request).await {
            Ok(answer) if answer.is_success() => {
                let value = answer.json().unwrap_or(Value::Null);
                output::success(summary(&value), value)
            }
            Ok(answer) => output::refusal(&answer),
            Err(error) => error,
        }
    }

    /// Runs an exec request, telling a client that asked for progress how long it has run.
    async fn run(
        &self,
        context: &RequestContext<RoleServer>,
        path: &str,
        body: Value,
    ) -> Result<Value, CallToolResult> {
        let call = self.api(context, ApiRequest::post(format!("{path}/exec"), body));
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
        if !answer.is_success() {
            return Err(output::refusal(&answer));
        }
        Ok(answer.json().unwrap_or(Value::Null))
    }
}

#[tool_router]
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
        let mut body = json!({ "store": params.store, "credentials": params.credentials });
        if let Some(template) = params.template {
            body["template"] = json!(template);
        }
        if let Some(timeout) = params.timeout_secs {
            body["timeout_secs"] = json!(timeout);
        }
        if let Some(memory) = params.memory_mb {
            body["resources"] = json!({ "memory_mb": memory });
        }
        if !params.egress_allow.is_empty() {
            body["egress"] = json!({ "allow": params.egress_allow });
        }
        let request = ApiRequest::post("/v1/sandboxes", body);
        Ok(self
            .api_json(&context, request, |sandbox| {
                format!(
                    "sandbox {} ({}, expires {})",
                    sandbox["id"].as_str().unwrap_or_default(),
                    sandbox["template"].as_str().unwrap_or_default(),
                    sandbox["expires_at"].as_str().unwrap_or_default()
                )
            })
            .await)
    }

    #[tool(
        description = "List the team's sandboxes with their state, template and expiry.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn sandbox_list(
        &self,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let request = ApiRequest::get("/v1/sandboxes?state=running");
        Ok(self
            .api_json(&context, request, |list| {
                let sandboxes = list["sandboxes"].as_array().cloned().unwrap_or_default();
                let lines: Vec<String> = sandboxes
                    .iter()
                    .map(|s| {
                        format!(
                            "{} {} {} expires {}",
                            s["id"].as_str().unwrap_or_default(),
                            s["state"].as_str().unwrap_or_default(),
                            s["template"].as_str().unwrap_or_default(),
                            s["expires_at"].as_str().unwrap_or_default()
                        )
                    })
                    .collect();
                format!("{} running sandbox(es)\n{}", lines.len(), lines.join("\n"))
            })
            .await)
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
        let path = match sandbox_path(&params.sandbox_id) {
            Ok(path) => path,
            Err(error) => return Ok(error),
        };
        let request = ApiRequest::post(
            format!("{path}/timeout"),
            json!({ "timeout_secs": params.timeout_secs }),
        );
        Ok(self
            .api_json(&context, request, |sandbox| {
                format!(
                    "sandbox {} now expires {}",
                    sandbox["id"].as_str().unwrap_or_default(),
                    sandbox["expires_at"].as_str().unwrap_or_default()
                )
            })
            .await)
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
        let path = match sandbox_path(&params.sandbox_id) {
            Ok(path) => path,
            Err(error) => return Ok(error),
        };
        Ok(match self.api(&context, ApiRequest::delete(path)).await {
            Ok(answer) if answer.is_success() => output::success(
                format!("sandbox {} destroyed", params.sandbox_id.trim()),
                json!({ "sandbox_id": params.sandbox_id.trim(), "destroyed": true }),
            ),
            Ok(answer) => output::refusal(&answer),
            Err(error) => error,
        })
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
        let path = match sandbox_path(&params.sandbox_id) {
            Ok(path) => path,
            Err(error) => return Ok(error),
        };
        let mut body = json!({ "env": params.env });
        match (params.command, params.argv) {
            (Some(command), None) => body["command"] = json!(command),
            (None, Some(argv)) => body["cmd"] = json!(argv),
            _ => {
                return Ok(output::tool_error(
                    400,
                    "invalid_request",
                    "give exactly one of `command` (a shell line) and `argv`",
                ));
            }
        }
        if let Some(cwd) = params.cwd {
            body["cwd"] = json!(cwd);
        }
        if let Some(timeout) = params.timeout_secs {
            body["timeout_secs"] = json!(timeout);
        }
        Ok(match self.run(&context, &path, body).await {
            Ok(result) => output::command(&result),
            Err(error) => error,
        })
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
        let sandbox_id = match params.sandbox_id {
            Some(id) => id,
            None => {
                let body = json!({ "timeout_secs": RUN_CODE_SANDBOX_SECS });
                match self
                    .api(&context, ApiRequest::post("/v1/sandboxes", body))
                    .await
                {
                    Ok(answer) if answer.is_success() => answer
                        .json()
                        .and_then(|sandbox| sandbox["id"].as_str().map(str::to_owned))
                        .unwrap_or_default(),
                    Ok(answer) => return Ok(output::refusal(&answer)),
                    Err(error) => return Ok(error),
                }
            }
        };
        let path = match sandbox_path(&sandbox_id) {
            Ok(path) => path,
            Err(error) => return Ok(error),
        };
        let argv = match params.language {
            Language::Python => ["python3", "-c"],
            Language::Bash => ["bash", "-c"],
            Language::Node => ["node", "-e"],
        };
        let mut body = json!({ "cmd": [argv[0], argv[1], params.code] });
        if let Some(timeout) = params.timeout_secs {
            body["timeout_secs"] = json!(timeout);
        }
        Ok(match self.run(&context, &path, body).await {
            Ok(mut result) => {
                result["sandbox_id"] = json!(sandbox_id);
                output::command(&result)
            }
            Err(error) => error,
        })
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
        let path = match sandbox_path(&params.sandbox_id) {
            Ok(path) => path,
            Err(error) => return Ok(error),
        };
        let request = ApiRequest::get(format!("{path}/files?path={}", encoded(&params.path)));
        Ok(match self.api(&context, request).await {
            Ok(answer) if answer.is_success() => {
                if answer.content_type.as_deref() == Some("application/json") {
                    return Ok(output::tool_error(
                        400,
                        "is_a_directory",
                        &format!("{} is a directory: use files_list", params.path),
                    ));
                }
                let size = answer.body.len();
                let (content, encoding) = match String::from_utf8(answer.body) {
                    Ok(text) => (text, "text"),
                    Err(bytes) => (
                        base64::engine::general_purpose::STANDARD.encode(bytes.into_bytes()),
                        "base64",
                    ),
                };
                let shown = if encoding == "text" {
                    output::capped(&content)
                } else {
                    format!("({size} bytes of binary content, base64 in the structured result)")
                };
                output::success(
                    shown,
                    json!({ "path": params.path, "size": size, "encoding": encoding, "content": content }),
                )
            }
            Ok(answer) => output::refusal(&answer),
            Err(error) => error,
        })
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
        let path = match sandbox_path(&params.sandbox_id) {
            Ok(path) => path,
            Err(error) => return Ok(error),
        };
        let bytes = match params.encoding {
            Encoding::Text => params.content.into_bytes(),
            Encoding::Base64 => {
                match base64::engine::general_purpose::STANDARD.decode(params.content.trim()) {
                    Ok(bytes) => bytes,
                    Err(error) => {
                        return Ok(output::tool_error(
                            400,
                            "invalid_request",
                            &format!("`content` is not base64: {error}"),
                        ));
                    }
                }
            }
        };
        let size = bytes.len();
        let request = ApiRequest::put_bytes(
            format!("{path}/files?path={}", encoded(&params.path)),
            bytes,
        );
        Ok(self
            .api_json(&context, request, |_| {
                format!("wrote {size} bytes to {}", params.path)
            })
            .await)
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
        let path = match sandbox_path(&params.sandbox_id) {
            Ok(path) => path,
            Err(error) => return Ok(error),
        };
        let directory = params.path.unwrap_or_else(|| "/work".to_owned());
        let request = ApiRequest::get(format!("{path}/files?path={}", encoded(&directory)));
        Ok(self
            .api_json(&context, request, |listing| {
                let entries = listing["entries"].as_array().cloned().unwrap_or_default();
                let lines: Vec<String> = entries
                    .iter()
                    .map(|entry| {
                        format!(
                            "{} {} {}",
                            entry["kind"].as_str().unwrap_or_default(),
                            entry["size"],
                            entry["name"].as_str().unwrap_or_default()
                        )
                    })
                    .collect();
                format!("{directory}: {} entries\n{}", lines.len(), lines.join("\n"))
            })
            .await)
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
        let path = match sandbox_path(&params.sandbox_id) {
            Ok(path) => path,
            Err(error) => return Ok(error),
        };
        Ok(self
            .api_json(
                &context,
                ApiRequest::get(format!("{path}/egress")),
                |list| format!("{} flow(s)", list["flows"].as_array().map_or(0, Vec::len)),
            )
            .await)
    }

    #[tool(
        description = "The team's credit balance (available, reserved, with expiries).",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn credits_balance(
        &self,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let request = ApiRequest::get("/v1/billing/balance");
        Ok(self
            .api_json(&context, request, |balance| {
                format!("{} micro-credits available", balance["available_micro"])
            })
            .await)
    }

    #[tool(
        description = "The models of the store (one key for OpenAI- and Anthropic-shaped calls) with their prices.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn store_models(
        &self,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        Ok(self
            .api_json(&context, ApiRequest::get("/v1/store/models"), |list| {
                format!("{} model(s)", list["models"].as_array().map_or(0, Vec::len))
            })
            .await)
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
