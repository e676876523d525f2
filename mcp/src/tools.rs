//! The tools. Each names its sandbox explicitly (`sandbox_id`), checks it is a sandbox id
//! before it becomes part of an API path, and calls the public API through the backend;
//! the API decides who may do what (another team's sandbox is `not_found`).

use base64::Engine;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, tool, tool_router};
use serde_json::{Value, json};

use crate::backend::{ApiRequest, Backend};
use crate::output;
use crate::params::{
    CreateParams, Encoding, ExecParams, ExtendParams, Language, ListParams, PathParams,
    RUN_CODE_SANDBOX_SECS, RunCodeParams, SandboxParams, WriteParams, encoded, sandbox_path,
};
use crate::server::{Outcome, Sandbase, done};

/// `field` of a JSON value as text (empty when absent).
fn text<'v>(value: &'v Value, field: &str) -> &'v str {
    value[field].as_str().unwrap_or_default()
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
        done(
            self.api_json(&context, request, |sandbox| {
                format!(
                    "sandbox {} ({}, expires {})",
                    text(sandbox, "id"),
                    text(sandbox, "template"),
                    text(sandbox, "expires_at")
                )
            })
            .await,
        )
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
        done(
            self.api_json(&context, request, |list| {
                let sandboxes = list["sandboxes"].as_array().cloned().unwrap_or_default();
                let lines: Vec<String> = sandboxes
                    .iter()
                    .map(|s| {
                        let fields = ["id", "state", "template"].map(|field| text(s, field));
                        format!("{} expires {}", fields.join(" "), text(s, "expires_at"))
                    })
                    .collect();
                format!("{} running sandbox(es)\n{}", lines.len(), lines.join("\n"))
            })
            .await,
        )
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
        done(
            async {
                let path = sandbox_path(&params.sandbox_id)?;
                let body = json!({ "timeout_secs": params.timeout_secs });
                let request = ApiRequest::post(format!("{path}/timeout"), body);
                self.api_json(&context, request, |sandbox| {
                    format!(
                        "sandbox {} now expires {}",
                        text(sandbox, "id"),
                        text(sandbox, "expires_at")
                    )
                })
                .await
            }
            .await,
        )
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
        done(
            async {
                let path = sandbox_path(&params.sandbox_id)?;
                self.api_ok(&context, ApiRequest::delete(path)).await?;
                let id = params.sandbox_id.trim();
                Ok(output::success(
                    format!("sandbox {id} destroyed"),
                    json!({ "sandbox_id": id, "destroyed": true }),
                ))
            }
            .await,
        )
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
        done(
            async {
                let path = sandbox_path(&params.sandbox_id)?;
                let mut body = json!({ "env": params.env });
                match (params.command, params.argv) {
                    (Some(command), None) => body["command"] = json!(command),
                    (None, Some(argv)) => body["cmd"] = json!(argv),
                    _ => {
                        return Err(output::tool_error(
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
                Ok(output::command(&self.run(&context, &path, body).await?))
            }
            .await,
        )
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
        done(
            async {
                let sandbox_id = match params.sandbox_id {
                    Some(id) => id,
                    None => {
                        let body = json!({ "timeout_secs": RUN_CODE_SANDBOX_SECS });
                        let created = self
                            .api_ok(&context, ApiRequest::post("/v1/sandboxes", body))
                            .await?;
                        created
                            .json()
                            .map_or_else(String::new, |sandbox| text(&sandbox, "id").to_owned())
                    }
                };
                let path = sandbox_path(&sandbox_id)?;
                let (program, flag) = match params.language {
                    Language::Python => ("python3", "-c"),
                    Language::Bash => ("bash", "-c"),
                    Language::Node => ("node", "-e"),
                };
                let mut body = json!({ "cmd": [program, flag, params.code] });
                if let Some(timeout) = params.timeout_secs {
                    body["timeout_secs"] = json!(timeout);
                }
                let mut result = self.run(&context, &path, body).await?;
                result["sandbox_id"] = json!(sandbox_id);
                Ok(output::command(&result))
            }
            .await,
        )
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
        done(self.read_file(params, &context).await)
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
        done(
            async {
                let path = sandbox_path(&params.sandbox_id)?;
                let bytes = match params.encoding {
                    Encoding::Text => params.content.into_bytes(),
                    Encoding::Base64 => base64::engine::general_purpose::STANDARD
                        .decode(params.content.trim())
                        .map_err(|error| {
                            output::tool_error(
                                400,
                                "invalid_request",
                                &format!("`content` is not base64: {error}"),
                            )
                        })?,
                };
                let size = bytes.len();
                let target = format!("{path}/files?path={}", encoded(&params.path));
                let request = ApiRequest::put_bytes(target, bytes);
                self.api_json(&context, request, |_| {
                    format!("wrote {size} bytes to {}", params.path)
                })
                .await
            }
            .await,
        )
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
        done(
            async {
                let path = sandbox_path(&params.sandbox_id)?;
                let directory = params.path.unwrap_or_else(|| "/work".to_owned());
                let request = ApiRequest::get(format!("{path}/files?path={}", encoded(&directory)));
                self.api_json(&context, request, |listing| {
                    let entries = listing["entries"].as_array().cloned().unwrap_or_default();
                    let lines: Vec<String> = entries
                        .iter()
                        .map(|entry| {
                            format!(
                                "{} {} {}",
                                text(entry, "kind"),
                                entry["size"],
                                text(entry, "name")
                            )
                        })
                        .collect();
                    format!("{directory}: {} entries\n{}", lines.len(), lines.join("\n"))
                })
                .await
            }
            .await,
        )
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
        done(
            async {
                let path = sandbox_path(&params.sandbox_id)?;
                self.api_json(
                    &context,
                    ApiRequest::get(format!("{path}/egress")),
                    |list| format!("{} flow(s)", list["flows"].as_array().map_or(0, Vec::len)),
                )
                .await
            }
            .await,
        )
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
        done(
            self.api_json(&context, request, |balance| {
                format!("{} micro-credits available", balance["available_micro"])
            })
            .await,
        )
    }

    #[tool(
        description = "The models of the store (one key for OpenAI- and Anthropic-shaped calls) with their prices.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn store_models(
        &self,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        done(
            self.api_json(&context, ApiRequest::get("/v1/store/models"), |list| {
                format!("{} model(s)", list["models"].as_array().map_or(0, Vec::len))
            })
            .await,
        )
    }
}

impl<B: Backend> Sandbase<B> {
    /// A file's content: text as is, anything else base64; a directory is refused.
    async fn read_file(&self, params: PathParams, context: &RequestContext<RoleServer>) -> Outcome {
        let path = sandbox_path(&params.sandbox_id)?;
        let request = ApiRequest::get(format!("{path}/files?path={}", encoded(&params.path)));
        let answer = self.api_ok(context, request).await?;
        if answer.content_type.as_deref() == Some("application/json") {
            return Err(output::tool_error(
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
        Ok(output::success(
            shown,
            json!({ "path": params.path, "size": size, "encoding": encoding, "content": content }),
        ))
    }
}
