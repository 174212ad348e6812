//! The scalar oracle: per scale group, the exact integer `Σ a·u - zero · Σ a`, scaled and
//! accumulated in `k` order with a fused multiply-add, as the SIMD variants do.

use super::PackedI6;
use crate::int8::{QuantizedView, BLOCK_K, ROWS_PER_BLOCK};

/// # Safety
/// `out` points to `m * w.n` floats and no other thread writes the columns of `blocks`.
pub(super) unsafe fn gemm_blocks_scalar(
    a: &QuantizedView<'_>,
    w: &PackedI6,
    out: *mut f32,
    blocks: std::ops::Range<usize>,
) {
    let (k_pad, group_k) = (w.k_pad, w.scales.group_k());
    let n_blocks = k_pad / BLOCK_K;
    for i in 0..a.m {
        let a_row = &a.data[i * k_pad..(i + 1) * k_pad];
        for col in blocks.start * ROWS_PER_BLOCK..(blocks.end * ROWS_PER_BLOCK).min(w.n) {
            let mut acc = 0.0f32;
            for (g, a_group) in a_row.chunks_exact(group_k).enumerate() {
                let (mut dot, mut sum) = (0i32, 0i32);
                for (j, &x) in a_group.iter().enumerate() {
                    dot += i32::from(x) * i32::from(w.code(col, g * group_k + j));
                    sum += i32::from(x);
                }
                let isum = dot - i32::from(w.zero) * sum;
                let a_scale = a.scales[i * n_blocks + g * group_k / BLOCK_K];
                acc = (isum as f32).mul_add(w.scales.get(col, g) * a_scale, acc);
            }
            *out.add(i * w.n + col) = acc;
        }
    }
}
