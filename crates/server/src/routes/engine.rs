//! The engine view's endpoints: `GET /v1/engine/snapshot` (one JSON snapshot) and
//! `GET /v1/engine/events` (server-sent events: a snapshot at once and every
//! [`SNAPSHOT_EVERY`], a timeline event for each thing the engine does). Both only read
//! what the engine thread publishes (`crate::engine_view`); a client that stops reading
//! falls behind on its own channel and skips to a fresh snapshot.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use futures_util::stream;
use serde::Serialize;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::broadcast::Receiver;
use tokio::time::{interval_at, Instant, Interval, MissedTickBehavior};

use super::AppState;
use crate::engine_view::{EngineSnapshot, TimelineEvent};

/// How often the events stream sends a snapshot (the engine thread publishes as often).
const SNAPSHOT_EVERY: Duration = crate::engine_view::PUBLISH_EVERY;

/// A snapshot with the server's model and route.
#[derive(Serialize)]
struct Snapshot<'a> {
    model: &'a str,
    route: String,
    #[serde(flatten)]
    engine: &'a EngineSnapshot,
}

fn snapshot_json(state: &AppState) -> String {
    let latest = state.engine.view().latest();
    let snapshot = Snapshot {
        model: &state.model_id,
        route: state.metrics.route_name(),
        engine: &latest,
    };
    serde_json::to_string(&snapshot).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

pub(super) async fn snapshot(State(state): State<Arc<AppState>>) -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        snapshot_json(&state),
    )
        .into_response()
}

/// One server-sent event.
fn frame(event: &str, data: &str) -> Bytes {
    Bytes::from(format!("event: {event}\ndata: {data}\n\n"))
}

/// The stream's state: what it reads, and whether the first snapshot went out.
struct Pump {
    state: Arc<AppState>,
    timeline: Receiver<Arc<TimelineEvent>>,
    ticks: Interval,
    started: bool,
}

impl Pump {
    /// The next frame, or `None` once the server is shutting down.
    async fn next(&mut self) -> Option<Bytes> {
        if !std::mem::replace(&mut self.started, true) {
            return Some(frame("snapshot", &snapshot_json(&self.state)));
        }
        tokio::select! {
            biased;
            event = self.timeline.recv() => match event {
                Ok(event) => {
                    let data = serde_json::to_string(&*event).unwrap_or_default();
                    Some(frame("timeline", &data))
                }
                // Fell behind: what was skipped shows in a fresh snapshot.
                Err(RecvError::Lagged(_)) => Some(frame("snapshot", &snapshot_json(&self.state))),
                Err(RecvError::Closed) => None,
            },
            _ = self.ticks.tick() => {
                self.state.engine.is_admitting()
                    .then(|| frame("snapshot", &snapshot_json(&self.state)))
            }
        }
    }
}

pub(super) async fn events(State(state): State<Arc<AppState>>) -> Response {
    let timeline = state.engine.view().timeline();
    let mut ticks = interval_at(Instant::now() + SNAPSHOT_EVERY, SNAPSHOT_EVERY);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let pump = Pump {
        state,
        timeline,
        ticks,
        started: false,
    };
    let body = stream::unfold(pump, |mut pump| async move {
        let bytes = pump.next().await?;
        Some((Ok::<_, std::convert::Infallible>(bytes), pump))
    });
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(body),
    )
        .into_response()
}

#[cfg(test)]
#[path = "engine_tests.rs"]
mod tests;
