//! The scalar oracle: exact integer dot products per block over the packed layout,
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
    let (k_pad, n_blocks) = (w.k_pad, w.n_blocks());
    for row in 0..a.m {
        let a_row = &a.data[row * k_pad..(row + 1) * k_pad];
        for col in blocks.start * ROWS_PER_BLOCK..(blocks.end * ROWS_PER_BLOCK).min(w.n) {
            let mut acc = 0.0f32;
            for (b, a_block) in a_row.chunks_exact(BLOCK_K).enumerate() {
                let dot: i32 = a_block
                    .iter()
                    .enumerate()
                    .map(|(j, &x)| {
                        i32::from(x) * i32::from(w.data[packed_index(col, b * BLOCK_K + j, k_pad)])
                    })
                    .sum();
                let scale = w.scale(col, b) * a.scales[row * n_blocks + b];
                acc = (dot as f32).mul_add(scale, acc);
            }
            *out.add(row * w.n + col) = acc;
        }
    }
}
