//! Element-wise and row-wise operations of a transformer layer, one file per op family,
//! each scalar oracle beside its ISA versions and its tests.
//!
//! Most are memory-light next to the matmuls, so one portable version serves. `dot` and
//! `axpy`, which the per-head attention helpers here (the oracle of [`crate::attention`])
//! call once per cached position, also have AVX2 and AVX-512 builds of the same code (the
//! scalar one is their oracle); the outlier side product has an AVX2 tiling. Loops use
//! independent accumulators so the compiler vectorises them without reassociating sums.
//!
//! - `vector`: `dot`, `axpy` and the residual add.
//! - `norm`: RMSNorm.
//! - `outlier`: the INT8 projections' f16 outlier side product.
//! - `attention_helpers`: per-head scores, softmax and weighted sums over each cache type.
//! - `activation`: SwiGLU and GeGLU; `exp`: the vector `e^x` they share with attention.
//! - `rope`: rotary position embeddings.
//! - `argmax`: greedy decoding's pick.
//!
//! Every item is re-exported here, so callers name `ops::dot`, not the file it lives in.

pub use half::f16;

mod activation;
mod argmax;
mod attention_helpers;
mod exp;
mod norm;
mod outlier;
mod rope;
mod vector;

pub use activation::{
    gelu_tanh_mul_in_place, gelu_tanh_mul_in_place_with, silu_mul_in_place, silu_mul_in_place_with,
};
pub use argmax::argmax;
pub use attention_helpers::{
    attention_scores, attention_scores_f16, attention_scores_i8, softmax_in_place, weighted_sum,
    weighted_sum_f16, weighted_sum_i8, MAX_F16_HEAD_DIM,
};
pub(crate) use exp::exp_scalar;
#[cfg(target_arch = "x86_64")]
pub(crate) use exp::{exp_avx2, exp_avx512};
pub use norm::{rms_norm, rms_norm_in_place};
pub use outlier::{outlier_product_cols, outlier_product_cols_with};
pub use rope::{rope_in_place, rope_inv_freq, RopeStyle};
pub use vector::{add_in_place, axpy, axpy_scalar, dot, dot_scalar};
