//! Pure compute on slices, no model knowledge.
//!
//! - [`isa`]: the instruction set chosen once at start-up (runtime detection, `PYRAMID_ISA`
//!   override); every kernel has a portable scalar version that is the test oracle, with
//!   AVX2 and AVX-512 versions beside it.
//! - [`ThreadPool`]: persistent workers, so a forward pass does not pay thread start-up
//!   for each of its hundreds of matmuls.
//! - [`matmul`]: `out = a · wᵀ` with weights stored row-major as `[n_out, n_in]`, the
//!   layout GGUF uses, so both operands stream contiguously along `k`.
//! - [`attention`]: the query heads of one KV head attending to its cache together.
//! - [`ops`]: RMSNorm, RoPE, softmax, SwiGLU and the small vector helpers attention uses.
//!
//! Invariant: kernels write into caller-provided buffers and do not return `Result`; the
//! public entry points assert shapes (with checked arithmetic) before any raw load.

pub mod attention;
#[cfg(target_arch = "x86_64")]
mod byte_dot;
#[cfg(target_arch = "x86_64")]
mod column;
pub mod int4;
pub mod int6;
pub mod int8;
pub mod isa;
pub mod matmul;
pub mod ops;
pub mod scales;
#[cfg(test)]
mod test_support;
pub mod threadpool;

pub use isa::{Isa, KernelError};
pub use threadpool::{split_range, SharedSlice, Team, ThreadPool};

/// Threads split a product's output columns on multiples of this: the INT8 kernel's block
/// of 16 weight rows, which also keeps the f32 kernel's 4-wide tiles whole, so one split
/// serves every kernel and a projection's side products land on the same thread.
pub const COLUMN_ALIGN: usize = int8::ROWS_PER_BLOCK;
