//! The operator's template routes: import, pull and removal on every live worker, answered
//! as NDJSON progress.

use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use sandbase_api::internal::PullTemplate;
use sandbase_api::sandboxes::TemplateName;
use serde::Deserialize;

use crate::error::{ApiError, ApiResult};
use crate::http::extract::{ApiJson, ApiPath};
use crate::http::node_token::Operator;
use crate::state::AppState;
use crate::templates::{self, Progress};

fn template_name(name: &str) -> ApiResult<TemplateName> {
    TemplateName::parse(name).map_err(ApiError::InvalidRequest)
}

fn ndjson(receiver: Progress) -> Response {
    let lines = futures_util::stream::unfold(receiver, |mut receiver| async move {
        let value = receiver.recv().await?;
        Some((
            Ok::<_, Infallible>(Bytes::from(format!("{value}\n"))),
            receiver,
        ))
    });
    (
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(lines),
    )
        .into_response()
}

#[derive(Deserialize)]
pub struct ImportQuery {
    #[serde(default)]
    format: Option<String>,
}

/// Import an image archive (OCI layout or Docker archive; `?format=rootfs` for a plain root
/// file system tarball) as template `name` on every live worker.
pub async fn import(
    State(state): State<AppState>,
    _operator: Operator,
    ApiPath(name): ApiPath<String>,
    Query(query): Query<ImportQuery>,
    body: Body,
) -> ApiResult<Response> {
    let name = template_name(&name)?;
    let limit = state.settings.sandboxes.upload_limit_bytes;
    let mut archive = Vec::new();
    let mut chunks = body.into_data_stream();
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk
            .map_err(|error| ApiError::InvalidRequest(format!("reading the upload: {error}")))?;
        if (archive.len() + chunk.len()) as u64 > limit {
            return Err(ApiError::PayloadTooLarge);
        }
        archive.extend_from_slice(&chunk);
    }
    let format = query.format.unwrap_or_else(|| "image".to_owned());
    let progress = templates::import(state, name, format, Bytes::from(archive)).await?;
    Ok(ndjson(progress))
}

/// Pull an image from a registry into template `name` on every live worker.
pub async fn pull(
    State(state): State<AppState>,
    _operator: Operator,
    ApiPath(name): ApiPath<String>,
    ApiJson(request): ApiJson<PullTemplate>,
) -> ApiResult<Response> {
    let name = template_name(&name)?;
    Ok(ndjson(templates::pull(state, name, request).await?))
}

/// Remove template `name` from every live worker.
pub async fn remove(
    State(state): State<AppState>,
    _operator: Operator,
    ApiPath(name): ApiPath<String>,
) -> ApiResult<Response> {
    let name = template_name(&name)?;
    Ok(ndjson(templates::remove(state, name).await?))
}
