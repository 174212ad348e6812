//! Running a loaded model.
//!
//! - [`Session`]: one conversation's tokens and KV cache; [`Session::prefill`] reuses the
//!   longest cached prefix so a chat turn or an agent step only computes its new tokens.
//! - [`Sampler`]: greedy, temperature, top-k, top-p, min-p and repetition penalty,
//!   seeded and reproducible.
//! - [`generate`]: the prefill-then-decode loop with stop conditions and timings.
//! - [`step_batch`]: several sessions advanced in one forward pass (batched decode, or
//!   prefill chunks mixed with decode tokens), each weight read once for the batch.
//!
//! - [`artifact`]: static-shape stages (`prefill {chunk, window}`, `decode {batch,
//!   window}`) compiled by a [`Backend`]; [`CpuBackend`] is the native one.
//!   [`ArtifactCache`] keeps them under a memory budget; [`WindowLadder`] lists the
//!   windows they are compiled for.
//!
//! Invariant: a session's `tokens()` are exactly the tokens whose keys and values are in
//! its cache, in order.

pub mod artifact;
mod artifact_cache;
mod error;
mod generate;
mod sampler;
mod session;
mod window;

pub use artifact::{
    executed_as_requested, prefill_chunked, ArtifactKey, ArtifactShape, Backend, Compiled,
    CpuBackend, Executable, RouteBackend,
};
pub use artifact_cache::ArtifactCache;
pub use error::{Result, RuntimeError};
pub use generate::{generate, Decoder, FinishReason, GenerateParams, Generation, Timings};
pub use pyramid_model::Scratch;
pub use sampler::{argmax, Sampler, SamplerConfig};
pub use session::{step_batch, Prefill, Session};
pub use window::{WindowLadder, DEFAULT_FIRST_WINDOW};
