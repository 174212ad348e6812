//! Running a loaded model on a device: what the engine core (`pyramid-engine`) executes.
//!
//! - [`artifact`]: stages compiled by a [`Backend`] for fixed shapes (`prefill {chunk,
//!   window}`, `decode {batch, window}`), and on backends that take any shape a `mixed`
//!   pass (prefill chunks and decode tokens of sequences on different windows at once);
//!   [`CpuBackend`] is the native one, [`RouteBackend`] splits the stages between two.
//! - [`ArtifactCache`] keeps artifacts under a memory budget; [`WindowLadder`] lists the
//!   windows they are compiled for.
//! - [`Sampler`]: greedy, temperature, top-k, top-p, min-p and repetition penalty,
//!   seeded and reproducible.
//!
//! Invariant: an artifact appends exactly its segments' real tokens to their caches, and
//! a failed run leaves them as they were.

pub mod artifact;
mod artifact_cache;
mod error;
mod sampler;
mod window;

pub use artifact::{
    check_fits, executed_as_requested, prefill_chunked, prefill_stepping, ArtifactKey,
    ArtifactShape, Backend, Compiled, CpuBackend, Executable, RouteBackend,
};
pub use artifact_cache::ArtifactCache;
pub use error::{Result, RuntimeError};
/// The greedy pick, where every entry point and test takes it from.
pub use pyramid_kernels::ops::argmax;
pub use pyramid_model::Scratch;
pub use sampler::{Sampler, SamplerConfig};
pub use window::{WindowLadder, DEFAULT_FIRST_WINDOW, MAX_DEFAULT_WINDOW};
