//! A run's stream read from its journal: a page after a `seq`, or followed — the journal
//! after the client's last `seq`, then each new event as it is written (told at once by
//! this gateway's loop, read every half second for runs stepped elsewhere) until the run
//! ends. Live and replayed events are the same rows, so a client reconnecting to any
//! gateway sees every `seq` once, byte for byte.

use std::collections::VecDeque;
use std::time::Duration;

use futures_util::Stream;
use sandbase_api::agent_runs::AgentRunEvent;
use uuid::Uuid;

use super::rows;
use crate::state::AppState;

/// Events read at once at most.
const PAGE: i64 = 500;

/// When a followed stream ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Until {
    /// The run ended.
    Ended,
    /// The run stopped being stepped (it waits for its client, or ended).
    Stopped,
}

struct Follow {
    state: AppState,
    run_id: Uuid,
    until: Until,
    after: i64,
    ready: VecDeque<AgentRunEvent>,
    told: tokio::sync::broadcast::Receiver<Uuid>,
    ended: bool,
}

/// The run's events after `after`, then as they come, until the run has ended (or stopped,
/// as `until` says) and every event was given.
pub fn follow(
    state: AppState,
    run_id: Uuid,
    after: i64,
    until: Until,
) -> impl Stream<Item = Result<AgentRunEvent, sqlx::Error>> {
    let told = state.harness.events.subscribe();
    let start = Follow {
        state,
        run_id,
        until,
        after,
        ready: VecDeque::new(),
        told,
        ended: false,
    };
    futures_util::stream::unfold(start, |mut follow| async move {
        loop {
            if let Some(event) = follow.ready.pop_front() {
                follow.after = event.seq;
                return Some((Ok(event), follow));
            }
            if follow.ended {
                return None;
            }
            match read(&mut follow).await {
                Ok(true) => {}
                Ok(false) => wait(&mut follow).await,
                Err(error) => {
                    follow.ended = true;
                    return Some((Err(error), follow));
                }
            }
        }
    })
}

/// Reads what is there after `after`; false when nothing was.
async fn read(follow: &mut Follow) -> Result<bool, sqlx::Error> {
    let mut connection = follow.state.db.acquire().await?;
    // The status first: a run that ended before this read has all its events written.
    let status: Option<(super::lifecycle::Status,)> =
        sqlx::query_as("SELECT status FROM agent_runs WHERE id = $1")
            .bind(follow.run_id)
            .fetch_optional(&mut *connection)
            .await?;
    let events = rows::events(&mut connection, follow.run_id, follow.after, PAGE).await?;
    let over = status.is_none_or(|(status,)| match follow.until {
        Until::Ended => status.is_final(),
        Until::Stopped => status.has_stopped(),
    });
    if events.is_empty() && over {
        follow.ended = true;
    }
    let found = !events.is_empty();
    follow.ready.extend(events);
    Ok(found || follow.ended)
}

/// Until this gateway tells of a new event of the run, or half a second.
async fn wait(follow: &mut Follow) {
    let run_id = follow.run_id;
    let told = async {
        loop {
            match follow.told.recv().await {
                Ok(id) if id == run_id => return,
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                    return std::future::pending().await;
                }
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_millis(500), told).await;
}

/// The run once it has stopped being stepped (it waits for its client, or ended).
pub async fn until_stopped(
    state: &AppState,
    team_id: Uuid,
    run_id: Uuid,
) -> Result<rows::AgentRunRow, crate::error::ApiError> {
    let mut told = state.harness.events.subscribe();
    loop {
        let mut connection = state.db.acquire().await?;
        let row = rows::fetch(&mut connection, team_id, run_id).await?;
        drop(connection);
        if row.status.has_stopped() {
            return Ok(row);
        }
        let _ = tokio::time::timeout(Duration::from_millis(500), async {
            loop {
                match told.recv().await {
                    Ok(id) if id == run_id => return,
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                        return std::future::pending().await;
                    }
                    _ => {}
                }
            }
        })
        .await;
    }
}
