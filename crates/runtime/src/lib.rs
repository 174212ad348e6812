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
//! Invariant: a session's `tokens()` are exactly the tokens whose keys and values are in
//! its cache, in order.

mod error;
mod generate;
mod sampler;
mod session;

pub use error::{Result, RuntimeError};
pub use generate::{generate, FinishReason, GenerateParams, Generation, Timings};
pub use pyramid_model::Scratch;
pub use sampler::{Sampler, SamplerConfig};
pub use session::{step_batch, Session};
