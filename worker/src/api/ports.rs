//! A preview connection: `GET …/ports/{port}` with `Upgrade: sandbase-tcp` answers 101 once a
//! connection to the port inside the sandbox is made, and from then on the upgraded
//! connection carries its bytes both ways (the gateway speaks HTTP over it). Nothing listening
//! is 502 `port_closed`, before any upgrade.

use axum::extract::{Path, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use hyper_util::rt::TokioIo;
use sandbase_api::internal::PORT_UPGRADE;
use uuid::Uuid;

use super::support::{ApiState, error};

pub(super) async fn connect(
    State(state): State<ApiState>,
    Path((id, port)): Path<(Uuid, u16)>,
    mut request: Request,
) -> Response {
    let asks_upgrade = request.headers().get(header::UPGRADE).is_some_and(|value| {
        value
            .as_bytes()
            .eq_ignore_ascii_case(PORT_UPGRADE.as_bytes())
    });
    let Some(on_upgrade) = request
        .extensions_mut()
        .remove::<hyper::upgrade::OnUpgrade>()
        .filter(|_| asks_upgrade)
    else {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            format!("a port connection is an upgrade to `{PORT_UPGRADE}`"),
        );
    };
    let (active, stream) = match state.node.open_port(id, port).await {
        Ok(opened) => opened,
        Err(refused) => return refused.into_response(),
    };
    let node = std::sync::Arc::clone(&state.node);
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(upgraded) => node.carry_preview(id, TokioIo::new(upgraded), stream).await,
            Err(failed) => tracing::debug!(%id, error = %failed, "preview upgrade failed"),
        }
        drop(active);
    });
    let mut response = StatusCode::SWITCHING_PROTOCOLS.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static(PORT_UPGRADE));
    response
}
