//! The tools a run offers its model — their definitions, what kind each call is, and their
//! execution in the run's sandbox through the public API: `shell` in one bash session under
//! a deterministic exec id (so that a second start of the same step answers the first and
//! runs nothing), `python` on the code endpoint, `files` on the MCP server's file tools.
//! Client functions are not executed here: the run waits for their results.

use sandbase_api::agent_runs::AgentTool;
use sandbase_api::conversation::ToolCall;
use sandbase_mcp::{ApiRequest, Backend, Caller};
use serde_json::{Value, json};

use crate::output;
pub use crate::output::ToolOutcome;
use crate::shell::{self, OutputSink};
pub use crate::shell::{DEFAULT_TOOL_SECS, SHELL_SESSION, command_outcome, kept_at, shell_request};

/// A tool as a model is told of it.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolDef {
    pub name: String,
    pub description: String,
    pub parameters: Value,
}

/// The definitions of `tools`.
/// The definitions of `tools` (an MCP server's tools come from [`mcp_definition`]).
pub fn definitions(tools: &[AgentTool]) -> Vec<ToolDef> {
    tools
        .iter()
        .filter(|tool| !matches!(tool, AgentTool::Mcp { .. }))
        .map(definition)
        .collect()
}

/// The name a model calls an MCP server's tool `server.tool` by (letters, digits, `_` and
/// `-` only, as both families require): `server__tool`.
pub fn mcp_model_name(name: &str) -> String {
    name.replacen('.', "__", 1)
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect()
}

/// An MCP server's tool as the model is told of it.
pub fn mcp_definition(tool: &sandbase_mcp::rmcp::model::Tool) -> ToolDef {
    ToolDef {
        name: mcp_model_name(&tool.name),
        description: tool.description.as_deref().unwrap_or_default().to_owned(),
        parameters: Value::Object(tool.input_schema.as_ref().clone()),
    }
}

/// Whether an MCP server says its tool changes nothing.
pub fn mcp_read_only(tool: &sandbase_mcp::rmcp::model::Tool) -> bool {
    tool.annotations
        .as_ref()
        .and_then(|annotations| annotations.read_only_hint)
        .unwrap_or(false)
}

/// What an MCP tool call answered, as the model sees it.
pub fn mcp_outcome(result: &sandbase_mcp::rmcp::model::CallToolResult) -> ToolOutcome {
    let text: Vec<String> = result
        .content
        .iter()
        .filter_map(|block| block.as_text().map(|text| text.text.clone()))
        .collect();
    let text = text.join("\n");
    ToolOutcome {
        content: output::shown(&text, "the MCP server's answer"),
        is_error: result.is_error.unwrap_or(false),
        detail: json!({ "bytes": text.len() }),
    }
}

fn definition(tool: &AgentTool) -> ToolDef {
    let def = |name: &str, description: &str, parameters: Value| ToolDef {
        name: name.to_owned(),
        description: description.to_owned(),
        parameters,
    };
    match tool {
        AgentTool::Shell => def(
            "shell",
            "Run a bash command line in the sandbox's shell session (the working directory and \
             exported variables carry over between calls). Answers the exit code and output.",
            json!({ "type": "object", "properties": {
                "command": { "type": "string", "description": "The command line." },
                "timeout_secs": { "type": "integer", "minimum": 1, "maximum": 3600 } },
                "required": ["command"] }),
        ),
        AgentTool::Files => def(
            "files",
            "View, create and edit files in the sandbox. `view` shows a file with line numbers \
             (`view_range` [first, last], -1 for the end) or lists a directory; `create` writes \
             `file_text`; `str_replace` replaces the one occurrence of `old_str` with \
             `new_str`; `insert` puts `insert_text` after line `insert_line` (0: the top). \
             Relative paths are under /work.",
            json!({ "type": "object", "properties": {
                "command": { "type": "string", "enum": ["view", "create", "str_replace", "insert"] },
                "path": { "type": "string" },
                "view_range": { "type": "array", "items": { "type": "integer" } },
                "file_text": { "type": "string" }, "old_str": { "type": "string" },
                "new_str": { "type": "string" }, "insert_line": { "type": "integer", "minimum": 0 },
                "insert_text": { "type": "string" } },
                "required": ["command", "path"] }),
        ),
        AgentTool::Python => def(
            "python",
            "Run Python code in a persistent interpreter in the sandbox: variables and imports \
             live on between calls. Answers the output, the last expression's value and any \
             exception.",
            json!({ "type": "object", "properties": {
                "code": { "type": "string" },
                "timeout_secs": { "type": "integer", "minimum": 1, "maximum": 3600 } },
                "required": ["code"] }),
        ),
        AgentTool::Mcp { .. } => def(
            "mcp",
            "(an MCP server's tools: offered one by one)",
            json!({ "type": "object" }),
        ),
        AgentTool::Function {
            name,
            description,
            parameters,
        } => def(
            name,
            description.as_deref().unwrap_or_default(),
            parameters
                .clone()
                .unwrap_or_else(|| json!({ "type": "object", "properties": {} })),
        ),
    }
}

/// What a call is, for running it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolKind {
    Shell,
    Files {
        changes: bool,
    },
    Python,
    /// A tool of one of the store's MCP servers.
    Mcp {
        read_only: bool,
    },
    /// The client runs it.
    Function,
    /// The model named no tool of the run.
    Unknown,
}

impl ToolKind {
    /// Whether a call may run beside others: it changes nothing in the sandbox.
    pub fn is_read_only(self) -> bool {
        matches!(
            self,
            ToolKind::Files { changes: false }
                | ToolKind::Function
                | ToolKind::Mcp { read_only: true }
        )
    }
}

/// What `call` is among `tools`.
pub fn kind(tools: &[AgentTool], call: &ToolCall) -> ToolKind {
    tools
        .iter()
        .find_map(|tool| match tool {
            AgentTool::Shell if call.name == "shell" => Some(ToolKind::Shell),
            AgentTool::Python if call.name == "python" => Some(ToolKind::Python),
            AgentTool::Files if call.name == "files" => Some(ToolKind::Files {
                changes: call.arguments["command"] != "view",
            }),
            AgentTool::Function { name, .. } if *name == call.name => Some(ToolKind::Function),
            _ => None,
        })
        .unwrap_or(ToolKind::Unknown)
}

/// Runs `call` (of kind `kind`, not a client function) in `sandbox`; `exec_id` names its
/// command where the tool has one. A `shell` command's output goes to `sink` as it comes,
/// when there is one.
pub async fn execute<B: Backend>(
    backend: &B,
    caller: &Caller<'_>,
    sandbox: &str,
    exec_id: &str,
    kind: ToolKind,
    call: &ToolCall,
    sink: Option<&OutputSink>,
) -> ToolOutcome {
    match kind {
        ToolKind::Shell => {
            shell::run(backend, caller, sandbox, exec_id, &call.arguments, sink).await
        }
        ToolKind::Python => python(backend, caller, sandbox, &call.arguments).await,
        ToolKind::Files { .. } => {
            match crate::files::run(backend, caller, sandbox, &call.arguments).await {
                Ok(text) => ToolOutcome {
                    content: output::shown(&text, "the file itself"),
                    is_error: false,
                    detail: json!({ "command": call.arguments["command"] }),
                },
                Err(error) => ToolOutcome::error(error),
            }
        }
        ToolKind::Function => ToolOutcome::error("a client function is run by the client"),
        ToolKind::Mcp { .. } => ToolOutcome::error("an MCP tool is called by its server's client"),
        ToolKind::Unknown => {
            ToolOutcome::error(format!("there is no tool `{}` in this run", call.name))
        }
    }
}

async fn python<B: Backend>(
    backend: &B,
    caller: &Caller<'_>,
    sandbox: &str,
    arguments: &Value,
) -> ToolOutcome {
    let Some(code) = arguments["code"].as_str() else {
        return ToolOutcome::error("`code` (a string) is required");
    };
    let request = ApiRequest::post(
        format!("/v1/sandboxes/{sandbox}/code"),
        json!({ "code": code, "timeout_secs": shell::timeout(arguments) }),
    );
    let answer = match backend.call(caller.parts, request).await {
        Ok(answer) => answer,
        Err(why) => return ToolOutcome::error(format!("the sandbox could not be reached: {why}")),
    };
    let body = answer.json().unwrap_or(Value::Null);
    if !answer.is_success() {
        return ToolOutcome::error(output::refusal(&body, answer.status));
    }
    let mut text = String::new();
    for stream in ["stdout", "stderr"] {
        text.push_str(body[stream].as_str().unwrap_or_default());
    }
    for result in body["results"].as_array().into_iter().flatten() {
        if let Some(plain) = result["text/plain"].as_str() {
            text.push_str(plain);
            text.push('\n');
        }
        if let Some(png) = result["image/png"].as_str() {
            text.push_str(&format!(
                "[an image/png result, {} bytes of base64]\n",
                png.len()
            ));
        }
    }
    let exception = &body["exception"];
    if let Some(traceback) = exception["traceback"].as_str() {
        text.push_str(traceback);
    }
    ToolOutcome {
        content: output::shown(&text, "the interpreter's variables"),
        is_error: !exception.is_null(),
        detail: json!({ "execution_count": body["execution_count"],
                        "duration_ms": body["duration_ms"], "timed_out": body["timed_out"],
                        "exception": exception["name"] }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_mcp_tool_marked_read_only_runs_beside_others() {
        let tool: sandbase_mcp::rmcp::model::Tool = serde_json::from_value(json!({
            "name": "upstream.peek", "description": "Looks.", "annotations": {"readOnlyHint": true},
            "inputSchema": {"type": "object", "properties": {"seconds": {"type": "number"}}}
        }))
        .expect("a tool");
        assert!(mcp_read_only(&tool));
        assert!(ToolKind::Mcp { read_only: true }.is_read_only());
        assert!(!ToolKind::Mcp { read_only: false }.is_read_only());
        assert_eq!(mcp_definition(&tool).name, "upstream__peek");
    }
}
