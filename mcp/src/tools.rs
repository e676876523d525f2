//! The tools, each a plain function of (backend, caller, parameters): what the MCP server
//! offers (`router.rs` wraps them for rmcp) and what any other caller in process — the
//! harness — offers a model, by construction the same. Each names its sandbox explicitly
//! (`sandbox_id`), checks it is a sandbox id before it becomes part of an API path, and calls
//! the public API through the backend with request bodies of `sandbase-api`'s types; the API
//! decides who may do what (another team's sandbox is `not_found`).

use base64::Engine;
use sandbase_api::sandboxes::{
    CreateSandboxRequest, EgressPolicy, ExecRequest, ExtendTimeoutRequest, ResourcesRequest,
};
use serde_json::{Value, json};

use crate::backend::{ApiRequest, Backend};
use crate::call::{Caller, Outcome, api_json, api_ok, run};
use crate::output;
use crate::params::{
    CreateParams, Encoding, ExecParams, ExtendParams, Language, ListParams, PathParams,
    RUN_CODE_SANDBOX_SECS, RunCodeParams, SandboxParams, WriteParams, encoded, sandbox_path,
};

/// `field` of a JSON value as text (empty when absent).
fn text<'v>(value: &'v Value, field: &str) -> &'v str {
    value[field].as_str().unwrap_or_default()
}

/// A request's typed body as the API reads it.
fn body(request: &impl serde::Serialize) -> Value {
    serde_json::to_value(request).unwrap_or(Value::Null)
}

pub async fn sandbox_create<B: Backend>(
    backend: &B,
    caller: &Caller<'_>,
    params: CreateParams,
) -> Outcome {
    let request = CreateSandboxRequest {
        template: params.template,
        timeout_secs: params.timeout_secs,
        resources: ResourcesRequest {
            memory_mb: params.memory_mb,
            ..ResourcesRequest::default()
        },
        egress: (!params.egress_allow.is_empty()).then(|| EgressPolicy {
            allow: params.egress_allow,
            ..EgressPolicy::default()
        }),
        credentials: params.credentials,
        store: params.store,
        ..CreateSandboxRequest::default()
    };
    let request = ApiRequest::post("/v1/sandboxes", body(&request));
    api_json(backend, caller, request, |sandbox| {
        format!(
            "sandbox {} ({}, expires {})",
            text(sandbox, "id"),
            text(sandbox, "template"),
            text(sandbox, "expires_at")
        )
    })
    .await
}

pub async fn sandbox_list<B: Backend>(backend: &B, caller: &Caller<'_>) -> Outcome {
    let request = ApiRequest::get("/v1/sandboxes?state=running");
    api_json(backend, caller, request, |list| {
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
    .await
}

pub async fn sandbox_extend<B: Backend>(
    backend: &B,
    caller: &Caller<'_>,
    params: ExtendParams,
) -> Outcome {
    let path = sandbox_path(&params.sandbox_id)?;
    let request = ExtendTimeoutRequest {
        timeout_secs: params.timeout_secs,
    };
    let request = ApiRequest::post(format!("{path}/timeout"), body(&request));
    api_json(backend, caller, request, |sandbox| {
        format!(
            "sandbox {} now expires {}",
            text(sandbox, "id"),
            text(sandbox, "expires_at")
        )
    })
    .await
}

pub async fn sandbox_destroy<B: Backend>(
    backend: &B,
    caller: &Caller<'_>,
    params: SandboxParams,
) -> Outcome {
    let path = sandbox_path(&params.sandbox_id)?;
    api_ok(backend, caller, ApiRequest::delete(path)).await?;
    let id = params.sandbox_id.trim();
    Ok(output::success(
        format!("sandbox {id} destroyed"),
        json!({ "sandbox_id": id, "destroyed": true }),
    ))
}

pub async fn exec<B: Backend>(backend: &B, caller: &Caller<'_>, params: ExecParams) -> Outcome {
    let path = sandbox_path(&params.sandbox_id)?;
    let (cmd, command) = match (params.command, params.argv) {
        (Some(command), None) => (None, Some(command)),
        (None, Some(argv)) => (Some(argv), None),
        _ => {
            return Err(output::tool_error(
                400,
                "invalid_request",
                "give exactly one of `command` (a shell line) and `argv`",
            ));
        }
    };
    let request = ExecRequest {
        cmd,
        command,
        env: params.env,
        cwd: params.cwd,
        timeout_secs: params.timeout_secs,
        ..ExecRequest::default()
    };
    Ok(output::command(
        &run(backend, caller, &path, request).await?,
    ))
}

pub async fn run_code<B: Backend>(
    backend: &B,
    caller: &Caller<'_>,
    params: RunCodeParams,
) -> Outcome {
    let sandbox_id = match params.sandbox_id {
        Some(id) => id,
        None => {
            let request = CreateSandboxRequest {
                timeout_secs: Some(RUN_CODE_SANDBOX_SECS),
                ..CreateSandboxRequest::default()
            };
            let request = ApiRequest::post("/v1/sandboxes", body(&request));
            let created = api_ok(backend, caller, request).await?;
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
    let request = ExecRequest {
        cmd: Some(vec![program.to_owned(), flag.to_owned(), params.code]),
        timeout_secs: params.timeout_secs,
        ..ExecRequest::default()
    };
    let mut command = run(backend, caller, &path, request).await?;
    command.sandbox_id = Some(sandbox_id);
    Ok(output::command(&command))
}

/// A file's content: text as is, anything else base64; a directory is refused, and so is a
/// file larger than the backend collects whole.
pub async fn files_read<B: Backend>(
    backend: &B,
    caller: &Caller<'_>,
    params: PathParams,
) -> Outcome {
    let path = sandbox_path(&params.sandbox_id)?;
    let request = ApiRequest::get(format!("{path}/files?path={}", encoded(&params.path)));
    let answer = api_ok(backend, caller, request).await?;
    if answer.content_type.as_deref() == Some("application/json") {
        return Err(output::tool_error(
            400,
            "is_a_directory",
            &format!("{} is a directory: use files_list", params.path),
        ));
    }
    if answer.truncated {
        return Err(output::tool_error(
            413,
            "file_too_large",
            &format!(
                "{} is larger than {} bytes: read a part of it with exec (head, tail, sed)",
                params.path,
                crate::backend::MAX_ANSWER_BYTES
            ),
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

pub async fn files_write<B: Backend>(
    backend: &B,
    caller: &Caller<'_>,
    params: WriteParams,
) -> Outcome {
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
    api_json(backend, caller, request, |_| {
        format!("wrote {size} bytes to {}", params.path)
    })
    .await
}

pub async fn files_list<B: Backend>(
    backend: &B,
    caller: &Caller<'_>,
    params: ListParams,
) -> Outcome {
    let path = sandbox_path(&params.sandbox_id)?;
    let directory = params.path.unwrap_or_else(|| "/work".to_owned());
    let request = ApiRequest::get(format!("{path}/files?path={}", encoded(&directory)));
    api_json(backend, caller, request, |listing| {
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

pub async fn egress_flows<B: Backend>(
    backend: &B,
    caller: &Caller<'_>,
    params: SandboxParams,
) -> Outcome {
    let path = sandbox_path(&params.sandbox_id)?;
    let request = ApiRequest::get(format!("{path}/egress"));
    api_json(backend, caller, request, |list| {
        format!("{} flow(s)", list["flows"].as_array().map_or(0, Vec::len))
    })
    .await
}

pub async fn credits_balance<B: Backend>(backend: &B, caller: &Caller<'_>) -> Outcome {
    let request = ApiRequest::get("/v1/billing/balance");
    api_json(backend, caller, request, |balance| {
        format!("{} micro-credits available", balance["available_micro"])
    })
    .await
}

pub async fn store_models<B: Backend>(backend: &B, caller: &Caller<'_>) -> Outcome {
    let request = ApiRequest::get("/v1/store/models");
    api_json(backend, caller, request, |list| {
        format!("{} model(s)", list["models"].as_array().map_or(0, Vec::len))
    })
    .await
}
