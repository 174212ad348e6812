//! RMSNorm over rows, the normalisation every supported architecture uses before and
//! (Gemma) after its attention and feed-forward blocks. Memory-light next to the matmuls,
//! so one portable version serves; its sum of squares is [`dot`], vectorised.

use super::vector::dot;

/// `out = x / rms(x) * weight`, one row of `weight.len()` elements at a time.
pub fn rms_norm(out: &mut [f32], x: &[f32], weight: &[f32], eps: f32) {
    let n_embd = weight.len();
    debug_assert!(x.len() == out.len() && x.len().is_multiple_of(n_embd));
    for (out_row, x_row) in out.chunks_exact_mut(n_embd).zip(x.chunks_exact(n_embd)) {
        let mean_sq = dot(x_row, x_row) / n_embd as f32;
        let scale = 1.0 / (mean_sq + eps).sqrt();
        for ((o, &v), &g) in out_row.iter_mut().zip(x_row).zip(weight) {
            *o = v * scale * g;
        }
    }
}

/// [`rms_norm`] of `x` into itself, with the same arithmetic: Gemma's per-head norms of
/// queries and keys, and of a block's output before the residual add.
pub fn rms_norm_in_place(x: &mut [f32], weight: &[f32], eps: f32) {
    let n = weight.len();
    debug_assert!(x.len().is_multiple_of(n));
    for row in x.chunks_exact_mut(n) {
        let mean_sq = dot(row, row) / n as f32;
        let scale = 1.0 / (mean_sq + eps).sqrt();
        for (v, &g) in row.iter_mut().zip(weight) {
            *v = *v * scale * g;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_in_place_equals_rms_norm() {
        let x = crate::test_support::random(3 * 24, 7);
        let w = crate::test_support::random(24, 8);
        let mut out = vec![0.0; x.len()];
        rms_norm(&mut out, &x, &w, 1e-6);
        let mut y = x.clone();
        rms_norm_in_place(&mut y, &w, 1e-6);
        assert_eq!(y, out);
    }

    #[test]
    fn rms_norm_gives_unit_rms() {
        let x = [3.0, -4.0, 0.0, 5.0];
        let mut out = [0.0; 4];
        rms_norm(&mut out, &x, &[1.0; 4], 0.0);
        let rms = (out.iter().map(|v| v * v).sum::<f32>() / 4.0).sqrt();
        assert!((rms - 1.0).abs() < 1e-6);
    }
}
