//! A sandbox's egress policy and its flow log.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use uuid::Uuid;

use crate::node::NodeError;

use super::support::ApiState;

pub(super) async fn set_egress_policy(
    State(state): State<ApiState>,
    Path(id): Path<Uuid>,
    Json(policy): Json<sandbase_api::sandboxes::EgressPolicy>,
) -> Result<StatusCode, NodeError> {
    let hosted = state.node.get(id)?;
    let (Some(network), Some(link)) = (state.node.network(), &hosted.link) else {
        return Err(NodeError::Invalid(
            "this sandbox was created without egress".to_owned(),
        ));
    };
    let policy = sandbase_egress::Policy::parse(&policy.allow, &policy.deny)
        .map_err(|why| NodeError::Invalid(format!("`egress`: {why}")))?;
    network.set_policy(link, id, policy).await;
    Ok(StatusCode::NO_CONTENT)
}

pub(super) async fn egress_flows(
    State(state): State<ApiState>,
    Path(id): Path<Uuid>,
) -> Result<Json<sandbase_api::sandboxes::EgressFlowList>, NodeError> {
    state.node.get(id)?;
    let flows = state
        .node
        .network()
        .map(|network| network.flows(id))
        .unwrap_or_default();
    Ok(Json(sandbase_api::sandboxes::EgressFlowList {
        flows: flows
            .into_iter()
            .map(|flow| {
                let (decision, reason) = match flow.decision {
                    sandbase_egress::proxy::Decision::Allowed if !flow.credentials.is_empty() => {
                        ("injected", None)
                    }
                    sandbase_egress::proxy::Decision::Allowed => ("allowed", None),
                    sandbase_egress::proxy::Decision::Denied(why) => ("denied", Some(why)),
                    sandbase_egress::proxy::Decision::Failed(why) => ("failed", Some(why)),
                };
                sandbase_api::sandboxes::EgressFlow {
                    at: chrono::DateTime::<chrono::Utc>::from(flow.started_at),
                    host: flow.host,
                    port: flow.port,
                    mode: flow.mode.to_owned(),
                    decision: decision.to_owned(),
                    credentials: flow.credentials,
                    reason,
                    address: flow.address.map(|address| address.to_string()),
                    bytes_up: flow.bytes_up,
                    bytes_down: flow.bytes_down,
                    duration_ms: flow.duration.as_millis() as u64,
                }
            })
            .collect(),
    }))
}
