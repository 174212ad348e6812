//! The engine above the runtime: the window pyramid and the replay of agent sessions.
//!
//! - [`WindowPyramid`] / [`PyramidSession`]: sessions on a ladder of static-shape windows,
//!   moved up by copying their live KV cache ([`Arm`] names the strategies compared).
//! - [`GrowthPredictor`]: when a session will outgrow its window, from its own growth.
//! - [`replay`]: agent traces (JSONL or synthetic) run under every arm, with the figures
//!   `pyramid replay` reports.
//!
//! Invariant: the arms differ only in when artifacts are compiled and how a session moves
//! between windows; the tokens a session produces are the same under all of them.

mod error;
mod predictor;
mod pyramid;
pub mod replay;

pub use error::{EngineError, Result};
pub use predictor::GrowthPredictor;
pub use pyramid::{Arm, PyramidConfig, PyramidSession, PyramidStats, WindowPyramid};
