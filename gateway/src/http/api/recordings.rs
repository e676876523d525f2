//! Recordings of terminal sessions: listed, and read as asciicast v2 (also after the
//! sandbox is gone, until they expire).

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use sandbase_api::terminals::RecordingList;
use sandbase_api::{ErrorBody, Role};
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use crate::auth::Principal;
use crate::error::ApiResult;
use crate::http::extract::{ApiPath, ApiQuery};
use crate::sandboxes::recordings::{self, RecordingRow};
use crate::state::AppState;

const MAX_LIST: i64 = 500;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(session_recording))
        .routes(routes!(list_recordings))
        .routes(routes!(get_recording, delete_recording))
}

/// Admins and owners read every recording of their team; members those made by members.
fn reader(principal: &Principal) -> recordings::Reader {
    recordings::Reader {
        team_id: principal.team_id,
        everyone: principal.role.at_least(Role::Admin),
    }
}

fn cast(state: &AppState, row: &RecordingRow) -> Response {
    let mut response = Body::from_stream(recordings::content(state, row)).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-asciicast"),
    );
    response
}

/// A terminal session's recording so far (asciicast v2: output, resizes, and input unless
/// the session opted out).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/pty/{sid}/recording", tag = "sandboxes", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Sandbox id"), ("sid" = u32, Path, description = "Session id")),
    responses((status = 200, description = "The recording", content_type = "application/x-asciicast"), (status = 404, description = "No such recording", body = ErrorBody)))]
async fn session_recording(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath((id, session)): ApiPath<(Uuid, u32)>,
) -> ApiResult<Response> {
    let row = recordings::of_session(&state, reader(&principal), id, session).await?;
    Ok(cast(&state, &row))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct ListQuery {
    /// Only this sandbox's.
    sandbox: Option<Uuid>,
}

/// The team's recordings, newest first (members see those members made; admins and owners
/// every one).
#[utoipa::path(get, path = "/v1/recordings", tag = "sandboxes", security(("bearer" = [])),
    params(ListQuery),
    responses((status = 200, description = "OK", body = RecordingList)))]
async fn list_recordings(
    State(state): State<AppState>,
    principal: Principal,
    ApiQuery(query): ApiQuery<ListQuery>,
) -> ApiResult<axum::Json<RecordingList>> {
    let rows = recordings::list(&state, reader(&principal), query.sandbox, MAX_LIST).await?;
    Ok(axum::Json(RecordingList {
        recordings: rows.iter().map(RecordingRow::to_api).collect(),
    }))
}

/// One recording, as asciicast v2 (play it with `sandbase replay ID` or `asciinema play`);
/// a member reads those members made.
#[utoipa::path(get, path = "/v1/recordings/{id}", tag = "sandboxes", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Recording id")),
    responses((status = 200, description = "The recording", content_type = "application/x-asciicast"), (status = 404, description = "Not in the caller's team", body = ErrorBody)))]
async fn get_recording(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath(id): ApiPath<Uuid>,
) -> ApiResult<Response> {
    let row = recordings::find(&state, reader(&principal), id).await?;
    Ok(cast(&state, &row))
}

/// Delete a recording (admins and owners): it stops counting against the team's recording
/// quota and its storage stops being metered.
#[utoipa::path(delete, path = "/v1/recordings/{id}", tag = "sandboxes", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Recording id")),
    responses((status = 204, description = "Deleted"), (status = 403, description = "Not an admin (`forbidden`)", body = ErrorBody), (status = 404, description = "Not in the caller's team", body = ErrorBody)))]
async fn delete_recording(
    State(state): State<AppState>,
    principal: Principal,
    context: crate::audit::RequestContext,
    ApiPath(id): ApiPath<Uuid>,
) -> ApiResult<StatusCode> {
    principal.require(Role::Admin)?;
    let audit = context.action("recording.delete");
    let mut transaction = state.db.begin().await?;
    let chunks = recordings::delete_row(&mut transaction, principal.team_id, id).await?;
    audit
        .record(
            &mut transaction,
            &principal,
            Some(format!("recording:{id}")),
            serde_json::json!({}),
        )
        .await?;
    transaction.commit().await?;
    recordings::delete_chunks(&state, principal.team_id, id, chunks).await;
    state.sandboxes.recording_usage.forget(principal.team_id);
    Ok(StatusCode::NO_CONTENT)
}
