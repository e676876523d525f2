//! Agent runs (`/v1/agent-runs`): the harness's native API. Made, read, listed, deleted;
//! their stream of events as a JSON page or Server-Sent Events resumed with `Last-Event-ID`;
//! their ledger of steps; messages, tool results and cancels sent to them. Another team's run
//! is 404 for everything.

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use sandbase_api::agent_runs::{
    AgentRun, AgentRunEvent, AgentRunEventPage, AgentRunInput, AgentRunList, AgentRunStepList,
    AgentRunTurnList, CancelAgentRunRequest, CreateAgentRunRequest,
};
use sandbase_api::{ErrorBody, Role};
use serde::Deserialize;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use crate::audit::RequestContext;
use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::harness::{create, events, inputs, rows};
use crate::http::extract::{ApiJson, ApiPath, ApiQuery};
use crate::state::AppState;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_agent_run, list_agent_runs))
        .routes(routes!(get_agent_run, delete_agent_run))
        .routes(routes!(agent_run_events))
        .routes(routes!(agent_run_steps))
        .routes(routes!(agent_run_turns))
        .routes(routes!(agent_run_inputs))
        .routes(routes!(cancel_agent_run))
}

/// The `Idempotency-Key` header (1–255 visible characters), when sent.
fn idempotency_key(headers: &HeaderMap) -> ApiResult<Option<String>> {
    let Some(value) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    match value.to_str() {
        Ok(key) if (1..=255).contains(&key.len()) && key.chars().all(|c| c.is_ascii_graphic()) => {
            Ok(Some(key.to_owned()))
        }
        _ => Err(ApiError::InvalidRequest(
            "`Idempotency-Key` must be 1 to 255 visible ASCII characters".to_owned(),
        )),
    }
}

/// Start an agent run: the model works in its sandbox with its tools, turn by turn, acting
/// with a key of its own (a child of the caller's, capped at `limits.max_credits`). The run
/// is stepped in the background: follow it with `GET …/events`, or ask the answer to wait for
/// its first turn (`background: false`) or to stream it (`stream: true`). An
/// `Idempotency-Key` sent again with the same body within 24 hours answers the run it made
/// (200).
#[utoipa::path(post, path = "/v1/agent-runs", tag = "agent-runs", security(("bearer" = [])),
    request_body = CreateAgentRunRequest,
    params(("Idempotency-Key" = Option<String>, Header, description = "Makes a retried create answer the first run")),
    responses(
        (status = 201, description = "Made: queued, or (`background: false`) its first turn stopped; or (`stream: true`) its events until then", content(
            (AgentRun = "application/json"),
            (AgentRunEvent = "text/event-stream"),
        )),
        (status = 200, description = "Made before with this Idempotency-Key and body", body = AgentRun),
        (status = 403, description = "A `max_credits` beyond the caller key's cap (`exceeds_parent_key`), or a role below member", body = ErrorBody),
        (status = 404, description = "The sandbox given by id is not the team's, or stopped", body = ErrorBody),
        (status = 422, description = "Invalid field (an unknown model, a tool twice), or the Idempotency-Key used for another body (`idempotency_key_reused`)", body = ErrorBody),
        (status = 501, description = "The deployment has no vault to seal the run's key (`vault_not_configured`)", body = ErrorBody),
    ))]
async fn create_agent_run(
    State(state): State<AppState>,
    principal: Principal,
    context: RequestContext,
    headers: HeaderMap,
    ApiJson(request): ApiJson<CreateAgentRunRequest>,
) -> ApiResult<Response> {
    let audit = context.action("agent_run.create");
    principal.require(Role::Member)?;
    let key = idempotency_key(&headers)?;
    let (stream, background) = (
        request.stream.unwrap_or(false),
        request.background.unwrap_or(true),
    );
    let (made, row) = create::create(&state, &principal, &audit, key, request).await?;
    let status = if made {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    if stream {
        let events = events::follow(state.clone(), row.id, 0, events::Until::Stopped);
        return Ok((status, sse(events)).into_response());
    }
    let row = if background {
        row
    } else {
        events::until_stopped(&state, principal.team_id, row.id).await?
    };
    Ok((status, Json(row.to_api())).into_response())
}

/// A followed stream of events as Server-Sent Events.
fn sse(
    events: impl futures_util::Stream<Item = Result<AgentRunEvent, sqlx::Error>> + Send + 'static,
) -> Response {
    let frames = events.map(|event| match event {
        Ok(event) => Ok(sse_frame(&event)),
        Err(error) => Err(std::io::Error::other(error.to_string())),
    });
    let mut response = Body::from_stream(frames).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        "text/event-stream".parse().expect("a media type"),
    );
    headers.insert(
        header::CACHE_CONTROL,
        "no-cache".parse().expect("a header value"),
    );
    response
}

/// The team's agent runs, newest first (the last 100).
#[utoipa::path(get, path = "/v1/agent-runs", tag = "agent-runs", security(("bearer" = [])),
    responses((status = 200, description = "OK", body = AgentRunList)))]
async fn list_agent_runs(
    State(state): State<AppState>,
    principal: Principal,
) -> ApiResult<Json<AgentRunList>> {
    let mut connection = state.db.acquire().await?;
    Ok(Json(AgentRunList {
        agent_runs: rows::list(&mut connection, principal.team_id).await?,
    }))
}

/// One agent run of the team.
#[utoipa::path(get, path = "/v1/agent-runs/{id}", tag = "agent-runs", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Agent run id")),
    responses((status = 200, description = "OK", body = AgentRun),
        (status = 404, description = "Not in the caller's team", body = ErrorBody)))]
async fn get_agent_run(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath(id): ApiPath<Uuid>,
) -> ApiResult<Json<AgentRun>> {
    let mut connection = state.db.acquire().await?;
    Ok(Json(
        rows::fetch(&mut connection, principal.team_id, id)
            .await?
            .to_api(),
    ))
}

/// Delete an agent run that ended, with its journal (its steps, events and conversation).
#[utoipa::path(delete, path = "/v1/agent-runs/{id}", tag = "agent-runs", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Agent run id")),
    responses((status = 204, description = "Deleted"),
        (status = 404, description = "Not in the caller's team", body = ErrorBody),
        (status = 409, description = "Still going: cancel it first (`agent_run_active`)", body = ErrorBody)))]
async fn delete_agent_run(
    State(state): State<AppState>,
    principal: Principal,
    context: RequestContext,
    ApiPath(id): ApiPath<Uuid>,
) -> ApiResult<StatusCode> {
    context.action("agent_run.delete");
    principal.require(Role::Member)?;
    inputs::delete(&state, principal.team_id, id).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct EventsQuery {
    /// The events after this `seq` (0: from the first).
    #[serde(default)]
    after: Option<i64>,
    /// Server-Sent Events, followed until the run ends (also with `Accept: text/event-stream`).
    #[serde(default)]
    stream: Option<bool>,
    /// At most this many events in a page (1–1000, default 100).
    #[serde(default)]
    limit: Option<i64>,
}

/// The run's events after `after` (or the `Last-Event-ID` header): a JSON page, or Server-Sent
/// Events (`id: SEQ`, `event: TYPE`, `data:` the event) from the journal and then as they come,
/// until the run has ended. A client that reconnects, to any gateway, sees every `seq` once.
#[utoipa::path(get, path = "/v1/agent-runs/{id}/events", tag = "agent-runs", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Agent run id"), EventsQuery,
        ("Last-Event-ID" = Option<String>, Header, description = "Resume a stream after this seq")),
    responses(
        (status = 200, description = "A page, or (streamed) the events", content(
            (AgentRunEventPage = "application/json"),
            (AgentRunEvent = "text/event-stream"),
        )),
        (status = 404, description = "Not in the caller's team", body = ErrorBody),
        (status = 422, description = "Invalid `after` or `limit`", body = ErrorBody)))]
async fn agent_run_events(
    State(state): State<AppState>,
    principal: Principal,
    headers: HeaderMap,
    ApiPath(id): ApiPath<Uuid>,
    ApiQuery(query): ApiQuery<EventsQuery>,
) -> ApiResult<Response> {
    let mut connection = state.db.acquire().await?;
    let row = rows::fetch(&mut connection, principal.team_id, id).await?;
    let last_event = headers
        .get("last-event-id")
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.trim().parse::<i64>().ok());
    let after = last_event.or(query.after).unwrap_or(0);
    let limit = query.limit.unwrap_or(100);
    if after < 0 || !(1..=1000).contains(&limit) {
        return Err(ApiError::InvalidRequest(
            "`after` is at least 0 and `limit` between 1 and 1000".to_owned(),
        ));
    }
    let wants_stream = query.stream.unwrap_or(false)
        || headers
            .get(header::ACCEPT)
            .and_then(|value| value.to_str().ok())
            .is_some_and(|accept| accept.contains("text/event-stream"));
    if !wants_stream {
        let mut events = rows::events(&mut connection, id, after, limit + 1).await?;
        let has_more = events.len() as i64 > limit;
        events.truncate(limit as usize);
        let page = AgentRunEventPage {
            events,
            status: row.status.to_api(),
            has_more,
        };
        return Ok(Json(page).into_response());
    }
    drop(connection);
    Ok(sse(events::follow(state, id, after, events::Until::Ended)))
}

/// One event as Server-Sent Events frame it (the same bytes live and replayed).
fn sse_frame(event: &AgentRunEvent) -> String {
    let data = serde_json::to_string(event).unwrap_or_default();
    format!("id: {}\nevent: {}\ndata: {data}\n\n", event.seq, event.kind)
}

/// The run's ledger: each model step (model, usage, cost, latency, the store request) and
/// each tool step (arguments, exit code or error, duration, the exec id its output is kept
/// under), written before it happened.
#[utoipa::path(get, path = "/v1/agent-runs/{id}/steps", tag = "agent-runs", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Agent run id")),
    responses((status = 200, description = "OK", body = AgentRunStepList),
        (status = 404, description = "Not in the caller's team", body = ErrorBody)))]
async fn agent_run_steps(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath(id): ApiPath<Uuid>,
) -> ApiResult<Json<AgentRunStepList>> {
    let mut connection = state.db.acquire().await?;
    rows::fetch(&mut connection, principal.team_id, id).await?;
    let steps = rows::steps(&mut connection, id).await?;
    Ok(Json(AgentRunStepList {
        steps: steps.iter().map(rows::StepRow::to_api).collect(),
    }))
}

/// The run's turns: each one's input, its model and tool steps and their cost, when it
/// started and ended.
#[utoipa::path(get, path = "/v1/agent-runs/{id}/turns", tag = "agent-runs", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Agent run id")),
    responses((status = 200, description = "OK", body = AgentRunTurnList),
        (status = 404, description = "Not in the caller's team", body = ErrorBody)))]
async fn agent_run_turns(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath(id): ApiPath<Uuid>,
) -> ApiResult<Json<AgentRunTurnList>> {
    let mut connection = state.db.acquire().await?;
    rows::fetch(&mut connection, principal.team_id, id).await?;
    Ok(Json(AgentRunTurnList {
        turns: rows::turns(&mut connection, id).await?,
    }))
}

/// Send the run a message (the next turn's input: at once when it is idle, queued for the
/// end of the turn going on), a client function's result, or a decision on a call its
/// approval rules ask about (by a person or a key of at least the run creator's role, not
/// the run's own; `remember: run` covers the same tool under the same rule): the run goes on
/// once it has all it waits for. An `Idempotency-Key` sent again answers without sending
/// twice.
#[utoipa::path(post, path = "/v1/agent-runs/{id}/inputs", tag = "agent-runs", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Agent run id"),
        ("Idempotency-Key" = Option<String>, Header, description = "Makes a retried input count once")),
    request_body = AgentRunInput,
    responses((status = 202, description = "Taken", body = AgentRun),
        (status = 404, description = "Not in the caller's team", body = ErrorBody),
        (status = 403, description = "A decision by the run's own key (or a key it made), or by a role below the run creator's (`forbidden`)", body = ErrorBody),
        (status = 409, description = "The run ended (`agent_run_finished`), waits for no such result (`not_waiting_for_tool_result`) or decision (`not_waiting_for_approval`), or had its turns (`max_turns_reached`)", body = ErrorBody),
        (status = 422, description = "Invalid input", body = ErrorBody)))]
async fn agent_run_inputs(
    State(state): State<AppState>,
    principal: Principal,
    context: RequestContext,
    headers: HeaderMap,
    ApiPath(id): ApiPath<Uuid>,
    ApiJson(input): ApiJson<AgentRunInput>,
) -> ApiResult<(StatusCode, Json<AgentRun>)> {
    context.action("agent_run.input");
    principal.require(Role::Member)?;
    let key = idempotency_key(&headers)?;
    let row = inputs::send(&state, &principal, id, input, key).await?;
    Ok((StatusCode::ACCEPTED, Json(row.to_api())))
}

/// Cancel the run (`scope: run`, the default: it ends `cancelled`, its sandbox destroyed if
/// it made it), its turn (`scope: turn`: the run is idle and takes the next message), or one
/// tool call (`scope: tool` with its `call_id`: the model gets its output marked cancelled
/// and the turn goes on). A command going on is interrupted (SIGINT, SIGKILL a second later;
/// Python gets KeyboardInterrupt).
#[utoipa::path(post, path = "/v1/agent-runs/{id}/cancel", tag = "agent-runs", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Agent run id")),
    request_body = CancelAgentRunRequest,
    responses((status = 202, description = "Asked for", body = AgentRun),
        (status = 404, description = "Not in the caller's team", body = ErrorBody),
        (status = 409, description = "The run ended (`agent_run_finished`)", body = ErrorBody)))]
async fn cancel_agent_run(
    State(state): State<AppState>,
    principal: Principal,
    context: RequestContext,
    ApiPath(id): ApiPath<Uuid>,
    ApiJson(request): ApiJson<CancelAgentRunRequest>,
) -> ApiResult<(StatusCode, Json<AgentRun>)> {
    context.action("agent_run.cancel");
    principal.require(Role::Member)?;
    let row = inputs::cancel(
        &state,
        principal.team_id,
        id,
        request.scope,
        request.call_id,
    )
    .await?;
    Ok((StatusCode::ACCEPTED, Json(row.to_api())))
}
