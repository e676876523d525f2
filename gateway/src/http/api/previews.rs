//! Preview URLs of a sandbox's ports: opened (a token and a signed URL, shown once), listed,
//! closed. The previews themselves are served by `http::preview` on their own hosts.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use sandbase_api::previews::{CreatedPreview, NewPreview, PreviewList};
use sandbase_api::{ErrorBody, Role};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use crate::audit::{RequestContext, Requester};
use crate::auth::Principal;
use crate::error::ApiResult;
use crate::http::extract::{ApiJson, ApiPath};
use crate::sandboxes::{Owner, previews};
use crate::state::AppState;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(open_preview, list_previews))
        .routes(routes!(close_preview))
}

/// Open a port of a running sandbox at `{port}-{sandbox_id}.{preview domain}`: HTTP and
/// WebSocket requests to that host reach `127.0.0.1:{port}` inside the sandbox (which needs
/// no egress for it). Access by the token (`x-sandbase-preview-token`), the signed URL, or by
/// anyone when `public`. Asking again for a port replaces its token. Bytes through a preview
/// are metered as the sandbox's egress.
#[utoipa::path(post, path = "/v1/sandboxes/{id}/previews", tag = "sandboxes", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Sandbox id")),
    request_body = NewPreview,
    responses(
        (status = 201, description = "Opened; the token and signed URL are shown only now", body = CreatedPreview),
        (status = 404, description = "Not in the caller's team", body = ErrorBody),
        (status = 409, description = "Not running (`sandbox_not_running`)", body = ErrorBody),
        (status = 422, description = "Invalid port or TTL, or too many previews", body = ErrorBody),
        (status = 501, description = "Previews are not configured (`previews_not_configured`)", body = ErrorBody),
    ))]
async fn open_preview(
    State(state): State<AppState>,
    principal: Principal,
    context: RequestContext,
    ApiPath(id): ApiPath<Uuid>,
    ApiJson(request): ApiJson<NewPreview>,
) -> ApiResult<(StatusCode, Json<CreatedPreview>)> {
    let audit = context.action("sandbox.preview.open");
    principal.require(Role::Member)?;
    let requester = Requester::member(&audit, &principal);
    let created = previews::open(&state, Owner::of(&principal), requester, id, &request).await?;
    Ok((StatusCode::CREATED, Json(created)))
}

/// The sandbox's open previews (without their tokens).
#[utoipa::path(get, path = "/v1/sandboxes/{id}/previews", tag = "sandboxes", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Sandbox id")),
    responses(
        (status = 200, description = "OK", body = PreviewList),
        (status = 404, description = "Not in the caller's team", body = ErrorBody),
        (status = 501, description = "Previews are not configured (`previews_not_configured`)", body = ErrorBody),
    ))]
async fn list_previews(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath(id): ApiPath<Uuid>,
) -> ApiResult<Json<PreviewList>> {
    let rows = previews::list(&state, principal.team_id, id).await?;
    Ok(Json(PreviewList {
        previews: rows
            .iter()
            .map(|row| row.to_api(&state))
            .collect::<ApiResult<_>>()?,
    }))
}

/// Close a preview: its token and signed URLs stop working at once.
#[utoipa::path(delete, path = "/v1/sandboxes/{id}/previews/{port}", tag = "sandboxes", security(("bearer" = [])),
    params(("id" = Uuid, Path, description = "Sandbox id"), ("port" = u16, Path, description = "The port")),
    responses(
        (status = 204, description = "Closed"),
        (status = 404, description = "No such preview in the caller's team", body = ErrorBody),
    ))]
async fn close_preview(
    State(state): State<AppState>,
    principal: Principal,
    context: RequestContext,
    ApiPath((id, port)): ApiPath<(Uuid, u16)>,
) -> ApiResult<StatusCode> {
    let audit = context.action("sandbox.preview.close");
    principal.require(Role::Member)?;
    let requester = Requester::member(&audit, &principal);
    previews::close(&state, principal.team_id, requester, id, port).await?;
    Ok(StatusCode::NO_CONTENT)
}
