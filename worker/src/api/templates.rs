//! Templates: import an archive, pull from a registry, remove.

use std::convert::Infallible;
use std::sync::Arc;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use futures_util::StreamExt;
use sandbase_api::sandboxes::TemplateName;
use serde::Deserialize;
use tokio::sync::mpsc;
use uuid::Uuid;

use crate::node::NodeError;

use super::support::ApiState;
use super::support::ndjson_response;

/// Template names follow the one rule of [`TemplateName`].
pub(super) fn check_template_name(name: &str) -> Result<(), NodeError> {
    TemplateName::parse(name)
        .map(drop)
        .map_err(NodeError::Invalid)
}

#[derive(Deserialize)]
pub(super) struct ImportQuery {
    /// `image` (OCI layout or Docker archive, the default) or `rootfs` (a plain tarball).
    #[serde(default)]
    format: Option<String>,
}

/// Builds a template from the uploaded archive.
pub(super) async fn import_template(
    State(state): State<ApiState>,
    Path(name): Path<String>,
    Query(query): Query<ImportQuery>,
    body: Body,
) -> Result<StatusCode, NodeError> {
    check_template_name(&name)?;
    let rootfs_tarball = match query.format.as_deref() {
        None | Some("image") => false,
        Some("rootfs") => true,
        Some(other) => return Err(NodeError::Invalid(format!("unknown format `{other}`"))),
    };
    let file =
        std::env::temp_dir().join(format!("sandbase-import-{}.tar", Uuid::new_v4().simple()));
    let saved = save_body(&file, body).await;
    let result = match saved {
        Ok(()) => {
            let archive = file.clone();
            state
                .node
                .add_template(&name, move |rootfs, base| {
                    if rootfs_tarball {
                        // Unpacked like an image layer: nothing lands outside the root.
                        crate::templates::from_layers(rootfs, std::slice::from_ref(&archive), base)
                    } else {
                        crate::templates::from_image_archive(rootfs, &archive, base)
                    }
                })
                .await
        }
        Err(error) => Err(NodeError::Internal(error)),
    };
    let _ = tokio::fs::remove_file(&file).await;
    result.map(|()| StatusCode::CREATED)
}

pub(super) async fn save_body(path: &std::path::Path, body: Body) -> anyhow::Result<()> {
    use tokio::io::AsyncWriteExt;
    let mut file = tokio::fs::File::create(path).await?;
    let mut chunks = body.into_data_stream();
    while let Some(chunk) = chunks.next().await {
        file.write_all(&chunk?).await?;
    }
    file.sync_all().await?;
    Ok(())
}

pub(super) async fn remove_template(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<StatusCode, NodeError> {
    check_template_name(&name)?;
    state.node.remove_template(&name).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize)]
pub(super) struct PullBody {
    reference: String,
    #[serde(default)]
    insecure_registries: Vec<String>,
}

/// Pulls an image from a registry into a template; answers NDJSON progress lines
/// (`{"progress":"…"}`) ending in `{"done":true}` or `{"error":{…}}`.
pub(super) async fn pull_template(
    State(state): State<ApiState>,
    Path(name): Path<String>,
    Json(body): Json<PullBody>,
) -> Result<Response, NodeError> {
    check_template_name(&name)?;
    let reference = crate::registry::Reference::parse(&body.reference)
        .map_err(|error| NodeError::Invalid(format!("{error:#}")))?;
    if state
        .node
        .runtime()
        .containerd()
        .template_exists(&name)
        .await?
    {
        return Err(NodeError::TemplateExists(name));
    }
    let (sender, receiver) = mpsc::channel::<String>(64);
    let node = Arc::clone(&state.node);
    tokio::spawn(async move {
        let line = |value: serde_json::Value| format!("{value}\n");
        let layout =
            std::env::temp_dir().join(format!("sandbase-pull-{}", Uuid::new_v4().simple()));
        let result = async {
            let puller = crate::registry::Puller::new(body.insecure_registries)?;
            let progress_sender = sender.clone();
            let mut report = move |progress: serde_json::Value| {
                let _ = progress_sender.try_send(line(progress));
            };
            let layers = puller.pull(&reference, &layout, &mut report).await?;
            let _ = sender
                .send(line(
                    serde_json::json!({ "progress": "building the template" }),
                ))
                .await;
            node.add_template(&name, move |rootfs, base| {
                crate::templates::from_layers(rootfs, &layers, base)
            })
            .await
            .map_err(|error| anyhow::anyhow!("{error}"))
        }
        .await;
        let _ = tokio::fs::remove_dir_all(&layout).await;
        let last = match result {
            Ok(()) => line(serde_json::json!({ "done": true })),
            Err(error) => {
                tracing::warn!(error = format!("{error:#}"), "pulling an image failed");
                line(
                    serde_json::json!({ "error": { "code": "pull_failed", "message": format!("{error:#}") } }),
                )
            }
        };
        let _ = sender.send(last).await;
    });
    let lines = futures_util::stream::unfold(receiver, |mut receiver| async move {
        let line = receiver.recv().await?;
        Some((Ok::<_, Infallible>(Bytes::from(line)), receiver))
    });
    Ok(ndjson_response(Body::from_stream(lines)))
}
