//! The engine: one core that every entry point drives, on the window pyramid.
//!
//! - [`Engine`]: requests in, token events out. It composes three parts, each with its
//!   own state, and each [`Engine::step`] passes plain data between them, as in vLLM v1:
//!   - [`Scheduler`]: the queued, running and paused sequences (each with its
//!     [`SequenceStatus`]), the prefix cache, the KV and session budgets, admission by
//!     priority with aging. `schedule() -> Schedule`, then `update(Executed)` samples
//!     and returns [`Event`]s. It runs no pass and touches no file: artifacts are a
//!     question to [`Artifacts`], stored conversations come through [`StoredPrefixes`].
//!   - [`Executor`]: the backend and the window pyramid's artifacts, placements and
//!     migrations, mixed passes and static runs. `execute(&Schedule, Batch) -> Executed`,
//!     on the sessions the scheduler lends it for the step ([`Batch`]).
//!   - the session writer: conversations evicted from memory go to disk, and stored
//!     ones come back for a request that resumes them; those not written are freed
//!     off the engine thread (`reclaim`).
//! - [`WindowPyramid`]: the artifact side of the ladder of static-shape windows (the
//!   artifact cache and background compiles; [`Arm`] names the window policies).
//! - [`GrowthPredictor`]: when a session will outgrow its window, from its own growth.
//! - [`EngineView`] and [`Happening`]: what a watcher sees (`Engine::observe`, and what
//!   `Engine::drain_happenings` returns once `Engine::watch` is on).
//! - [`replay`]: agent traces (JSONL or synthetic) run through the engine under every
//!   arm, with the figures `pyramid replay` reports.
//!
//! Invariants: a request's tokens depend only on its prompt and sampling settings: not
//! on the batch around it, the arm, the window it runs on, or whether its prefix came
//! from the cache. A panic in one request's work fails that request alone. No module
//! here imports in a circle (`tests/architecture.rs`).

mod audit;
mod boundary;
mod config;
mod engine;
mod error;
mod executor;
mod kv;
mod observe;
mod persist;
mod predictor;
mod prefix_cache;
mod pyramid;
mod reclaim;
pub mod replay;
mod request;
mod scheduler;
mod sequence;
mod session;
mod session_store;
mod speculate;
mod step;
mod step_logits;

// The scheduler tests' fake backend, shared with the unit tests that need an engine.
#[cfg(test)]
extern crate self as pyramid_engine;
#[cfg(test)]
#[path = "../tests/common/mod.rs"]
mod test_harness;

pub use audit::{RouteAudit, StageAudit};
pub use boundary::panic_message;
pub use config::{EngineConfig, DEFAULT_AGING};
pub use engine::{Completion, Engine, EngineStats};
pub use error::{EngineError, Result};
pub use executor::Executor;
pub use observe::{
    ArtifactState, ArtifactView, EngineView, Happening, RungView, SessionKey, SessionState,
    SessionView, What,
};
pub use persist::PersistStats;
pub use predictor::GrowthPredictor;
pub use prefix_cache::common_prefix;
pub use pyramid::{Arm, ArtifactPair, Build, PyramidConfig, PyramidStats, WindowPyramid};
pub use pyramid_model::Pooling;
pub use request::{Event, FinishReason, Request, RequestId, Timings, TokenLogprobs, Usage};
pub use scheduler::{Artifacts, NoStore, PreemptionStats, Scheduler, Stored, StoredPrefixes};
pub use sequence::SequenceStatus;
pub use session::Session;
pub use session_store::{
    load_session, read_header, save_session, SaveReport, SessionHeader, SessionIdentity,
    SessionStore, StoreError, StoredSession, SESSION_EXT, SESSION_VERSION,
};
pub use speculate::{DraftStats, Speculation, SpeculativeConfig, MAX_COOL_DOWN};
pub use step::{decode_batches, Batch, DecodeRun, Executed, Move, Schedule, Slot, StepSummary};
pub use step_logits::StepLogits;
