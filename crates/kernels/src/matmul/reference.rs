//! The scalar oracle: plain loops in a fixed summation order.

use super::WeightElem;

/// Single-threaded `out = a · wᵀ`.
pub fn matmul_scalar<W: WeightElem>(
    a: &[f32],
    w: &[W],
    out: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
) {
    assert_eq!(out.len(), m * n, "out must be [m, n]");
    // SAFETY: `out` has m * n elements and this thread owns all of it.
    unsafe { matmul_cols_scalar(a, w, out.as_mut_ptr(), m, k, n, 0..n) }
}

/// # Safety
/// `out` points to `m * n` floats and no other thread writes columns in `cols`.
pub(super) unsafe fn matmul_cols_scalar<W: WeightElem>(
    a: &[f32],
    w: &[W],
    out: *mut f32,
    m: usize,
    k: usize,
    n: usize,
    cols: std::ops::Range<usize>,
) {
    debug_assert!(a.len() == m * k && w.len() == n * k && cols.end <= n);
    for i in 0..m {
        let a_row = &a[i * k..(i + 1) * k];
        for j in cols.clone() {
            let w_row = &w[j * k..(j + 1) * k];
            let sum = a_row
                .iter()
                .zip(w_row)
                .fold(0.0f32, |acc, (x, y)| acc + x * y.to_f32());
            *out.add(i * n + j) = sum;
        }
    }
}
