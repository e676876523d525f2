//! Rules of the API's input that a type's derived schema cannot say, written into the OpenAPI
//! document so that a request the document allows is one the server accepts: a command is
//! exactly one of `cmd` and `command`; a key's expiry is not given twice; host patterns have
//! the egress policy's syntax; the team's default egress allows something; timeouts are
//! bounded by this deployment's configuration. Each mirrors the server's own check
//! (`sandboxes::validate::command_argv`, `keys`, `sandbase_egress::policy::HostPattern`,
//! `sandboxes::validate::validate_timeout`, `runs::submit`).
//!
//! Rules across fields are written with `if`/`then`/`else` and `not` only, which validators
//! and fuzzers read and type generators leave alone (a `oneOf` of field sets would turn the
//! SDKs' request types into intersections no value satisfies).

use serde_json::{Map, Value, json};

use crate::config::Settings;
use crate::sandboxes::validate;

/// `api.example.com`, `*.example.com`, optionally `:PORT` (1–65535); letters in either case
/// (the server lowercases); the name at most 253 characters, each label 63; not an IP
/// address (the last label is not all digits).
pub const HOST_PATTERN: &str = concat!(
    r"^(?=(\*\.)?[^:*]{1,253}(:[0-9]+)?$)",
    r"(\*\.)?",
    r"([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+",
    r"(?![0-9]+(:|$))[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?",
    r"(:([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5]))?$"
);

/// Writes the rules into `document`'s schemas.
pub fn document(document: &mut Value, settings: &Settings) {
    if let Some(schemas) = document
        .pointer_mut("/components/schemas")
        .and_then(Value::as_object_mut)
    {
        cross_field(schemas);
        configured(schemas, settings);
        fields(schemas);
        agent_runs(schemas);
    }
    // The team's default egress policy allows at least one host (DELETE clears it).
    if let Some(body) =
        document.pointer_mut("/paths/~1v1~1egress-policy/put/requestBody/content/application~1json")
    {
        body["schema"] = json!({
            "$ref": "#/components/schemas/EgressPolicy",
            "required": ["allow"],
            "properties": { "allow": { "minItems": 1 } }
        });
    }
    // An Idempotency-Key is 1 to 255 visible ASCII characters (`agent_runs::idempotency_key`).
    for path in ["/v1/agent-runs", "/v1/agent-runs/{id}/inputs"] {
        let pointer = format!("/paths/{}/post/parameters", path.replace('/', "~1"));
        if let Some(parameters) = document.pointer_mut(&pointer).and_then(Value::as_array_mut) {
            for parameter in parameters
                .iter_mut()
                .filter(|p| p["name"] == "Idempotency-Key")
            {
                parameter["schema"]["pattern"] = json!("^[!-~]{1,255}$");
            }
        }
    }
    // A secret's name in its path has the name's syntax (`secrets::validate_name`).
    for method in ["put", "delete"] {
        if let Some(parameters) = document
            .pointer_mut(&format!(
                "/paths/~1v1~1secrets~1{{name}}/{method}/parameters"
            ))
            .and_then(Value::as_array_mut)
        {
            for parameter in parameters.iter_mut().filter(|p| p["name"] == "name") {
                parameter["schema"]["pattern"] = json!(SECRET_NAME);
            }
        }
    }
}

/// No control character (Unicode's `Cc`: what `char::is_control` refuses).
const NO_CONTROL: &str = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$";

/// A present, non-null `field`.
fn given(field: &str) -> Value {
    json!({ "required": [field], "properties": { field: { "not": { "type": "null" } } } })
}

/// `fields` absent or null.
fn none_of(fields: &[&str]) -> Value {
    let properties: Map<String, Value> = fields
        .iter()
        .map(|field| ((*field).to_owned(), json!({ "type": "null" })))
        .collect();
    json!({ "properties": properties })
}

/// A secret's injection: exactly one mode, each with its field's syntax; its value.
fn injection(schemas: &mut Map<String, Value>) {
    let either_case = |word: &str| {
        word.chars()
            .map(|c| match c.is_ascii_alphabetic() {
                true => format!("[{}{}]", c.to_ascii_lowercase(), c.to_ascii_uppercase()),
                false => c.to_string(),
            })
            .collect::<String>()
    };
    let forbidden: Vec<String> = crate::secrets::FORBIDDEN_HEADERS
        .iter()
        .map(|h| either_case(h))
        .collect();
    if let Some(schema) = schemas.get_mut("Injection") {
        let properties = &mut schema["properties"];
        properties["header"]["pattern"] = json!("^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,128}$");
        properties["header"]["not"] = json!({ "pattern": format!("^({})$", forbidden.join("|")) });
        properties["format"]["maxLength"] = json!(512);
        properties["format"]["pattern"] = json!(
            "^[^\\u0000-\\u001f\\u007f-\\u009f]*\\{value\\}[^\\u0000-\\u001f\\u007f-\\u009f]*$"
        );
        properties["query"]["pattern"] = json!("^[A-Za-z0-9_.-]{1,128}$");
        // Exactly one of header (with its format), basic, query, placeholder.
        schema["if"] = given("header");
        schema["then"] = none_of(&["basic", "query", "placeholder"]);
        schema["else"] = json!({
            "if": given("basic"),
            "then": none_of(&["query", "placeholder", "format"]),
            "else": {
                "if": given("query"),
                "then": none_of(&["placeholder", "format"]),
                "else": {
                    "required": ["placeholder"],
                    "properties": { "placeholder": { "not": { "type": "null" } },
                                    "format": { "type": "null" } }
                }
            }
        });
    }
    if let Some(username) = schemas
        .get_mut("BasicAuth")
        .and_then(|schema| schema.pointer_mut("/properties/username"))
    {
        username["pattern"] = json!("^[^:\\u0000-\\u001f\\u007f-\\u009f]{1,256}$");
    }
    for name in ["CreateSecretRequest", "UpdateSecretRequest"] {
        if let Some(value) = schemas
            .get_mut(name)
            .and_then(|schema| schema.pointer_mut("/properties/value"))
        {
            // 64 KiB of UTF-8 at most: as many characters when they are ASCII.
            value["minLength"] = json!(1);
            value["maxLength"] = json!(65_536);
            value["pattern"] = json!(NO_CONTROL);
        }
    }
}

/// An environment variable's name (`secrets::validate_placeholder`).
const ENV_NAME: &str = "^[A-Za-z_][A-Za-z0-9_]{0,127}$";

/// A placeholder: the variable's name, or the name with where else it is swapped (paths
/// exactly when a body or URL swap is asked for).
fn placeholder(schemas: &mut Map<String, Value>) {
    if let Some(name) = schemas
        .get_mut("Placeholder")
        .and_then(|schema| schema.pointer_mut("/oneOf/0"))
    {
        name["pattern"] = json!(ENV_NAME);
    }
    if let Some(options) = schemas.get_mut("PlaceholderOptions") {
        options["properties"]["env"]["pattern"] = json!(ENV_NAME);
        options["properties"]["paths"]["maxItems"] = json!(MAX_PLACEHOLDER_PATHS);
        options["properties"]["paths"]["items"]["pattern"] =
            json!("^/[^*\\s\\u0000-\\u001f\\u007f-\\u009f]{0,254}\\*?$");
        // Paths exactly when a body or URL swap is asked for.
        let flag =
            |flag: &str| json!({ "required": [flag], "properties": { flag: { "const": true } } });
        let swaps = json!({ "anyOf": [flag("in_body"), flag("in_url")] });
        let paths = json!({ "required": ["paths"], "properties": { "paths": { "minItems": 1 } } });
        options["not"] = json!({ "anyOf": [
            { "allOf": [swaps, { "not": paths }] },
            { "allOf": [{ "not": swaps }, paths] }
        ] });
    }
}

/// Most paths of a placeholder (`secrets::MAX_PLACEHOLDER_PATHS`).
const MAX_PLACEHOLDER_PATHS: usize = crate::secrets::MAX_PLACEHOLDER_PATHS;

/// A secret's name (`secrets::validate_name`).
const SECRET_NAME: &str = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$";

/// A credit amount as `sandbase_billing::Credits::parse` reads it, and positive.
const POSITIVE_CREDITS: &str = "^\\s*(?=[0-9.]*[1-9])[0-9]{0,12}(\\.[0-9]{0,6})?\\s*$";

/// Rules across fields: one command, one expiry; and host patterns.
fn cross_field(schemas: &mut Map<String, Value>) {
    injection(schemas);
    placeholder(schemas);
    for name in ["CreateApiKeyRequest", "CreateSandboxRequest"] {
        if let Some(cap) = schemas
            .get_mut(name)
            .and_then(|schema| schema.pointer_mut("/properties/max_credits"))
        {
            cap["pattern"] = json!(POSITIVE_CREDITS);
        }
    }
    if let Some(exec) = schemas.get_mut("ExecRequest") {
        // `sandboxes::validate::session`: a session's command takes no stdin and does not
        // run in the background.
        exec["properties"]["session"]["pattern"] = json!("^[A-Za-z0-9_.-]{1,64}$");
        exec["properties"]["exec_id"]["pattern"] = json!(sandbase_api::execs::EXEC_ID_PATTERN);
        // `sandboxes::validate`: a streamed or named command is not a background one.
        exec["allOf"] = json!([{ "not": {
            "required": ["background"],
            "properties": { "background": { "const": true } },
            "anyOf": [
                { "required": ["stream"], "properties": { "stream": { "const": true } } },
                { "required": ["exec_id"], "properties": { "exec_id": { "type": "string" } } }
            ]
        } }]);
        exec["not"] = json!({
            "required": ["session"],
            "properties": { "session": { "type": "string" } },
            "anyOf": [
                { "required": ["background"], "properties": { "background": { "const": true } } },
                { "required": ["stdin"], "properties": { "stdin": { "type": "string" } } }
            ]
        });
    }
    for name in ["CreateSandboxRequest", "CreateRunRequest"] {
        if let Some(schema) = schemas.get_mut(name) {
            schema["properties"]["credentials"]["items"]["pattern"] = json!(SECRET_NAME);
            // Credentials ride on egress (`credentials_need_egress`).
            schema["not"] = json!({
                "required": ["credentials"],
                "properties": { "credentials": { "minItems": 1 } },
                "not": { "required": ["egress"], "properties": { "egress": {
                    "type": "object", "required": ["allow"],
                    "properties": { "allow": { "minItems": 1 } } } } }
            });
        }
    }
    if let Some(metadata) = schemas
        .get_mut("CreateSandboxRequest")
        .and_then(|schema| schema.pointer_mut("/properties/metadata"))
    {
        // `sandboxes::validate`: 32 entries, keys of 1 to 64 characters, values up to 512.
        metadata["maxProperties"] = json!(32);
        metadata["propertyNames"] = json!({ "type": "string", "minLength": 1, "maxLength": 64 });
        metadata["additionalProperties"] = json!({ "type": "string", "maxLength": 512 });
    }
    if let Some(hosts) = schemas
        .get_mut("UpdateSecretRequest")
        .and_then(|schema| schema.pointer_mut("/properties/hosts"))
    {
        hosts["minItems"] = json!(1);
        hosts["maxItems"] = json!(crate::secrets::MAX_HOSTS);
    }
    for name in ["ExecRequest", "CreateRunRequest"] {
        if let Some(schema) = schemas.get_mut(name) {
            one_command(schema);
        }
    }
    if let Some(schema) = schemas.get_mut("CreateApiKeyRequest") {
        schema["not"] = json!({
            "required": ["expires_at", "expires_in_secs"],
            "properties": {
                "expires_at": { "not": { "type": "null" } },
                "expires_in_secs": { "not": { "type": "null" } }
            }
        });
    }
    for (name, field) in [
        ("EgressPolicy", "allow"),
        ("EgressPolicy", "deny"),
        ("CreateSecretRequest", "hosts"),
        ("UpdateSecretRequest", "hosts"),
    ] {
        if let Some(items) = schemas
            .get_mut(name)
            .and_then(|schema| schema.pointer_mut(&format!("/properties/{field}/items")))
        {
            items["pattern"] = json!(HOST_PATTERN);
        }
    }
}

/// Bounds this deployment configures: timeouts and resources.
fn configured(schemas: &mut Map<String, Value>, settings: &Settings) {
    let max_timeout = settings.sandboxes.max_timeout_secs;
    if let Some(idle) = schemas
        .get_mut("CreateSandboxRequest")
        .and_then(|schema| schema.pointer_mut("/properties/auto_pause_after_idle_secs"))
    {
        idle["minimum"] = json!(1);
        idle["maximum"] = json!(86_400);
    }
    let bounds = [
        ("ExecRequest", crate::runs::submit::MAX_COMMAND_TIMEOUT_SECS),
        ("RunCodeRequest", 86_400),
        ("CreateSandboxRequest", max_timeout),
        ("ExtendTimeoutRequest", max_timeout),
        (
            "CreateRunRequest",
            max_timeout.min(crate::runs::submit::MAX_COMMAND_TIMEOUT_SECS),
        ),
    ];
    for (name, maximum) in bounds {
        if let Some(timeout) = schemas
            .get_mut(name)
            .and_then(|schema| schema.pointer_mut("/properties/timeout_secs"))
        {
            timeout["minimum"] = json!(1);
            timeout["maximum"] = json!(maximum);
        }
    }
    // `sandboxes::validate::validate_resources`.
    let max = settings.sandboxes.max_resources;
    if let Some(properties) = schemas
        .get_mut("ResourcesRequest")
        .and_then(|schema| schema.get_mut("properties"))
    {
        properties["cpu"]["minimum"] = json!(0.01);
        properties["cpu"]["maximum"] = json!(f64::from(max.cpu_millis) / 1000.0);
        for (field, minimum, maximum) in [
            ("memory_mb", validate::MIN_MEMORY_MB, max.memory_mb),
            ("disk_mb", 16, max.disk_mb),
            ("pids", validate::MIN_PIDS, max.pids),
        ] {
            properties[field]["minimum"] = json!(minimum);
            properties[field]["maximum"] = json!(maximum);
        }
    }
}

/// A template's name (`sandbase_api::sandboxes::TemplateName::parse`).
const TEMPLATE_NAME: &str = "^[a-z0-9_-][a-z0-9._-]{0,63}$";

/// An absolute path (`sandboxes::validate::validate_absolute`).
const ABSOLUTE_PATH: &str = "^/[^\\u0000]{0,4095}$";

/// A key's `allowed_models` patterns, a signal, a terminal's size, names and paths.
fn fields(schemas: &mut Map<String, Value>) {
    if let Some(mount) = schemas.get_mut("Mount") {
        mount["properties"]["volume"]["minLength"] = json!(1);
        mount["properties"]["volume"]["maxLength"] = json!(64);
    }
    if let Some(mounts) = schemas
        .get_mut("CreateSandboxRequest")
        .and_then(|schema| schema.pointer_mut("/properties/mounts"))
    {
        mounts["maxItems"] = json!(16);
    }
    // `sandboxes::validate::validate_env`: 256 variables, names without `=`, no NUL.
    for name in [
        "CreateSandboxRequest",
        "ExecRequest",
        "CreateRunRequest",
        "OpenTerminalRequest",
        "CreateCodeContextRequest",
    ] {
        if let Some(env) = schemas
            .get_mut(name)
            .and_then(|schema| schema.pointer_mut("/properties/env"))
        {
            env["maxProperties"] = json!(256);
            env["propertyNames"] = json!({ "type": "string", "pattern": "^[^=\\u0000]+$" });
            env["additionalProperties"] = json!({ "type": "string", "pattern": "^[^\\u0000]*$" });
        }
    }
    for (name, field, pattern) in [
        ("CreateSandboxRequest", "template", TEMPLATE_NAME),
        ("CreateRunRequest", "template", TEMPLATE_NAME),
        ("CreateSandboxRequest", "cwd", ABSOLUTE_PATH),
        ("ExecRequest", "cwd", ABSOLUTE_PATH),
        ("CreateRunRequest", "outputs", ABSOLUTE_PATH),
        ("Mount", "path", ABSOLUTE_PATH),
        ("OpenTerminalRequest", "cwd", ABSOLUTE_PATH),
        ("CreateCodeContextRequest", "cwd", ABSOLUTE_PATH),
        ("RunCodeRequest", "context", "^[A-Za-z0-9._-]{1,64}$"),
        ("RunCodeRequest", "code", "^[^\\u0000]*$"),
    ] {
        if let Some(property) = schemas
            .get_mut(name)
            .and_then(|schema| schema.pointer_mut(&format!("/properties/{field}")))
        {
            property["pattern"] = json!(pattern);
        }
    }
    // `http::api::code`: at most a million characters of code.
    if let Some(code) = schemas
        .get_mut("RunCodeRequest")
        .and_then(|schema| schema.pointer_mut("/properties/code"))
    {
        code["maxLength"] = json!(1 << 20);
    }
    if let Some(items) = schemas
        .get_mut("CreateApiKeyRequest")
        .and_then(|schema| schema.pointer_mut("/properties/allowed_models/items"))
    {
        // `store::allowed::validate`: 1 to 128 printable ASCII characters, no space.
        items["pattern"] = json!("^[!-~]{1,128}$");
    }
    if let Some(signal) = schemas
        .get_mut("SignalRequest")
        .and_then(|schema| schema.pointer_mut("/properties/signal"))
    {
        signal["oneOf"] = json!([
            { "type": "integer", "minimum": 1, "maximum": 64 },
            { "type": "string",
              "pattern": "^(SIG)?(HUP|INT|QUIT|KILL|USR1|USR2|TERM|CONT|STOP|TSTP|WINCH)$" }
        ]);
    }
    if let Some(files) = schemas
        .get_mut("RunInputs")
        .and_then(|schema| schema.pointer_mut("/properties/files"))
    {
        // `runs::submit`: a relative path inside /work/in, no `..` or empty part.
        let part = "(?!\\.\\.(?:/|$))[^/\\u0000]+";
        files["propertyNames"] = json!({ "type": "string",
                                         "pattern": format!("^(?!/){part}(?:/{part})*$") });
    }
    if let Some(items) = schemas
        .get_mut("OpenTerminalRequest")
        .and_then(|schema| schema.pointer_mut("/properties/cmd/items"))
    {
        items["pattern"] = json!("^[^\\u0000]*$");
    }
    // The worker's check: 1 to 1000 columns and rows.
    for name in ["OpenTerminalRequest", "ResizeRequest"] {
        for field in ["cols", "rows"] {
            if let Some(size) = schemas
                .get_mut(name)
                .and_then(|schema| schema.pointer_mut(&format!("/properties/{field}")))
            {
                size["minimum"] = json!(1);
                size["maximum"] = json!(1000);
            }
        }
    }
}

/// Exactly one of `cmd` (a list whose program is named) and `command` (a line with more
/// than blanks), neither holding a NUL byte.
fn one_command(schema: &mut Value) {
    if let Some(items) = schema.pointer_mut("/properties/cmd/items") {
        *items = json!({ "type": "string", "pattern": "^[^\\u0000]*$" });
    }
    if let Some(command) = schema.pointer_mut("/properties/command") {
        command["pattern"] = json!("^[^\\u0000]*$");
    }
    schema["if"] = given("cmd");
    schema["then"] = json!({ "properties": {
        "cmd": { "minItems": 1, "prefixItems": [{ "type": "string", "minLength": 1 }] },
        "command": { "type": "null" }
    } });
    schema["else"] = json!({
        "required": ["command"],
        "properties": { "command": { "type": "string", "pattern": "\\S" } }
    });
}

/// An agent run's texts hold no NUL (PostgreSQL keeps none: `harness::create`), its
/// metadata has the bounds `harness::create` checks, its credit cap is a positive amount.
fn agent_runs(schemas: &mut Map<String, Value>) {
    for name in [
        "CreateAgentRunRequest",
        "AgentInput",
        "InputMessage",
        "AgentTool",
        "AgentRunInput",
        "AgentLimits",
        "ApprovalRule",
    ] {
        if let Some(schema) = schemas.get_mut(name) {
            no_nul(schema);
        }
    }
    if let Some(metadata) = schemas
        .get_mut("CreateAgentRunRequest")
        .and_then(|schema| schema.pointer_mut("/properties/metadata"))
    {
        metadata["maxProperties"] = json!(16);
        metadata["propertyNames"] = json!({ "type": "string", "maxLength": 64 });
        metadata["additionalProperties"] = json!({ "type": "string", "maxLength": 512 });
    }
    // Their variants take no other field (serde's `deny_unknown_fields`).
    for name in ["AgentRunInput", "AgentTool"] {
        if let Some(variants) = schemas
            .get_mut(name)
            .and_then(|schema| schema.get_mut("oneOf"))
            .and_then(Value::as_array_mut)
        {
            for variant in variants {
                variant["additionalProperties"] = json!(false);
            }
        }
    }
    // `harness::inputs::cancel`: a call id with the `tool` scope, and only with it.
    if let Some(cancel) = schemas.get_mut("CancelAgentRunRequest") {
        cancel["if"] =
            json!({ "required": ["scope"], "properties": { "scope": { "const": "tool" } } });
        cancel["then"] = given("call_id");
        cancel["else"] = none_of(&["call_id"]);
    }
    if let Some(cap) = schemas
        .get_mut("AgentLimits")
        .and_then(|schema| schema.pointer_mut("/properties/max_credits"))
    {
        cap["pattern"] = json!(POSITIVE_CREDITS);
    }
}

/// Every string of `schema` without a pattern gets one refusing NUL.
fn no_nul(schema: &mut Value) {
    match schema {
        Value::Object(object) => {
            let is_string = object.get("type").is_some_and(|kind| {
                kind == "string"
                    || kind
                        .as_array()
                        .is_some_and(|kinds| kinds.contains(&json!("string")))
            });
            if is_string && !object.contains_key("pattern") && !object.contains_key("enum") {
                object.insert("pattern".to_owned(), json!("^[^\\u0000]*$"));
            }
            object.values_mut().for_each(no_nul);
        }
        Value::Array(items) => items.iter_mut().for_each(no_nul),
        _ => {}
    }
}
