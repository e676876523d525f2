//! Submitting a run: the checks, the inputs archive, the row and the queue.

use std::collections::BTreeMap;

use base64::Engine;
use chrono::Utc;
use sandbase_api::runs::CreateRunRequest;
use uuid::Uuid;

use super::lifecycle::{self, NewRun};
use super::row::RunRow;
use crate::audit::Audit;
use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::sandboxes::{NewSandbox, Owner, placement, validate};
use crate::state::AppState;

/// The inputs of a run as one tar archive: the given archive, then the named files.
pub fn inputs_archive(
    files: &BTreeMap<String, String>,
    tar: Option<Vec<u8>>,
) -> Result<Option<Vec<u8>>, ApiError> {
    if files.is_empty() && tar.is_none() {
        return Ok(None);
    }
    let mut builder = tar::Builder::new(Vec::new());
    if let Some(tar) = tar {
        let mut archive = tar::Archive::new(tar.as_slice());
        let entries = archive
            .entries()
            .map_err(|error| ApiError::InvalidRequest(format!("`inputs.tar_base64`: {error}")))?;
        for entry in entries {
            let mut entry = entry.map_err(|error| {
                ApiError::InvalidRequest(format!("`inputs.tar_base64`: {error}"))
            })?;
            let header = entry.header().clone();
            let mut data = Vec::new();
            std::io::Read::read_to_end(&mut entry, &mut data).map_err(|error| {
                ApiError::InvalidRequest(format!("`inputs.tar_base64`: {error}"))
            })?;
            builder
                .append(&header, data.as_slice())
                .map_err(anyhow::Error::from)?;
        }
    }
    for (path, content) in files {
        let clean = path.trim_start_matches("./");
        if clean.is_empty()
            || clean.starts_with('/')
            || clean.split('/').any(|part| part == ".." || part.is_empty())
        {
            return Err(ApiError::InvalidRequest(format!(
                "`inputs.files`: `{path}` must be a relative path inside /work/in"
            )));
        }
        let mut header = tar::Header::new_gnu();
        header.set_size(content.len() as u64);
        header.set_mode(0o644);
        header.set_mtime(Utc::now().timestamp().max(0) as u64);
        header.set_entry_type(tar::EntryType::Regular);
        builder
            .append_data(&mut header, clean, content.as_bytes())
            .map_err(|error| ApiError::InvalidRequest(format!("`inputs.files`: {error}")))?;
    }
    Ok(Some(builder.into_inner().map_err(anyhow::Error::from)?))
}

const DEFAULT_COMMAND_TIMEOUT_SECS: u64 = 300;
pub const MAX_COMMAND_TIMEOUT_SECS: u64 = 24 * 3600;

/// Checks a run, stores its inputs, writes its row (and its audit row) and queues it.
pub async fn submit(
    state: &AppState,
    principal: &Principal,
    audit: &Audit,
    mut request: CreateRunRequest,
) -> ApiResult<RunRow> {
    crate::sandboxes::create::with_team_default(state, principal.team_id, &mut request.egress)
        .await?;
    let argv = validate::command_argv(request.cmd, request.command)?;
    // The same checks as a sandbox's.
    let sandbox = NewSandbox::parse(
        sandbase_api::sandboxes::CreateSandboxRequest {
            template: request.template,
            env: request.env,
            cwd: None,
            timeout_secs: None,
            resources: request.resources,
            metadata: Default::default(),
            mounts: Vec::new(),
            max_credits: None,
            egress: request.egress,
            credentials: request.credentials,
            isolation: request.isolation,
            auto_pause_after_idle_secs: None,
            snapshot: None,
            store: request.store,
        },
        &state.settings.sandboxes,
    )?;
    // Named credentials must exist now, for the caller's role (their values are read when
    // the run starts).
    crate::secrets::ensure_usable(state, principal, &sandbox.credentials).await?;
    let timeout_secs = request.timeout_secs.unwrap_or(DEFAULT_COMMAND_TIMEOUT_SECS);
    // A run's time is held to the longest lifetime a sandbox may have.
    let max_timeout = MAX_COMMAND_TIMEOUT_SECS.min(state.settings.sandboxes.max_timeout_secs);
    if timeout_secs == 0 || timeout_secs > max_timeout {
        return Err(ApiError::InvalidRequest(format!(
            "`timeout_secs` must be between 1 and {max_timeout}"
        )));
    }
    let outputs = request.outputs.unwrap_or_else(|| "/work/out".to_owned());
    validate::validate_absolute("outputs", &outputs)?;
    if outputs == "/work/in" || outputs.starts_with("/work/in/") {
        return Err(ApiError::InvalidRequest(
            "`outputs` cannot be inside the read-only /work/in".to_owned(),
        ));
    }
    let tar = match &request.inputs.tar_base64 {
        Some(encoded) => Some(
            base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .map_err(|error| {
                    ApiError::InvalidRequest(format!("`inputs.tar_base64` is not base64: {error}"))
                })?,
        ),
        None => None,
    };
    let inputs = inputs_archive(&request.inputs.files, tar)?;
    affordable(state, principal, &sandbox).await?;
    // Workers must exist and have the template and isolation (capacity may come later).
    let owner = crate::sandboxes::Owner {
        team_id: principal.team_id,
        api_key_id: None,
        user_id: None,
    };
    state
        .sandboxes
        .workers
        .candidates(&crate::sandboxes::placement::placement_of(&sandbox, owner))
        .await?;
    queue(
        state,
        principal,
        audit,
        Queued {
            sandbox,
            argv,
            outputs,
            timeout_secs,
            inputs,
        },
    )
    .await
}

/// 402 unless the team (and the key's lineage) could pay for the run's first minute now:
/// a run nobody can pay for is refused at the door rather than queued to fail later. The
/// probe reservation is released at once (and would expire within a millisecond anyway).
async fn affordable(
    state: &AppState,
    principal: &Principal,
    sandbox: &NewSandbox,
) -> ApiResult<()> {
    let first_minute =
        crate::credits::price_per_second(sandbox.resources, &state.settings.billing) * 60;
    if first_minute <= 0 {
        return Ok(());
    }
    let owner = Owner::of(principal);
    let keys =
        crate::credits::Cap::keys(&crate::keys::with_ancestors(&state.db, owner.api_key_id).await?);
    let probe = Uuid::now_v7();
    placement::reserve(state, owner.team_id, &keys, probe, first_minute, 1).await?;
    let _ = state
        .billing
        .admission
        .release(owner.team_id, &keys, probe, first_minute)
        .await;
    Ok(())
}

/// A checked run, ready to be written and queued.
struct Queued {
    sandbox: NewSandbox,
    argv: Vec<String>,
    outputs: String,
    timeout_secs: u64,
    inputs: Option<Vec<u8>>,
}

async fn queue(
    state: &AppState,
    principal: &Principal,
    audit: &Audit,
    run: Queued,
) -> ApiResult<RunRow> {
    let id = Uuid::now_v7();
    let owner = Owner::of(principal);
    if let Some(inputs) = &run.inputs {
        state
            .sandboxes
            .artifacts
            .put(
                &state.sandboxes.artifacts.inputs(owner.team_id, id),
                inputs.clone(),
            )
            .await?;
    }
    let mut transaction = state.db.begin().await?;
    let row = lifecycle::insert_queued(
        &mut transaction,
        NewRun {
            id,
            owner,
            sandbox: &run.sandbox,
            argv: &run.argv,
            outputs: &run.outputs,
            timeout_secs: run.timeout_secs,
            inputs_size: run.inputs.as_ref().map(Vec::len),
        },
    )
    .await?;
    audit
        .record(
            &mut transaction,
            principal,
            Some(format!("run:{id}")),
            serde_json::json!({
                "template": run.sandbox.template.as_str(),
                "inputs_bytes": run.inputs.as_ref().map(Vec::len),
            }),
        )
        .await?;
    transaction.commit().await?;
    if let Err(error) = state.sandboxes.run_queue.push(owner.team_id, id).await {
        // PostgreSQL has it: the dispatcher's sweep queues it again.
        tracing::warn!(%id, error = %error, "queueing a run in Redis failed");
    }
    Ok(row)
}
