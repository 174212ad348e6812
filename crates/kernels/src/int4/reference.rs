//! The scalar oracle: exact integer sums per group, scaled and accumulated in `k` order
//! with fused multiply-adds, as the SIMD variant does.

use super::{PackedI4, GROUP};
use crate::int8::{QuantizedView, ROWS_PER_BLOCK};

/// # Safety
/// `out` points to `m * w.n` floats and no other thread writes the columns of `blocks`.
pub(super) unsafe fn gemm_blocks_scalar(
    a: &QuantizedView<'_>,
    w: &PackedI4,
    out: *mut f32,
    blocks: std::ops::Range<usize>,
) {
    let (k_pad, n_groups) = (w.k_pad, w.n_groups());
    for i in 0..a.m {
        let a_row = &a.data[i * k_pad..(i + 1) * k_pad];
        for col in blocks.start * ROWS_PER_BLOCK..(blocks.end * ROWS_PER_BLOCK).min(w.n) {
            let mut acc = 0.0f32;
            for (g, a_group) in a_row.chunks_exact(GROUP).enumerate() {
                let dot: i32 = a_group
                    .iter()
                    .enumerate()
                    .map(|(j, &x)| i32::from(x) * i32::from(w.nibble(col, g * GROUP + j)))
                    .sum();
                let a_scale = a.scales[i * n_groups + g];
                let a_sum = a.block_sums[i * n_groups + g] as f32 * a_scale;
                acc = (dot as f32).mul_add(w.scale(col, g) * a_scale, acc);
                acc = w.min(col, g).mul_add(a_sum, acc);
            }
            *out.add(i * w.n + col) = acc;
        }
    }
}
