//! The engine view: what `GET /v1/engine/snapshot` and `GET /v1/engine/events` serve.
//!
//! The engine thread publishes; handlers only read. After a step (at most every
//! [`PUBLISH_EVERY`], or at once when something happened) and while idle with someone
//! watching, the [`Publisher`] builds a [`EngineSnapshot`] from `Engine::observe` into a
//! `watch` channel, and turns the engine's happenings into [`TimelineEvent`]s on a
//! bounded `broadcast` channel. A slow reader lags and skips (its stream then sends a
//! fresh snapshot); nothing it does reaches the engine thread. Per token the publisher
//! counts a few integers ([`throughput`]); everything else happens a few times a second.
//!
//! This module shapes the JSON; the engine reports requests, sessions and windows.

mod throughput;

use std::sync::Arc;
use std::time::{Duration, Instant};

use pyramid_engine::{
    ArtifactState, Engine as Core, EngineView, Happening, RequestId, SessionKey, SessionState, What,
};
use pyramid_runtime::ArtifactShape;
use serde::Serialize;
use tokio::sync::{broadcast, watch};

pub(crate) use self::throughput::Throughput;
pub use self::throughput::{PriorityThroughput, ThroughputReport};

/// How often the engine thread publishes a snapshot while it steps or someone watches.
pub const PUBLISH_EVERY: Duration = Duration::from_millis(250);
/// Timeline events a subscriber may fall behind by before it skips to a snapshot.
const TIMELINE_CAPACITY: usize = 256;

/// One session in a snapshot.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SessionJson {
    /// `req-N` for a request, `cache-N` for a cached conversation.
    pub id: String,
    pub state: &'static str,
    pub priority: i32,
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    pub context_tokens: usize,
    pub window: Option<usize>,
    pub age_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ArtifactJson {
    pub kind: &'static str,
    /// Tokens per run: a prefill's chunk, a decode's batch, a mixed pass's rows.
    pub rows: usize,
    pub state: &'static str,
    pub compiling_ms: Option<u64>,
    pub bytes: Option<usize>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RungJson {
    pub window: usize,
    pub artifacts: Vec<ArtifactJson>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KvJson {
    pub used_bytes: usize,
    pub reserved_bytes: usize,
    pub budget_bytes: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ArtifactBudgetJson {
    pub used_bytes: usize,
    pub budget_bytes: usize,
}

/// The engine at one moment, as the engine thread publishes it (the handler adds the
/// model and route).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EngineSnapshot {
    /// Milliseconds since the server started.
    pub time_ms: u64,
    pub sessions: Vec<SessionJson>,
    pub ladder: Vec<RungJson>,
    pub kv: KvJson,
    pub artifacts: ArtifactBudgetJson,
    pub throughput: ThroughputReport,
}

/// One thing the engine did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TimelineEvent {
    pub time_ms: u64,
    pub kind: &'static str,
    pub session: Option<String>,
    pub window: Option<usize>,
    pub from_window: Option<usize>,
    pub detail: Option<String>,
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn request_key(id: RequestId) -> String {
    format!("req-{id}")
}

fn cache_key(key: u64) -> String {
    format!("cache-{key}")
}

/// An artifact shape's kind and the tokens one run takes.
fn kind_rows(shape: ArtifactShape) -> (&'static str, usize) {
    match shape {
        ArtifactShape::Prefill { chunk, .. } => ("prefill", chunk),
        ArtifactShape::Decode { batch, .. } => ("decode", batch),
        ArtifactShape::Mixed { rows, .. } => ("mixed", rows),
    }
}

fn describe(shape: ArtifactShape) -> String {
    let (kind, rows) = kind_rows(shape);
    format!("{kind} {rows} rows")
}

impl EngineSnapshot {
    /// Shapes `view` at `now`, `started` being the server's start.
    pub fn new(
        view: &EngineView,
        throughput: ThroughputReport,
        started: Instant,
        now: Instant,
    ) -> Self {
        let sessions = view
            .sessions
            .iter()
            .map(|s| SessionJson {
                id: match s.key {
                    SessionKey::Request(id) => request_key(id),
                    SessionKey::Cached(key) => cache_key(key),
                },
                state: match s.state {
                    SessionState::Running => "running",
                    SessionState::Paused => "paused",
                    SessionState::Queued => "queued",
                    SessionState::Cached => "cached",
                    SessionState::Swapped => "swapped",
                },
                priority: s.priority,
                prompt_tokens: s.prompt_len,
                generated_tokens: s.n_generated,
                context_tokens: s.context_len,
                window: s.window,
                age_ms: millis(now.saturating_duration_since(s.since)),
            })
            .collect();
        let ladder = view
            .ladder
            .iter()
            .map(|rung| RungJson {
                window: rung.window,
                artifacts: rung
                    .artifacts
                    .iter()
                    .map(|a| {
                        let (kind, rows) = kind_rows(a.shape);
                        ArtifactJson {
                            kind,
                            rows,
                            state: match a.state {
                                ArtifactState::Resident => "resident",
                                ArtifactState::Compiling => "compiling",
                                ArtifactState::Evicted => "evicted",
                            },
                            compiling_ms: a.compiling_for.map(millis),
                            bytes: a.bytes,
                        }
                    })
                    .collect(),
            })
            .collect();
        Self {
            time_ms: millis(now.saturating_duration_since(started)),
            sessions,
            ladder,
            kv: KvJson {
                used_bytes: view.kv_used_bytes,
                reserved_bytes: view.kv_reserved_bytes,
                budget_bytes: view.kv_budget_bytes,
            },
            artifacts: ArtifactBudgetJson {
                used_bytes: view.artifact_bytes,
                budget_bytes: view.artifact_budget_bytes,
            },
            throughput,
        }
    }
}

impl TimelineEvent {
    /// Shapes `h`, `started` being the server's start.
    pub fn new(h: &Happening, started: Instant) -> Self {
        let mut e = TimelineEvent {
            time_ms: millis(h.at.saturating_duration_since(started)),
            kind: "",
            session: None,
            window: None,
            from_window: None,
            detail: None,
        };
        let request = |id: RequestId| Some(request_key(id));
        match h.what {
            What::Admitted { id, cached_tokens } => {
                e.kind = "admitted";
                e.session = request(id);
                e.detail = (cached_tokens > 0)
                    .then(|| format!("{cached_tokens} prompt tokens from a cached conversation"));
            }
            What::Finished { id, reason } => {
                e.kind = "finished";
                e.session = request(id);
                e.detail = Some(reason.map_or("failed", |r| r.as_str()).to_string());
            }
            What::CompileStarted { shape } => {
                e.kind = "compile_started";
                e.window = Some(shape.window());
                e.detail = Some(describe(shape));
            }
            What::CompileFinished { shape, took, ok } => {
                e.kind = "compile_finished";
                e.window = Some(shape.window());
                let outcome = if ok { "in" } else { "failed after" };
                e.detail = Some(format!("{} {outcome} {} ms", describe(shape), millis(took)));
            }
            What::ArtifactEvicted { shape } => {
                e.kind = "evicted";
                e.window = Some(shape.window());
                e.detail = Some(format!("artifact {}", describe(shape)));
            }
            What::SessionEvicted { key, tokens } => {
                e.kind = "evicted";
                e.session = Some(cache_key(key));
                e.detail = Some(format!("cached conversation of {tokens} tokens"));
            }
            What::Stall { id, window, waited } => {
                e.kind = "stall";
                e.session = request(id);
                e.window = Some(window);
                e.detail = Some(format!("waited {} ms", millis(waited)));
            }
            What::Migration {
                id,
                from,
                to,
                reprefill,
            } => {
                e.kind = "migration";
                e.session = request(id);
                e.window = Some(to);
                e.from_window = from;
                e.detail = reprefill.then(|| "context prefilled again".to_string());
            }
            What::Fork { id, shared } => {
                e.kind = "fork";
                e.session = request(id);
                e.detail = Some(format!("{shared} tokens shared"));
            }
            What::Pause { id } => {
                e.kind = "pause";
                e.session = request(id);
            }
            What::Resume { id } => {
                e.kind = "resume";
                e.session = request(id);
            }
            What::SwapOut { id } => {
                e.kind = "swap_out";
                e.session = request(id);
            }
            What::SwapIn { id } => {
                e.kind = "swap_in";
                e.session = request(id);
            }
            What::Cached {
                key,
                tokens,
                window,
            } => {
                e.kind = "cached";
                e.session = Some(cache_key(key));
                e.window = window;
                e.detail = Some(format!("{tokens} tokens"));
            }
            What::Restored { id, tokens } => {
                e.kind = "restored";
                e.session = id.map(request_key);
                e.detail = Some(format!("{tokens} tokens from the session store"));
            }
        }
        e
    }
}

/// What handlers read: the latest snapshot and the timeline.
pub struct EngineWatch {
    /// When the server started: every `time_ms` counts from here.
    pub started: Instant,
    snapshot: watch::Sender<Arc<EngineSnapshot>>,
    timeline: broadcast::Sender<Arc<TimelineEvent>>,
}

impl EngineWatch {
    /// The latest snapshot.
    pub fn latest(&self) -> Arc<EngineSnapshot> {
        Arc::clone(&self.snapshot.borrow())
    }

    /// Timeline events from now on.
    pub fn timeline(&self) -> broadcast::Receiver<Arc<TimelineEvent>> {
        self.timeline.subscribe()
    }

    fn has_watchers(&self) -> bool {
        self.timeline.receiver_count() > 0
    }
}

/// The engine thread's side: counts tokens, and publishes snapshots and the timeline.
pub(crate) struct Publisher {
    shared: Arc<EngineWatch>,
    throughput: Throughput,
    last: Instant,
    /// Something changed since the last snapshot.
    dirty: bool,
    /// Reused for each drain of the engine's happenings.
    happenings: Vec<Happening>,
}

impl Publisher {
    /// Starts watching `core` and publishes its first snapshot; returns the handlers'
    /// side with it.
    pub fn new(core: &mut Core) -> (Self, Arc<EngineWatch>) {
        core.watch();
        let started = Instant::now();
        let mut throughput = Throughput::new(started);
        let first = EngineSnapshot::new(
            &core.observe(),
            throughput.report(started),
            started,
            started,
        );
        let (snapshot, _) = watch::channel(Arc::new(first));
        let (timeline, _) = broadcast::channel(TIMELINE_CAPACITY);
        let shared = Arc::new(EngineWatch {
            started,
            snapshot,
            timeline,
        });
        let publisher = Self {
            shared: Arc::clone(&shared),
            throughput,
            last: started,
            dirty: false,
            happenings: Vec::new(),
        };
        (publisher, shared)
    }

    pub fn token(&mut self, priority: i32) {
        self.throughput.token(priority);
    }

    pub fn first_token(&mut self, priority: i32, ttft: Duration) {
        self.throughput.first_token(priority, ttft);
    }

    pub fn finished(&mut self, priority: i32) {
        self.throughput.finished(priority);
    }

    /// After a step: the timeline goes out, and a snapshot if one is due.
    pub fn after_step(&mut self, core: &mut Core) {
        self.dirty = true;
        self.drain(core);
        if self.last.elapsed() >= PUBLISH_EVERY {
            self.publish(core);
        }
    }

    /// With nothing to step: what is not published yet is, so the view shows the
    /// engine's resting state.
    pub fn settle(&mut self, core: &mut Core) {
        self.drain(core);
        if self.dirty {
            self.publish(core);
        }
    }

    /// How long an idle engine thread may wait for work before [`Publisher::tick`]:
    /// forever (`None`) unless someone watches or artifacts compile in the background.
    pub fn idle_wait(&self, core: &Core) -> Option<Duration> {
        (self.shared.has_watchers() || core.pyramid().n_compiling() > 0).then_some(PUBLISH_EVERY)
    }

    /// Idle: background compiles reach the timeline, and a snapshot goes out if due.
    pub fn tick(&mut self, core: &mut Core) {
        self.drain(core);
        if self.dirty || self.last.elapsed() >= PUBLISH_EVERY {
            self.publish(core);
        }
    }

    fn drain(&mut self, core: &mut Core) {
        core.drain_happenings(&mut self.happenings);
        if self.happenings.is_empty() {
            return;
        }
        self.dirty = true;
        if self.shared.has_watchers() {
            for h in &self.happenings {
                // Nobody subscribed in between: nothing to send to.
                let _ = self
                    .shared
                    .timeline
                    .send(Arc::new(TimelineEvent::new(h, self.shared.started)));
            }
        }
        self.happenings.clear();
    }

    fn publish(&mut self, core: &Core) {
        let now = Instant::now();
        let snapshot = EngineSnapshot::new(
            &core.observe(),
            self.throughput.report(now),
            self.shared.started,
            now,
        );
        self.shared.snapshot.send_replace(Arc::new(snapshot));
        self.last = now;
        self.dirty = false;
    }
}

#[cfg(test)]
mod tests;
