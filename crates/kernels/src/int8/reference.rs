//! The scalar oracle: exact integer dot products over the packed layout.

use super::{packed_index, PackedI8, QuantizedView, ROWS_PER_BLOCK};

/// # Safety
/// `out` points to `m * w.n` floats and no other thread writes the columns of `blocks`.
pub(super) unsafe fn gemm_blocks_scalar(
    a: &QuantizedView<'_>,
    w: &PackedI8,
    out: *mut f32,
    blocks: std::ops::Range<usize>,
) {
    let k_pad = w.k_pad;
    for row in 0..a.m() {
        let a_row = &a.data[row * k_pad..(row + 1) * k_pad];
        for col in blocks.start * ROWS_PER_BLOCK..(blocks.end * ROWS_PER_BLOCK).min(w.n) {
            let mut acc = 0i32;
            for (kk, &x) in a_row.iter().enumerate() {
                acc += i32::from(x) * i32::from(w.data[packed_index(col, kk, k_pad)]);
            }
            *out.add(row * w.n + col) = acc as f32 * a.scales[row] * w.scales[col];
        }
    }
}
