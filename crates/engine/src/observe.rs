//! What the engine shows a watcher (the server's engine view): its sessions and the
//! window ladder as plain data ([`EngineView`], built on request), and what happened
//! since the last look ([`Happening`]s, recorded only once someone watches).
//!
//! The engine reports requests, sessions, windows and artifact shapes; how they are
//! named on a wire is the caller's business.

use std::time::{Duration, Instant};

use pyramid_runtime::ArtifactShape;

use crate::request::{FinishReason, RequestId};

/// Where a session is, as a watcher sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionState {
    /// In the batch (prefilling, decoding, or stalled at a window crossing).
    Running,
    /// Out of the batch for a more urgent sequence, keeping its KV.
    Paused,
    /// Waiting for admission (or for its conversation to be read from disk).
    Queued,
    /// A finished conversation kept in memory for reuse.
    Cached,
    /// Out of the batch with its KV given up.
    Swapped,
}

/// Who a session belongs to: a request, or (cached) the prefix cache's key for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionKey {
    Request(RequestId),
    Cached(u64),
}

/// One session as the engine holds it now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionView {
    pub key: SessionKey,
    pub state: SessionState,
    /// The request's priority (lower is more urgent); a cached session has none: 0.
    pub priority: i32,
    pub prompt_len: usize,
    pub n_generated: usize,
    /// Tokens whose KV the session holds.
    pub context_len: usize,
    /// The rung of the window ladder it is placed on, once it has one.
    pub window: Option<usize>,
    /// Since it arrived (a request) or was cached.
    pub since: Instant,
}

/// Whether an artifact the pyramid has known is usable now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArtifactState {
    Resident,
    Compiling,
    /// Compiled once, dropped to stay within the artifact budget.
    Evicted,
}

/// One artifact shape on a rung.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArtifactView {
    pub shape: ArtifactShape,
    pub state: ArtifactState,
    /// How long it has been compiling (while `Compiling`).
    pub compiling_for: Option<Duration>,
    /// Memory it holds (while `Resident`).
    pub bytes: Option<usize>,
}

/// One rung of the window ladder and the artifacts compiled for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RungView {
    pub window: usize,
    pub artifacts: Vec<ArtifactView>,
}

/// The engine at one moment: sessions, the ladder, and memory against its budgets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EngineView {
    /// Running, paused, queued, swapped and cached sessions, in that order.
    pub sessions: Vec<SessionView>,
    /// Smallest window first.
    pub ladder: Vec<RungView>,
    pub kv_used_bytes: usize,
    pub kv_reserved_bytes: usize,
    pub kv_budget_bytes: usize,
    pub artifact_bytes: usize,
    pub artifact_budget_bytes: usize,
}

/// Something the engine did, at `at`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Happening {
    pub at: Instant,
    pub what: What,
}

/// What happened: one variant per kind of event a watcher follows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum What {
    /// A request entered the batch, reusing `cached_tokens` of its prompt.
    Admitted {
        id: RequestId,
        cached_tokens: usize,
    },
    /// A request ended (`None`: it failed).
    Finished {
        id: RequestId,
        reason: Option<FinishReason>,
    },
    CompileStarted {
        shape: ArtifactShape,
    },
    /// A compile ended after `took` (`ok` false: it failed).
    CompileFinished {
        shape: ArtifactShape,
        took: Duration,
        ok: bool,
    },
    /// An artifact dropped to stay within the artifact budget.
    ArtifactEvicted {
        shape: ArtifactShape,
    },
    /// A cached conversation left memory (to the session store, or freed).
    SessionEvicted {
        key: u64,
        tokens: usize,
    },
    /// A sequence waited `waited` for a window's artifacts or memory before moving to it.
    Stall {
        id: RequestId,
        window: usize,
        waited: Duration,
    },
    /// A sequence moved up the ladder (`reprefill`: its context prefilled again rather
    /// than its KV migrated).
    Migration {
        id: RequestId,
        from: Option<usize>,
        to: usize,
        reprefill: bool,
    },
    /// A request copied the `shared` tokens of prefix it shares with another
    /// conversation, which stays whole.
    Fork {
        id: RequestId,
        shared: usize,
    },
    Pause {
        id: RequestId,
    },
    Resume {
        id: RequestId,
    },
    /// A paused sequence gave its KV up for memory.
    SwapOut {
        id: RequestId,
    },
    /// A swapped-out sequence entered the batch again.
    SwapIn {
        id: RequestId,
    },
    /// A conversation went to the prefix cache under `key`.
    Cached {
        key: u64,
        tokens: usize,
        window: Option<usize>,
    },
    /// A stored conversation came back from the session store (for request `id`, or
    /// imported into the prefix cache).
    Restored {
        id: Option<RequestId>,
        tokens: usize,
    },
}

/// Happenings kept until the watcher drains them. Off until someone watches, so other
/// drivers pay nothing; bounded, so a watcher that stops draining costs little.
#[derive(Debug, Default)]
pub(crate) struct HappeningLog {
    on: bool,
    items: Vec<Happening>,
}

/// Happenings kept undrained at most; the oldest go first.
const MAX_KEPT: usize = 4096;

impl HappeningLog {
    pub fn enable(&mut self) {
        self.on = true;
    }

    pub fn record(&mut self, what: What) {
        if !self.on {
            return;
        }
        if self.items.len() >= MAX_KEPT {
            self.items.drain(..MAX_KEPT / 2);
        }
        self.items.push(Happening {
            at: Instant::now(),
            what,
        });
    }

    /// Moves the happenings into `out`, oldest first.
    pub fn drain_into(&mut self, out: &mut Vec<Happening>) {
        out.append(&mut self.items);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_records_only_once_enabled_and_stays_bounded() {
        let mut log = HappeningLog::default();
        log.record(What::Pause { id: 1 });
        let mut out = Vec::new();
        log.drain_into(&mut out);
        assert!(out.is_empty());
        log.enable();
        for id in 0..(MAX_KEPT as u64 + 10) {
            log.record(What::Pause { id });
        }
        log.drain_into(&mut out);
        assert!(out.len() <= MAX_KEPT);
        assert_eq!(
            out.last().map(|h| h.what.clone()),
            Some(What::Pause {
                id: MAX_KEPT as u64 + 9
            })
        );
        log.drain_into(&mut out);
        assert!(out.len() <= MAX_KEPT);
    }
}
