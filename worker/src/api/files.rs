//! Files and archives, resolved by the agent inside the sandbox.

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use sandbase_agent::protocol::{self, Owner};
use sandbase_api::sandboxes::{DirectoryListing, FileInfo};
use serde::Deserialize;
use tokio::sync::mpsc;
use uuid::Uuid;

use crate::node::NodeError;
use crate::spec::{SANDBOX_USER, WORK_DIR};

use super::support::ApiState;

#[derive(Deserialize)]
pub(super) struct PathQuery {
    path: String,
    #[serde(default)]
    recursive: bool,
}

/// A path inside the sandbox: relative ones are under `/work`.
pub(super) fn sandbox_path(path: &str) -> Result<String, NodeError> {
    if path.is_empty() || path.contains('\0') {
        return Err(NodeError::Invalid(
            "`path` must be a non-empty path without NUL bytes".to_owned(),
        ));
    }
    Ok(if path.starts_with('/') {
        path.to_owned()
    } else {
        format!("{WORK_DIR}/{path}")
    })
}

pub(super) fn file_info(name: String, stat: protocol::Stat) -> FileInfo {
    FileInfo {
        name,
        path: stat.path,
        kind: stat.kind,
        size: stat.size,
        mode: stat.mode,
        modified: chrono::DateTime::from_timestamp(stat.modified, 0).unwrap_or_default(),
        link_target: stat.link_target,
    }
}

pub(super) fn name_of(path: &str) -> String {
    path.rsplit('/')
        .find(|part| !part.is_empty())
        .unwrap_or("/")
        .to_owned()
}

pub(super) fn user() -> Owner {
    Owner {
        uid: SANDBOX_USER,
        gid: SANDBOX_USER,
    }
}

/// A file's bytes, or a directory's listing as JSON.
pub(super) async fn read_path(
    State(state): State<ApiState>,
    Path(id): Path<Uuid>,
    Query(query): Query<PathQuery>,
) -> Result<Response, NodeError> {
    let hosted = state.node.active(id).await?;
    let path = sandbox_path(&query.path)?;
    let is_dir = match hosted
        .agent
        .simple(&protocol::Request::Stat { path: path.clone() })
        .await?
    {
        protocol::Reply::Ok(Some(stat)) => stat.kind == "dir",
        _ => false,
    };
    if is_dir {
        let entries = hosted.agent.list(&path).await?;
        return Ok(Json(DirectoryListing {
            path,
            entries: entries
                .into_iter()
                .map(|entry| file_info(entry.name, entry.stat))
                .collect(),
        })
        .into_response());
    }
    let (stat, chunks) = hosted
        .agent
        .download(&protocol::Request::ReadFile { path })
        .await?;
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_owned()),
            (
                header::HeaderName::from_static("x-sandbase-file-size"),
                stat.size.to_string(),
            ),
        ],
        byte_stream(chunks, hosted),
    )
        .into_response())
}

/// The chunks as a body; the sandbox stays busy (`active`) while it streams.
pub(super) fn byte_stream(
    chunks: mpsc::Receiver<anyhow::Result<Vec<u8>>>,
    active: crate::pause::Active,
) -> Body {
    Body::from_stream(futures_util::stream::unfold(
        (chunks, active),
        |(mut chunks, active)| async move {
            let chunk = chunks.recv().await?;
            Some((
                chunk
                    .map(Bytes::from)
                    .map_err(|error| std::io::Error::other(format!("{error:#}"))),
                (chunks, active),
            ))
        },
    ))
}

pub(super) async fn write_file(
    State(state): State<ApiState>,
    Path(id): Path<Uuid>,
    Query(query): Query<PathQuery>,
    body: Body,
) -> Result<Json<FileInfo>, NodeError> {
    let hosted = state.node.active(id).await?;
    let path = sandbox_path(&query.path)?;
    let stat = hosted
        .agent
        .upload(
            &protocol::Request::WriteFile {
                path: path.clone(),
                mode: None,
                owner: Some(user()),
            },
            body.into_data_stream(),
        )
        .await?;
    Ok(Json(file_info(name_of(&path), stat)))
}

pub(super) async fn remove_path(
    State(state): State<ApiState>,
    Path(id): Path<Uuid>,
    Query(query): Query<PathQuery>,
) -> Result<StatusCode, NodeError> {
    let hosted = state.node.active(id).await?;
    let path = sandbox_path(&query.path)?;
    hosted
        .agent
        .simple(&protocol::Request::Remove {
            path,
            recursive: query.recursive,
        })
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

pub(super) async fn archive_out(
    State(state): State<ApiState>,
    Path(id): Path<Uuid>,
    Query(query): Query<PathQuery>,
) -> Result<Response, NodeError> {
    let hosted = state.node.active(id).await?;
    let path = sandbox_path(&query.path)?;
    let (_, chunks) = hosted
        .agent
        .download(&protocol::Request::TarOut { path })
        .await?;
    Ok((
        [(header::CONTENT_TYPE, "application/x-tar")],
        byte_stream(chunks, hosted),
    )
        .into_response())
}

pub(super) async fn archive_in(
    State(state): State<ApiState>,
    Path(id): Path<Uuid>,
    Query(query): Query<PathQuery>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<FileInfo>, NodeError> {
    let hosted = state.node.active(id).await?;
    let path = sandbox_path(&query.path)?;
    // Inputs of runs are unpacked as the sandbox's root: the command (the sandbox user)
    // can read but not change them. A snapshot keeps the owners it recorded.
    let (owner, keep_owners) = match headers
        .get("x-sandbase-owner")
        .and_then(|value| value.to_str().ok())
    {
        Some("root") => (None, false),
        Some("keep") => (None, true),
        _ => (Some(user()), false),
    };
    let stat = hosted
        .agent
        .upload(
            &protocol::Request::TarIn {
                path: path.clone(),
                owner,
                keep_owners,
            },
            body.into_data_stream(),
        )
        .await?;
    Ok(Json(file_info(name_of(&path), stat)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_are_under_work() {
        assert_eq!(sandbox_path("a/b").unwrap(), "/work/a/b");
        assert_eq!(sandbox_path("/etc/x").unwrap(), "/etc/x");
        assert!(sandbox_path("").is_err());
        assert!(sandbox_path("a\0b").is_err());
        assert_eq!(name_of("/work/a/"), "a");
        assert_eq!(name_of("/"), "/");
    }
}
