//! The engine: one core that every entry point drives, on the window pyramid.
//!
//! - [`Engine`]: requests in, token events out. Each [`Engine::step`] is
//!   [`Engine::schedule`] → [`Engine::execute`] → [`Engine::update`] with plain data
//!   between them ([`Schedule`], [`Executed`], [`Event`]): continuous batching, chunked
//!   prefill interleaved with decode, prefix reuse, KV and session budgets, window
//!   migration, predictive compiles, on any backend route.
//! - [`WindowPyramid`]: the artifact side of the ladder of static-shape windows (the
//!   artifact cache and background compiles; [`Arm`] names the window policies).
//! - [`GrowthPredictor`]: when a session will outgrow its window, from its own growth.
//! - [`replay`]: agent traces (JSONL or synthetic) run through the engine under every
//!   arm, with the figures `pyramid replay` reports.
//!
//! Invariant: a request's tokens depend only on its prompt and sampling settings: not
//! on the batch around it, the arm, the window it runs on, or whether its prefix came
//! from the cache.

mod admission;
mod audit;
mod boundary;
mod constrain;
mod engine;
mod error;
mod executor;
mod persist;
mod predictor;
mod prefix_cache;
mod pyramid;
pub mod replay;
mod request;
mod scheduler;
mod session;
mod session_store;
mod speculate;
mod step_logits;

// The scheduler tests' fake backend, shared with the unit tests that need an engine.
#[cfg(test)]
extern crate self as pyramid_engine;
#[cfg(test)]
#[path = "../tests/common/mod.rs"]
mod test_harness;

pub use admission::PreemptionStats;
pub use audit::{RouteAudit, StageAudit};
pub use boundary::panic_message;
pub use engine::{Completion, Engine, EngineConfig, EngineStats, StepSummary, DEFAULT_AGING};
pub use error::{EngineError, Result};
pub use executor::Executed;
pub use persist::PersistStats;
pub use predictor::GrowthPredictor;
pub use prefix_cache::common_prefix;
pub use pyramid::{Arm, ArtifactPair, PyramidConfig, PyramidStats, WindowPyramid};
pub use request::{Event, FinishReason, Request, RequestId, Timings, TokenLogprobs, Usage};
pub use scheduler::{decode_batches, DecodeRun, Move, Schedule};
pub use session::Session;
pub use session_store::{
    load_session, read_header, save_session, SaveReport, SessionHeader, SessionIdentity,
    SessionStore, StoreError, StoredSession, SESSION_EXT, SESSION_VERSION,
};
pub use speculate::{DraftStats, Speculation, SpeculativeConfig, MAX_COOL_DOWN};
pub use step_logits::StepLogits;
