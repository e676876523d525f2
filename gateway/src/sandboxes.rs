//! Sandboxes: placement on a worker, the sandbox → worker routing (PostgreSQL is the truth,
//! each gateway caches the routes of running sandboxes), calls to the worker's internal
//! API, and the reaper that stops expired sandboxes and those of silent workers.

use std::collections::{BTreeMap, HashMap};
use std::sync::RwLock;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use sandbase_api::ErrorBody;
use sandbase_api::internal::CreateSandbox;
use sandbase_api::sandboxes::{CreateSandboxRequest, Mount, Resources, Sandbox, SandboxState};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::auth::{Actor, Principal};
use crate::config::SandboxSettings;
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// Most cached routes per gateway; the cache is cleared when it is full.
const ROUTE_CACHE_CAPACITY: usize = 100_000;
/// How often the reaper looks for expired sandboxes and silent workers.
pub const REAPER_INTERVAL: Duration = Duration::from_secs(1);
/// A sandbox still `creating` after this long failed (its gateway died mid-create).
const CREATE_GIVE_UP_SECS: f64 = 120.0;

pub const SANDBOX_COLUMNS: &str = "id, template, state, stop_reason, cwd, cpu_millis, memory_mb, \
     disk_mb, pids, metadata, mounts, created_at, expires_at, stopped_at, spent_micro, max_credits, egress, credentials";

#[derive(sqlx::FromRow)]
pub struct SandboxRow {
    pub id: Uuid,
    pub template: String,
    pub state: String,
    pub stop_reason: Option<String>,
    pub cwd: String,
    pub cpu_millis: i32,
    pub memory_mb: i32,
    pub disk_mb: i32,
    pub pids: i32,
    pub metadata: sqlx::types::Json<BTreeMap<String, String>>,
    pub mounts: sqlx::types::Json<Vec<Mount>>,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub stopped_at: Option<DateTime<Utc>>,
    pub spent_micro: i64,
    pub max_credits: Option<i64>,
    pub egress: Option<sqlx::types::Json<sandbase_api::sandboxes::EgressPolicy>>,
    pub credentials: Vec<String>,
}

impl SandboxRow {
    pub fn to_api(&self) -> Sandbox {
        Sandbox {
            id: self.id,
            template: self.template.clone(),
            state: self.state.parse().unwrap_or(SandboxState::Stopped),
            stop_reason: self.stop_reason.clone(),
            cwd: self.cwd.clone(),
            resources: Resources {
                cpu_millis: self.cpu_millis as u32,
                memory_mb: self.memory_mb as u32,
                disk_mb: self.disk_mb as u32,
                pids: self.pids as u32,
            },
            metadata: self.metadata.0.clone(),
            mounts: self.mounts.0.clone(),
            created_at: self.created_at,
            expires_at: self.expires_at,
            stopped_at: self.stopped_at,
            spent_micro: self.spent_micro,
            max_credits_micro: self.max_credits,
            egress: self.egress.as_ref().map(|policy| policy.0.clone()),
            credentials: self.credentials.clone(),
        }
    }
}

/// Where each running sandbox lives, as far as this gateway has seen.
#[derive(Default)]
pub struct Routes {
    map: RwLock<HashMap<Uuid, (Uuid, String)>>,
}

impl Routes {
    fn get(&self, id: Uuid) -> Option<(Uuid, String)> {
        self.map
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&id)
            .cloned()
    }

    fn insert(&self, id: Uuid, team_id: Uuid, worker_id: String) {
        let mut map = self
            .map
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if map.len() >= ROUTE_CACHE_CAPACITY {
            map.clear();
        }
        map.insert(id, (team_id, worker_id));
    }

    pub fn forget(&self, id: Uuid) {
        self.map
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&id);
    }
}

/// The checked, defaulted form of a create request.
pub struct Placement {
    pub template: String,
    pub env: BTreeMap<String, String>,
    pub cwd: String,
    pub timeout_secs: u64,
    pub resources: Resources,
    pub metadata: BTreeMap<String, String>,
    pub mounts: Vec<Mount>,
    /// Spend cap, in micro-credits.
    pub max_credits: Option<i64>,
    /// Normalized egress policy; `None`: loopback only.
    pub egress: Option<sandbase_api::sandboxes::EgressPolicy>,
    /// Vault credentials (names) for the egress proxy.
    pub credentials: Vec<String>,
}

/// The team's default egress policy: what a sandbox or run that gives no `egress` gets.
pub async fn team_default_egress(
    state: &AppState,
    team_id: Uuid,
) -> ApiResult<Option<sandbase_api::sandboxes::EgressPolicy>> {
    let policy: Option<Option<sqlx::types::Json<sandbase_api::sandboxes::EgressPolicy>>> =
        sqlx::query_scalar("SELECT default_egress FROM teams WHERE id = $1")
            .bind(team_id)
            .fetch_optional(&state.db)
            .await?;
    Ok(policy.flatten().map(|policy| policy.0))
}

/// Checks an egress policy and returns it normalized (lowercase, `*.` and ports explicit).
pub fn normalize_egress(
    policy: &sandbase_api::sandboxes::EgressPolicy,
) -> ApiResult<sandbase_api::sandboxes::EgressPolicy> {
    let normalize = |field: &str, patterns: &[String]| {
        if patterns.is_empty() {
            return Ok(Vec::new());
        }
        sandbase_egress::parse_patterns(field, patterns, 256).map_err(ApiError::InvalidRequest)
    };
    Ok(sandbase_api::sandboxes::EgressPolicy {
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

pub fn validate_create(
    request: CreateSandboxRequest,
    settings: &SandboxSettings,
) -> ApiResult<Placement> {
    let template = request
        .template
        .unwrap_or_else(|| settings.default_template.clone());
    if template.is_empty()
        || template.len() > 128
        || !template
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':' | '/'))
    {
        return Err(ApiError::InvalidRequest(
            "`template`: 1 to 128 letters, digits, `-`, `_`, `.`, `:` or `/`".to_owned(),
        ));
    }
    validate_env(&request.env)?;
    let cwd = request.cwd.unwrap_or_else(|| "/work".to_owned());
    validate_absolute("cwd", &cwd)?;
    let timeout_secs = validate_timeout(request.timeout_secs, settings)?;
    let resources = validate_resources(request.resources, settings)?;
    if request.metadata.len() > 32
        || request
            .metadata
            .iter()
            .any(|(key, value)| key.is_empty() || key.len() > 64 || value.len() > 512)
    {
        return Err(ApiError::InvalidRequest(
            "`metadata`: at most 32 entries, keys of 1 to 64 bytes, values up to 512 bytes"
                .to_owned(),
        ));
    }
    if request.mounts.len() > 16 {
        return Err(ApiError::InvalidRequest("`mounts`: at most 16".to_owned()));
    }
    for mount in &request.mounts {
        if mount.volume.is_empty() || mount.volume.len() > 64 {
            return Err(ApiError::InvalidRequest(
                "`mounts[].volume`: 1 to 64 characters".to_owned(),
            ));
        }
        validate_absolute("mounts[].path", &mount.path)?;
    }
    let max_credits = parse_cap("max_credits", request.max_credits.as_deref())?;
    let egress = match request.egress {
        Some(policy) if !policy.allow.is_empty() => Some(normalize_egress(&policy)?),
        _ => None,
    };
    let mut credentials = request.credentials;
    credentials.sort();
    credentials.dedup();
    if credentials.len() > 32 {
        return Err(ApiError::InvalidRequest(
            "`credentials`: at most 32".to_owned(),
        ));
    }
    for name in &credentials {
        crate::routes::secrets::validate_name(name)?;
    }
    if !credentials.is_empty() && egress.is_none() {
        return Err(ApiError::problem(
            axum::http::StatusCode::UNPROCESSABLE_ENTITY,
            "credentials_need_egress",
            "credentials are added to requests leaving through the egress proxy: give `egress.allow` with their hosts",
        ));
    }
    Ok(Placement {
        template,
        env: request.env,
        cwd,
        timeout_secs,
        resources,
        metadata: request.metadata,
        mounts: request.mounts,
        max_credits,
        egress,
        credentials,
    })
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

pub fn validate_resources(
    requested: sandbase_api::sandboxes::ResourcesRequest,
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
        ("memory_mb", resources.memory_mb, 16, max.memory_mb, 1.0),
        ("disk_mb", resources.disk_mb, 16, max.disk_mb, 1.0),
        ("pids", resources.pids, 8, max.pids, 1.0),
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

/// Creates a sandbox: a row first (so nothing can exist on a worker without one), then the
/// best worker that has room; a worker that is full passes it to the next.
/// Who a sandbox belongs to and who made it.
#[derive(Debug, Clone, Copy)]
pub struct Owner {
    pub team_id: Uuid,
    pub api_key_id: Option<Uuid>,
    pub user_id: Option<Uuid>,
}

impl Owner {
    pub fn of(principal: &Principal) -> Owner {
        let (api_key_id, user_id) = match &principal.actor {
            Actor::ApiKey(record) => (Some(record.id), record.created_by),
            Actor::User { id } => (None, Some(*id)),
        };
        Owner {
            team_id: principal.team_id,
            api_key_id,
            user_id,
        }
    }
}

/// A sandbox just started, and where.
pub struct Created {
    pub row: SandboxRow,
    pub worker_url: String,
}

pub async fn create(
    state: &AppState,
    owner: Owner,
    audit: Option<(&crate::audit::RequestContext, &Principal)>,
    placement: Placement,
) -> ApiResult<Created> {
    // No worker or no template: refused before anything is reserved.
    state
        .workers
        .candidates_with(&placement.template, &placement.mounts)
        .await?;
    let id = Uuid::now_v7();
    // The first minute (or the sandbox's cap, when lower) is reserved before anything
    // starts, against the team's credits and the key's cap; refused when either is spent.
    let first_minute =
        crate::credits::price_per_second(placement.resources, &state.settings.billing) * 60;
    let first_minute = placement
        .max_credits
        .map_or(first_minute, |cap| first_minute.min(cap));
    if first_minute > 0 {
        let admitted = state
            .admission
            .reserve(
                &state.db,
                owner.team_id,
                owner.api_key_id,
                id,
                first_minute,
                60_000,
            )
            .await
            .map_err(|error| ApiError::Unavailable(format!("credit admission: {error:#}")))?;
        match admitted {
            crate::credits::Admitted::Yes => {}
            crate::credits::Admitted::InsufficientCredits => {
                return Err(ApiError::problem(
                    StatusCode::PAYMENT_REQUIRED,
                    "insufficient_credits",
                    "the team's credits do not cover this sandbox's first minute; buy credits or ask an admin",
                ));
            }
            crate::credits::Admitted::KeyCapReached => {
                return Err(ApiError::problem(
                    StatusCode::PAYMENT_REQUIRED,
                    "spend_cap_reached",
                    "this API key's spend cap (`max_credits`) does not cover this sandbox's first minute",
                ));
            }
        }
    }
    let created = place(state, owner, audit, placement, id).await;
    if created.is_err() && first_minute > 0 {
        let _ = state
            .admission
            .release(owner.team_id, owner.api_key_id, id, first_minute)
            .await;
    }
    created
}

async fn place(
    state: &AppState,
    owner: Owner,
    audit: Option<(&crate::audit::RequestContext, &Principal)>,
    placement: Placement,
    id: Uuid,
) -> ApiResult<Created> {
    let candidates = state
        .workers
        .candidates_with(&placement.template, &placement.mounts)
        .await?;
    let (api_key_id, user_id) = (owner.api_key_id, owner.user_id);
    let resources = placement.resources;
    // Decrypted only for the worker's request (unknown names refused before anything is
    // written), and wiped once it has been sent.
    let credentials =
        crate::routes::secrets::unseal_for_sandbox(state, owner.team_id, &placement.credentials)
            .await?;
    sqlx::query(
        "INSERT INTO sandboxes (id, team_id, api_key_id, user_id, template, state, worker_id, cwd, \
           cpu_millis, memory_mb, disk_mb, pids, metadata, expires_at, mounts, max_credits, egress, \
           credentials) \
         VALUES ($1, $2, $3, $4, $5, 'creating', NULL, $6, $7, $8, $9, $10, $11, \
           now() + make_interval(secs => $12), $13, $14, $15, $16)",
    )
    .bind(id)
    .bind(owner.team_id)
    .bind(api_key_id)
    .bind(user_id)
    .bind(&placement.template)
    .bind(&placement.cwd)
    .bind(resources.cpu_millis as i32)
    .bind(resources.memory_mb as i32)
    .bind(resources.disk_mb as i32)
    .bind(resources.pids as i32)
    .bind(sqlx::types::Json(&placement.metadata))
    .bind(placement.timeout_secs as f64)
    .bind(sqlx::types::Json(&placement.mounts))
    .bind(placement.max_credits)
    .bind(placement.egress.as_ref().map(sqlx::types::Json))
    .bind(&placement.credentials)
    .execute(&state.db)
    .await?;

    let mut request = CreateSandbox {
        id,
        template: placement.template.clone(),
        resources,
        env: placement.env,
        cwd: placement.cwd,
        mounts: placement.mounts,
        egress: placement.egress,
        credentials,
    };
    let placed = send_create(state, &mut request, candidates, owner, audit, resources).await;
    for credential in &mut request.credentials {
        zeroize::Zeroize::zeroize(&mut credential.value);
    }
    placed
}

async fn send_create(
    state: &AppState,
    request: &mut CreateSandbox,
    candidates: Vec<sandbase_api::internal::WorkerStatus>,
    owner: Owner,
    audit: Option<(&crate::audit::RequestContext, &Principal)>,
    resources: Resources,
) -> ApiResult<Created> {
    let id = request.id;
    let mut last_problem = None;
    for worker in candidates {
        sqlx::query("UPDATE sandboxes SET worker_id = $2 WHERE id = $1")
            .bind(id)
            .bind(&worker.id)
            .execute(&state.db)
            .await?;
        state.workers.placed(&worker.id);
        let answer = state
            .workers
            .request(
                reqwest::Method::POST,
                format!("{}/internal/v1/sandboxes", worker.url),
            )
            .timeout(Duration::from_secs(60))
            .json(&*request)
            .send()
            .await;
        match answer {
            Ok(answer) if answer.status().is_success() => {
                let mut transaction = state.db.begin().await?;
                let row: SandboxRow = sqlx::query_as(&format!(
                    "UPDATE sandboxes SET state = 'running' WHERE id = $1 AND state = 'creating' \
                     RETURNING {SANDBOX_COLUMNS}"
                ))
                .bind(id)
                .fetch_one(&mut *transaction)
                .await?;
                if let Some((context, principal)) = audit {
                    context
                        .record(
                            &mut transaction,
                            principal,
                            Some(format!("sandbox:{id}")),
                            serde_json::json!({
                                "template": row.template,
                                "worker": worker.id,
                                "resources": resources,
                            }),
                        )
                        .await?;
                }
                transaction.commit().await?;
                state.routes.insert(id, owner.team_id, worker.id);
                return Ok(Created {
                    row,
                    worker_url: worker.url,
                });
            }
            Ok(answer) => {
                let problem = worker_problem(answer).await;
                let full = matches!(
                    &problem,
                    ApiError::Problem {
                        code: "at_capacity",
                        ..
                    }
                );
                last_problem = Some(problem);
                if !full {
                    break;
                }
            }
            Err(error) => {
                tracing::warn!(worker = %worker.id, error = %error, "creating a sandbox on a worker failed");
                last_problem = Some(ApiError::problem(
                    StatusCode::BAD_GATEWAY,
                    "worker_unreachable",
                    "the worker did not answer",
                ));
                break;
            }
        }
    }
    // Nothing runs: the row is marked failed (a worker that did start it will be told to
    // remove it at its next heartbeat).
    sqlx::query(
        "UPDATE sandboxes SET state = 'stopped', stop_reason = 'failed', stopped_at = now() WHERE id = $1",
    )
    .bind(id)
    .execute(&state.db)
    .await?;
    Err(match last_problem {
        Some(ApiError::Problem {
            code: "at_capacity",
            ..
        })
        | None => ApiError::problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "no_capacity",
            "every worker with this template is full; retry later",
        ),
        Some(problem) => problem,
    })
}

/// A worker's error answer as an [`ApiError`] with the worker's code.
pub async fn worker_problem(answer: reqwest::Response) -> ApiError {
    let status = answer.status();
    let status = StatusCode::from_u16(status.as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    match answer.json::<ErrorBody>().await {
        Ok(body) => {
            if status == StatusCode::UNAUTHORIZED {
                tracing::error!("a worker refused this gateway's node token");
                return ApiError::problem(
                    StatusCode::BAD_GATEWAY,
                    "worker_error",
                    "the worker refused the gateway",
                );
            }
            let code = static_code(&body.error.code);
            let status = if code == "worker_error" {
                StatusCode::BAD_GATEWAY
            } else {
                status
            };
            ApiError::problem(status, code, body.error.message)
        }
        Err(_) => ApiError::problem(
            StatusCode::BAD_GATEWAY,
            "worker_error",
            "the worker answered with an error",
        ),
    }
}

/// The worker's error codes the public API passes on.
fn static_code(code: &str) -> &'static str {
    const PASSED_ON: &[&str] = &[
        "sandbox_not_found",
        "process_not_found",
        "at_capacity",
        "template_not_found",
        "template_exists",
        "volume_not_found",
        "invalid_request",
        "path_not_found",
        "permission_denied",
        "already_exists",
        "not_a_directory",
        "is_a_directory",
        "directory_not_empty",
        "disk_full",
        "spawn_failed",
        "sandbox_io_error",
    ];
    PASSED_ON
        .iter()
        .find(|known| **known == code)
        .copied()
        .unwrap_or("worker_error")
}

/// The worker URL of a running sandbox of the caller's team.
pub async fn route(state: &AppState, team_id: Uuid, id: Uuid) -> ApiResult<(String, String)> {
    let worker_id = match state.routes.get(id) {
        Some((team, worker_id)) if team == team_id => worker_id,
        Some(_) => return Err(ApiError::NotFound("sandbox")),
        None => {
            let row: Option<(String, Option<String>, Option<String>)> = sqlx::query_as(
                "SELECT state, stop_reason, worker_id FROM sandboxes WHERE id = $1 AND team_id = $2",
            )
            .bind(id)
            .bind(team_id)
            .fetch_optional(&state.db)
            .await?;
            match row {
                None => return Err(ApiError::NotFound("sandbox")),
                Some((state_name, reason, Some(worker_id))) if state_name == "running" => {
                    let _ = reason;
                    state.routes.insert(id, team_id, worker_id.clone());
                    worker_id
                }
                Some((state_name, reason, _)) => return Err(not_running(&state_name, reason)),
            }
        }
    };
    let url = state.workers.url_of(&worker_id).await?;
    Ok((worker_id, url))
}

fn not_running(state: &str, reason: Option<String>) -> ApiError {
    ApiError::problem(
        StatusCode::CONFLICT,
        "sandbox_not_running",
        match reason {
            Some(reason) => format!("the sandbox is {state} ({reason})"),
            None => format!("the sandbox is {state}"),
        },
    )
}

/// Calls `suffix` (e.g. `exec`, `files?path=…`) of a running sandbox's worker and passes
/// the answer on: status, content type and a streamed body. A worker that no longer has
/// the sandbox makes the gateway look again at what happened to it.
pub async fn forward(
    state: &AppState,
    principal: &Principal,
    id: Uuid,
    method: reqwest::Method,
    suffix: &str,
    body: Option<reqwest::Body>,
    extra_headers: &[(&str, &str)],
) -> ApiResult<Response> {
    let (_, url) = route(state, principal.team_id, id).await?;
    let mut request = state
        .workers
        .request(method, format!("{url}/internal/v1/sandboxes/{id}/{suffix}"));
    for (name, value) in extra_headers {
        request = request.header(*name, *value);
    }
    if let Some(body) = body {
        request = request.body(body);
    }
    let answer = request.send().await.map_err(|error| {
        tracing::warn!(error = %error, "calling a worker failed");
        ApiError::problem(
            StatusCode::BAD_GATEWAY,
            "worker_unreachable",
            "the worker hosting this sandbox did not answer",
        )
    })?;
    if !answer.status().is_success() {
        let problem = worker_problem(answer).await;
        if let ApiError::Problem {
            code: "sandbox_not_found",
            ..
        } = problem
        {
            state.routes.forget(id);
            let row: Option<(String, Option<String>)> = sqlx::query_as(
                "SELECT state, stop_reason FROM sandboxes WHERE id = $1 AND team_id = $2",
            )
            .bind(id)
            .bind(principal.team_id)
            .fetch_optional(&state.db)
            .await?;
            return Err(match row {
                Some((state_name, reason)) if state_name != "running" => {
                    not_running(&state_name, reason)
                }
                _ => ApiError::NotFound("sandbox"),
            });
        }
        return Err(problem);
    }
    let status = StatusCode::from_u16(answer.status().as_u16()).unwrap_or(StatusCode::OK);
    let passed_on: Vec<(header::HeaderName, HeaderValue)> =
        [header::CONTENT_TYPE.as_str(), "x-sandbase-file-size"]
            .iter()
            .filter_map(|name| {
                let value = answer.headers().get(*name)?;
                Some((
                    header::HeaderName::from_static(name),
                    HeaderValue::from_bytes(value.as_bytes()).ok()?,
                ))
            })
            .collect();
    let mut response = Body::from_stream(answer.bytes_stream()).into_response();
    *response.status_mut() = status;
    for (name, value) in passed_on {
        response.headers_mut().insert(name, value);
    }
    Ok(response)
}

/// Stops a sandbox the system made (for a run) and removes it from its worker.
pub async fn destroy_for_system(state: &AppState, id: Uuid) -> anyhow::Result<()> {
    let worker: Option<(Option<String>,)> = sqlx::query_as(
        "UPDATE sandboxes SET state = 'stopped', stop_reason = 'destroyed', stopped_at = now() \
         WHERE id = $1 AND state <> 'stopped' RETURNING worker_id",
    )
    .bind(id)
    .fetch_optional(&state.db)
    .await?;
    state.routes.forget(id);
    if let Some((Some(worker_id),)) = worker {
        remove_on_worker(state, &worker_id, id).await;
    }
    Ok(())
}

/// Marks stopped sandboxes in the audit log as the system's doing.
pub async fn record_system_stops(
    connection: &mut PgConnection,
    stopped: &[(Uuid, Uuid)],
    action: &str,
    why: &str,
) -> Result<(), sqlx::Error> {
    for (id, team_id) in stopped {
        crate::audit::insert(
            connection,
            &crate::audit::Entry {
                team_id: Some(*team_id),
                actor_type: "system",
                actor_id: None,
                action: action.to_owned(),
                target: Some(id.to_string()),
                outcome: "success",
                status_code: None,
                details: serde_json::json!({ "reason": why }),
            },
            None,
            None,
        )
        .await?;
    }
    Ok(())
}

/// Asks a worker to remove a sandbox; failures are left to the heartbeat reconciliation.
pub async fn remove_on_worker(state: &AppState, worker_id: &str, id: Uuid) {
    let Ok(url) = state.workers.url_of(worker_id).await else {
        return;
    };
    let result = state
        .workers
        .request(
            reqwest::Method::DELETE,
            format!("{url}/internal/v1/sandboxes/{id}"),
        )
        .timeout(Duration::from_secs(30))
        .send()
        .await;
    match result {
        Ok(answer) if answer.status().is_success() => {}
        Ok(answer) => {
            tracing::warn!(%id, status = %answer.status(), "a worker refused to remove a sandbox")
        }
        Err(error) => {
            tracing::warn!(%id, error = %error, "removing a sandbox on its worker failed")
        }
    }
}

/// Stops what should not run any more: expired sandboxes, sandboxes of workers silent for
/// longer than `workers.lost_after_secs`, and creates abandoned by a gateway that died.
pub async fn reap(state: &AppState) -> anyhow::Result<()> {
    let mut transaction = state.db.begin().await?;
    let expired: Vec<(Uuid, Uuid, Option<String>)> = sqlx::query_as(
        "UPDATE sandboxes SET state = 'stopped', stop_reason = 'expired', stopped_at = now() \
         WHERE id IN (SELECT id FROM sandboxes WHERE state <> 'stopped' AND expires_at <= now() \
                      ORDER BY expires_at LIMIT 200 FOR UPDATE SKIP LOCKED) \
         RETURNING id, team_id, worker_id",
    )
    .fetch_all(&mut *transaction)
    .await?;
    let pairs: Vec<(Uuid, Uuid)> = expired.iter().map(|(id, team, _)| (*id, *team)).collect();
    record_system_stops(
        &mut transaction,
        &pairs,
        "sandbox.expire",
        "its lifetime ended",
    )
    .await?;

    let lost: Vec<(Uuid, Uuid)> = sqlx::query_as(
        "UPDATE sandboxes SET state = 'stopped', stop_reason = 'lost', stopped_at = now() \
         WHERE id IN (SELECT s.id FROM sandboxes s JOIN workers w ON w.id = s.worker_id \
                      WHERE s.state <> 'stopped' AND w.last_seen_at < now() - make_interval(secs => $1) \
                      LIMIT 200 FOR UPDATE OF s SKIP LOCKED) \
         RETURNING id, team_id",
    )
    .bind(state.settings.workers.lost_after_secs as f64)
    .fetch_all(&mut *transaction)
    .await?;
    record_system_stops(
        &mut transaction,
        &lost,
        "sandbox.lost",
        "its worker went silent",
    )
    .await?;

    let abandoned: Vec<(Uuid, Uuid)> = sqlx::query_as(
        "UPDATE sandboxes SET state = 'stopped', stop_reason = 'failed', stopped_at = now() \
         WHERE id IN (SELECT id FROM sandboxes WHERE state = 'creating' \
                      AND created_at < now() - make_interval(secs => $1) LIMIT 200 FOR UPDATE SKIP LOCKED) \
         RETURNING id, team_id",
    )
    .bind(CREATE_GIVE_UP_SECS)
    .fetch_all(&mut *transaction)
    .await?;
    transaction.commit().await?;

    // Grants past their expiry: what is left goes to breakage.
    let mut connection = state.db.acquire().await?;
    sandbase_billing::expire_grants(&mut connection).await?;
    drop(connection);

    for (id, _) in lost.iter().chain(&abandoned) {
        state.routes.forget(*id);
    }
    for (id, _, worker_id) in expired {
        state.routes.forget(id);
        if let Some(worker_id) = worker_id {
            let state = state.clone();
            tokio::spawn(async move { remove_on_worker(&state, &worker_id, id).await });
        }
    }
    Ok(())
}
