//! The scalar oracle: exact integer sums per group, scaled and added in `k` order.

use super::{PackedI4, GROUP, GROUP_BYTES};
use crate::int8::QuantizedView;

/// `Σ a·q` over one group.
fn group_dot(a: &[i8], bytes: &[u8]) -> i32 {
    let mut dot = 0i32;
    for (j, &b) in bytes.iter().enumerate() {
        dot += i32::from(a[j]) * i32::from(b & 0xF);
        dot += i32::from(a[j + GROUP_BYTES]) * i32::from(b >> 4);
    }
    dot
}

/// # Safety
/// `out` points to `m * w.n` floats and no other thread writes the columns in `rows`.
pub(super) unsafe fn gemm_rows_scalar(
    a: &QuantizedView<'_>,
    w: &PackedI4,
    out: *mut f32,
    rows: std::ops::Range<usize>,
) {
    let (k_pad, n_groups) = (w.k_pad, w.n_groups());
    for i in 0..a.m {
        let a_row = &a.data[i * k_pad..(i + 1) * k_pad];
        for col in rows.clone() {
            let mut acc = 0.0f32;
            for g in 0..n_groups {
                let bytes = &w.data[(col * n_groups + g) * GROUP_BYTES..][..GROUP_BYTES];
                let dot = group_dot(&a_row[g * GROUP..(g + 1) * GROUP], bytes);
                let sum = a.block_sums[i * n_groups + g];
                let a_scale = a.scales[i * n_groups + g];
                acc += dot as f32 * (w.scales[col * n_groups + g] * a_scale)
                    + sum as f32 * (w.mins[col * n_groups + g] * a_scale);
            }
            *out.add(i * w.n + col) = acc;
        }
    }
}
