//! Connections to a port inside a sandbox (for preview URLs): an upgrade of a call to the
//! sandbox's worker, which connects inside the sandbox's network namespace and from then on
//! carries raw bytes.

use reqwest::header::{CONNECTION, UPGRADE};
use sandbase_api::internal::{PORT_UPGRADE, paths};
use uuid::Uuid;

use super::WorkerAddress;
use super::client::{WorkerClient, WorkerError};

impl WorkerClient {
    /// A byte stream to `127.0.0.1:port` inside sandbox `id` on `worker`.
    pub async fn open_port(
        &self,
        worker: &WorkerAddress,
        id: Uuid,
        port: u16,
    ) -> Result<reqwest::Upgraded, WorkerError> {
        let path = paths::port(&id.to_string(), &port.to_string());
        let answer = self
            .request(reqwest::Method::GET, worker, &path)
            .header(CONNECTION, "upgrade")
            .header(UPGRADE, PORT_UPGRADE)
            .send()
            .await
            .map_err(|error| {
                tracing::warn!(error = %error, "calling a worker (port) failed");
                WorkerError::Unreachable("the worker did not answer (port)".to_owned())
            })?;
        if answer.status() != reqwest::StatusCode::SWITCHING_PROTOCOLS {
            return Err(WorkerError::from_answer(answer).await);
        }
        answer.upgrade().await.map_err(|error| {
            tracing::warn!(error = %error, "a worker's port upgrade failed");
            WorkerError::Failed("the worker's port connection failed".to_owned())
        })
    }
}
