//! `sandbase sandbox snapshot` and `snapshots`: a sandbox's state kept to start others from.

use sandbase_api::snapshots::{Snapshot, SnapshotList};
use serde_json::json;
use uuid::Uuid;

use crate::client::Client;
use crate::output::{emit, table, time};
use crate::transfer::human_bytes;

pub async fn take(client: &Client, json: bool, id: Uuid) -> anyhow::Result<()> {
    let snapshot: Snapshot = client
        .post(&format!("/v1/sandboxes/{id}/snapshots"), &json!({}))
        .await?;
    if !json {
        eprintln!(
            "snapshot of {id} taken ({}), kept until {}",
            human_bytes(snapshot.size_bytes.max(0) as u64),
            time(&snapshot.expires_at)
        );
    }
    emit(json, &snapshot, |snapshot| println!("{}", snapshot.id))
}

pub async fn list(client: &Client, json: bool) -> anyhow::Result<()> {
    let list: SnapshotList = client.get("/v1/snapshots", &[]).await?;
    emit(json, &list, |list| {
        let rows: Vec<Vec<String>> = list
            .snapshots
            .iter()
            .map(|snapshot| {
                vec![
                    snapshot.id.to_string(),
                    snapshot.sandbox_id.to_string(),
                    snapshot.template.clone(),
                    human_bytes(snapshot.size_bytes.max(0) as u64),
                    time(&snapshot.created_at),
                    time(&snapshot.expires_at),
                ]
            })
            .collect();
        table(
            &["ID", "SANDBOX", "TEMPLATE", "SIZE", "TAKEN", "EXPIRES"],
            &rows,
        );
    })
}
