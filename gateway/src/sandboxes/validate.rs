//! Checking what callers ask for: sizes, lifetimes, paths, environments, egress policies,
//! credentials and commands. Pure functions of the request and the settings.

use std::collections::BTreeMap;

use sandbase_api::sandboxes::{
    CreateSandboxRequest, EgressPolicy, Isolation, Mount, Resources, ResourcesRequest, TemplateName,
};

use crate::config::SandboxSettings;
use crate::error::{ApiError, ApiResult};

/// The checked, defaulted form of a create request.
pub struct NewSandbox {
    pub template: TemplateName,
    pub env: BTreeMap<String, String>,
    pub cwd: String,
    pub timeout_secs: u64,
    pub resources: Resources,
    pub metadata: BTreeMap<String, String>,
    pub mounts: Vec<Mount>,
    /// Spend cap, in micro-credits.
    pub max_credits: Option<i64>,
    /// Normalized egress policy; `None`: loopback only.
    pub egress: Option<EgressPolicy>,
    /// Vault credentials (names) for the egress proxy.
    pub credentials: Vec<String>,
    pub isolation: Isolation,
    /// Access to the store from inside (its variables are in `env`).
    pub store: bool,
    /// Seconds without a call after which it pauses by itself.
    pub auto_pause_after_idle_secs: Option<u64>,
    /// The snapshot it starts from (found by the caller: `parse` sees only its id).
    pub snapshot: Option<super::row::SnapshotRow>,
}

/// Checks an egress policy and returns it normalized (lowercase, `*.` and ports explicit).
pub fn normalize_egress(policy: &EgressPolicy) -> ApiResult<EgressPolicy> {
    let normalize = |field: &str, patterns: &[String]| {
        if patterns.is_empty() {
            return Ok(Vec::new());
        }
        sandbase_egress::parse_patterns(field, patterns, 256).map_err(ApiError::InvalidRequest)
    };
    Ok(EgressPolicy {
        allow: normalize("egress.allow", &policy.allow)?,
        deny: normalize("egress.deny", &policy.deny)?,
    })
}

/// A spend cap given in credits: positive, at most six decimals.
pub fn parse_cap(field: &str, value: Option<&str>) -> ApiResult<Option<i64>> {
    let Some(value) = value else { return Ok(None) };
    match sandbase_billing::Credits::parse(value) {
        Some(credits) if credits.0 > 0 => Ok(Some(credits.0)),
        _ => Err(ApiError::InvalidRequest(format!(
            "`{field}` must be a positive amount of credits with at most 6 decimals, e.g. \"2.5\""
        ))),
    }
}

impl NewSandbox {
    /// Checks a create request and fills in the defaults; nothing is looked up.
    pub fn parse(
        request: CreateSandboxRequest,
        settings: &SandboxSettings,
    ) -> ApiResult<NewSandbox> {
        let template = match &request.template {
            Some(name) => TemplateName::parse(name),
            None => TemplateName::parse(&settings.default_template),
        }
        .map_err(|rule| ApiError::InvalidRequest(format!("`template`: {rule}")))?;
        validate_env(&request.env)?;
        let cwd = request.cwd.unwrap_or_else(|| "/work".to_owned());
        validate_absolute("cwd", &cwd)?;
        let timeout_secs = validate_timeout(request.timeout_secs, settings)?;
        let resources = validate_resources(request.resources, settings)?;
        if request.metadata.len() > 32
            || request.metadata.iter().any(|(key, value)| {
                key.is_empty() || key.chars().count() > 64 || value.chars().count() > 512
            })
        {
            return Err(ApiError::InvalidRequest(
                "`metadata`: at most 32 entries, keys of 1 to 64 characters, values up to 512"
                    .to_owned(),
            ));
        }
        if request.mounts.len() > 16 {
            return Err(ApiError::InvalidRequest("`mounts`: at most 16".to_owned()));
        }
        for mount in &request.mounts {
            if mount.volume.is_empty() || mount.volume.chars().count() > 64 {
                return Err(ApiError::InvalidRequest(
                    "`mounts[].volume`: 1 to 64 characters".to_owned(),
                ));
            }
            validate_absolute("mounts[].path", &mount.path)?;
        }
        let max_credits = parse_cap("max_credits", request.max_credits.as_deref())?;
        let egress = match request.egress {
            Some(policy) if !policy.allow.is_empty() => Some(normalize_egress(&policy)?),
            // The store is reached through the node's proxy: a link that allows nothing else.
            _ if request.store => Some(EgressPolicy::default()),
            _ => None,
        };
        let mut env = request.env;
        if request.store {
            with_store_env(&mut env);
        }
        let mut credentials = request.credentials;
        credentials.sort();
        credentials.dedup();
        if credentials.len() > 32 {
            return Err(ApiError::InvalidRequest(
                "`credentials`: at most 32".to_owned(),
            ));
        }
        for name in &credentials {
            crate::secrets::validate_name(name)?;
        }
        if !credentials.is_empty() && egress.is_none() {
            return Err(ApiError::CredentialsNeedEgress);
        }
        let isolation = request
            .isolation
            .or_else(|| settings.template_isolation.get(template.as_str()).copied())
            .unwrap_or(settings.default_isolation);
        Ok(NewSandbox {
            snapshot: None,
            auto_pause_after_idle_secs: validate_auto_pause(request.auto_pause_after_idle_secs)?,
            isolation,
            template,
            env,
            cwd,
            timeout_secs,
            resources,
            metadata: request.metadata,
            mounts: request.mounts,
            max_credits,
            egress,
            credentials,
            store: request.store,
        })
    }
}

/// The variables of a sandbox with store access (those the caller set are kept): the
/// official SDKs read their base URLs and keys from them. The keys are placeholders; the
/// node's proxy puts the sandbox's store credential in their place.
pub fn with_store_env(env: &mut BTreeMap<String, String>) {
    let url = format!("http://{}", sandbase_egress::STORE_HOST);
    for (name, value) in [
        ("SANDBASE_STORE_URL", url.clone()),
        ("OPENAI_BASE_URL", format!("{url}/openai/v1")),
        ("ANTHROPIC_BASE_URL", format!("{url}/anthropic")),
        ("OPENAI_API_KEY", STORE_PLACEHOLDER.to_owned()),
        ("ANTHROPIC_API_KEY", STORE_PLACEHOLDER.to_owned()),
    ] {
        env.entry(name.to_owned()).or_insert(value);
    }
}

/// What the SDKs in a sandbox with store access send as their key (the proxy replaces it).
pub const STORE_PLACEHOLDER: &str = "sandbase-store-placeholder";

/// `auto_pause_after_idle_secs`: from a second to a day.
fn validate_auto_pause(seconds: Option<u64>) -> ApiResult<Option<u64>> {
    match seconds {
        Some(seconds) if !(1..=86_400).contains(&seconds) => Err(ApiError::InvalidRequest(
            "`auto_pause_after_idle_secs`: from 1 to 86400".to_owned(),
        )),
        other => Ok(other),
    }
}

/// The argument list of a command given as `cmd` (a list) or `command` (a shell line).
pub fn command_argv(cmd: Option<Vec<String>>, command: Option<String>) -> ApiResult<Vec<String>> {
    let argv = match (cmd, command) {
        (Some(cmd), None) if !cmd.is_empty() && !cmd[0].is_empty() => cmd,
        (None, Some(command)) if !command.trim().is_empty() => {
            vec!["/bin/sh".to_owned(), "-c".to_owned(), command]
        }
        _ => {
            return Err(ApiError::InvalidRequest(
                "give exactly one of `cmd` (a non-empty argument list) or `command` (a shell command line)"
                    .to_owned(),
            ));
        }
    };
    if argv.iter().any(|argument| argument.contains('\0')) {
        return Err(ApiError::InvalidRequest(
            "command arguments cannot contain NUL bytes".to_owned(),
        ));
    }
    Ok(argv)
}

/// A shell session's name and what may come with it.
pub fn session(name: &str, request: &sandbase_api::sandboxes::ExecRequest) -> ApiResult<()> {
    let plain = name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    if name.is_empty() || name.len() > 64 || !plain {
        return Err(ApiError::InvalidRequest(
            "`session`: 1 to 64 letters, digits, `-`, `_` or `.`".to_owned(),
        ));
    }
    if request.background || request.stdin.is_some() {
        return Err(ApiError::InvalidRequest(
            "a `session` command takes no `stdin` and does not run in the `background`".to_owned(),
        ));
    }
    Ok(())
}

/// A command's `exec_id`: 1 to 128 letters, digits, `.`, `_`, `:` or `-`; not with
/// `background`.
pub fn exec_id(id: &str, request: &sandbase_api::sandboxes::ExecRequest) -> ApiResult<()> {
    if !sandbase_api::execs::valid_exec_id(id) {
        return Err(ApiError::InvalidRequest(
            "`exec_id`: 1 to 128 letters, digits, `.`, `_`, `:` or `-`".to_owned(),
        ));
    }
    if request.background {
        return Err(ApiError::InvalidRequest(
            "a command with an `exec_id` is followed with GET …/execs/{exec_id}: not with `background`"
                .to_owned(),
        ));
    }
    Ok(())
}

pub fn validate_env(env: &BTreeMap<String, String>) -> ApiResult<()> {
    if env.len() > 256 {
        return Err(ApiError::InvalidRequest(
            "`env`: at most 256 variables".to_owned(),
        ));
    }
    for (key, value) in env {
        if key.is_empty() || key.contains('=') || key.contains('\0') || value.contains('\0') {
            return Err(ApiError::InvalidRequest(format!(
                "`env`: `{}` is not a valid variable (non-empty name without `=`, no NUL bytes)",
                key.replace('\0', "\\0")
            )));
        }
    }
    Ok(())
}

pub fn validate_absolute(field: &str, path: &str) -> ApiResult<()> {
    if !path.starts_with('/') || path.contains('\0') || path.len() > 4096 {
        return Err(ApiError::InvalidRequest(format!(
            "`{field}` must be an absolute path"
        )));
    }
    Ok(())
}

pub fn validate_timeout(requested: Option<u64>, settings: &SandboxSettings) -> ApiResult<u64> {
    let timeout = requested.unwrap_or(settings.default_timeout_secs);
    if timeout == 0 || timeout > settings.max_timeout_secs {
        return Err(ApiError::InvalidRequest(format!(
            "`timeout_secs` must be between 1 and {}",
            settings.max_timeout_secs
        )));
    }
    Ok(timeout)
}

/// The least memory a sandbox may ask for: its agent and a shell start in it (at 16 MiB the
/// agent was seen dying while the sandbox started).
pub const MIN_MEMORY_MB: u32 = 64;
/// The fewest processes and threads a sandbox may ask for: the agent's own threads count in
/// the limit (at 8 the kernel refused the agent's forks while the sandbox started: the
/// OpenAPI fuzzer with a worker found 502s).
pub const MIN_PIDS: u32 = 32;

pub fn validate_resources(
    requested: ResourcesRequest,
    settings: &SandboxSettings,
) -> ApiResult<Resources> {
    let (default, max) = (settings.default_resources, settings.max_resources);
    let cpu_millis = match requested.cpu {
        None => default.cpu_millis,
        Some(cpu) if cpu.is_finite() && cpu >= 0.01 => (cpu * 1000.0).round() as u32,
        Some(_) => {
            return Err(ApiError::InvalidRequest(
                "`resources.cpu` must be at least 0.01".to_owned(),
            ));
        }
    };
    let resources = Resources {
        cpu_millis,
        memory_mb: requested.memory_mb.unwrap_or(default.memory_mb),
        disk_mb: requested.disk_mb.unwrap_or(default.disk_mb),
        pids: requested.pids.unwrap_or(default.pids),
    };
    let checks = [
        ("cpu", cpu_millis, 10, max.cpu_millis, 1000.0),
        (
            "memory_mb",
            resources.memory_mb,
            MIN_MEMORY_MB,
            max.memory_mb,
            1.0,
        ),
        ("disk_mb", resources.disk_mb, 16, max.disk_mb, 1.0),
        ("pids", resources.pids, MIN_PIDS, max.pids, 1.0),
    ];
    for (name, value, min, max, unit) in checks {
        if value < min || value > max {
            return Err(ApiError::InvalidRequest(format!(
                "`resources.{name}` must be between {} and {}",
                f64::from(min) / unit,
                f64::from(max) / unit
            )));
        }
    }
    Ok(resources)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> SandboxSettings {
        crate::config::Settings::default().sandboxes
    }

    fn parse(request: serde_json::Value) -> ApiResult<NewSandbox> {
        NewSandbox::parse(serde_json::from_value(request).unwrap(), &settings())
    }

    fn refused(request: serde_json::Value) -> String {
        match parse(request.clone()) {
            Ok(_) => panic!("accepted: {request}"),
            Err(error) => format!("{} {}", error.code(), error),
        }
    }

    #[test]
    fn an_empty_request_gets_every_default() {
        let sandbox = parse(serde_json::json!({})).unwrap();
        let defaults = settings();
        assert_eq!(sandbox.template.as_str(), defaults.default_template);
        assert_eq!(sandbox.cwd, "/work");
        assert_eq!(sandbox.timeout_secs, defaults.default_timeout_secs);
        let expected = defaults.default_resources;
        assert_eq!(
            (
                sandbox.resources.cpu_millis,
                sandbox.resources.memory_mb,
                sandbox.resources.disk_mb,
                sandbox.resources.pids
            ),
            (
                expected.cpu_millis,
                expected.memory_mb,
                expected.disk_mb,
                expected.pids
            )
        );
        assert!(sandbox.egress.is_none() && sandbox.credentials.is_empty());
    }

    #[test]
    fn bad_fields_are_refused_by_name() {
        let cases = [
            (
                serde_json::json!({ "template": "Not/A:Name" }),
                "`template`",
            ),
            (serde_json::json!({ "cwd": "relative" }), "`cwd`"),
            (serde_json::json!({ "timeout_secs": 0 }), "`timeout_secs`"),
            (
                serde_json::json!({ "resources": { "cpu": 0.001 } }),
                "`resources.cpu`",
            ),
            (
                serde_json::json!({ "resources": { "memory_mb": 1 } }),
                "`resources.memory_mb`",
            ),
            (
                serde_json::json!({ "resources": { "pids": 100000000 } }),
                "`resources.pids`",
            ),
            (serde_json::json!({ "env": { "A=B": "x" } }), "`env`"),
            (
                serde_json::json!({ "mounts": [{ "volume": "", "path": "/data" }] }),
                "`mounts[].volume`",
            ),
            (serde_json::json!({ "max_credits": "-1" }), "`max_credits`"),
            (
                serde_json::json!({ "egress": { "allow": ["10.0.0.1"] } }),
                "",
            ),
            (serde_json::json!({ "credentials": ["bad name"] }), "`name`"),
        ];
        for (request, field) in cases {
            let message = refused(request);
            assert!(message.starts_with("invalid_request"), "{message}");
            assert!(message.contains(field), "{field}: {message}");
        }
    }

    #[test]
    fn credentials_need_an_egress_policy() {
        let message = refused(serde_json::json!({ "credentials": ["github"] }));
        assert!(message.starts_with("credentials_need_egress"), "{message}");
        let sandbox = parse(serde_json::json!({
            "credentials": ["github", "github"],
            "egress": { "allow": ["API.github.com"] }
        }))
        .unwrap();
        assert_eq!(sandbox.credentials, ["github"]);
        let allow = sandbox.egress.unwrap().allow;
        assert!(
            !allow.is_empty()
                && allow
                    .iter()
                    .all(|pattern| pattern.starts_with("api.github.com")),
            "{allow:?}"
        );
    }

    #[test]
    fn commands_are_one_list_or_one_line() {
        assert_eq!(
            command_argv(None, Some("echo hi".to_owned())).unwrap(),
            ["/bin/sh", "-c", "echo hi"]
        );
        assert_eq!(
            command_argv(Some(vec!["ls".to_owned()]), None).unwrap(),
            ["ls"]
        );
        assert!(command_argv(None, None).is_err());
        assert!(command_argv(Some(vec!["ls".to_owned()]), Some("ls".to_owned())).is_err());
        assert!(command_argv(Some(vec![String::new()]), None).is_err());
        assert!(command_argv(Some(vec!["a\0b".to_owned()]), None).is_err());
    }
}
