//! The scalar oracle: exact integer dot products per scale group over the packed layout,
//! scaled and accumulated in `k` order with a fused multiply-add, as the SIMD variants do.

use super::{packed_index, PackedI8, QuantizedView, BLOCK_K, ROWS_PER_BLOCK};

/// # Safety
/// `out` points to `m * w.n` floats and no other thread writes the columns of `blocks`.
pub(super) unsafe fn gemm_blocks_scalar(
    a: &QuantizedView<'_>,
    w: &PackedI8,
    out: *mut f32,
    blocks: std::ops::Range<usize>,
) {
    let (k_pad, n_blocks, group_k) = (w.k_pad, w.n_blocks(), w.scales.group_k());
    for row in 0..a.m {
        let a_row = &a.data[row * k_pad..(row + 1) * k_pad];
        for col in blocks.start * ROWS_PER_BLOCK..(blocks.end * ROWS_PER_BLOCK).min(w.n) {
            let mut acc = 0.0f32;
            for (g, a_group) in a_row.chunks_exact(group_k).enumerate() {
                let dot: i32 = a_group
                    .iter()
                    .enumerate()
                    .map(|(j, &x)| {
                        i32::from(x) * i32::from(w.data[packed_index(col, g * group_k + j, k_pad)])
                    })
                    .sum();
                let a_block = row * n_blocks + g * group_k / BLOCK_K;
                let a_scale = a.scales[a_block];
                acc = (dot as f32).mul_add(w.scale(col, g) * a_scale, acc);
                // A minimum (blocks of 32 only) times `Σ a`, after the scaled sum.
                if let Some(mins) = &w.mins {
                    let a_sum = a.block_sums[a_block] as f32 * a_scale;
                    acc = mins.get(col, g).mul_add(a_sum, acc);
                }
            }
            *out.add(row * w.n + col) = acc;
        }
    }
}
