//! Attention's per-head helpers over f32, INT8 and f16 caches (scores, softmax and the
//! weighted sum of values): the oracle of [`crate::attention`], whose scalar path runs
//! each head on its own with them. One ISA dispatch per head, not per position.

use half::f16;
use half::slice::HalfFloatSliceExt;

use super::vector::{axpy, axpy_scalar, dot, dot_lanes};
use crate::isa::{self, Isa};

/// Attention scores of one query against `n_pos` keys (`keys`: `[n_pos, head_dim]`):
/// `out[p] = scale · q · keys[p]`. One ISA dispatch per head, not per position.
pub fn attention_scores(q: &[f32], keys: &[f32], scale: f32, out: &mut Vec<f32>) {
    out.clear();
    match isa::active() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx512` and `Isa::Amx` are only selected when the CPU has AVX-512F.
        Isa::Avx512 | Isa::Amx => unsafe { scores_avx512(q, keys, scale, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx2` is only selected when the CPU has AVX2 and FMA.
        Isa::Avx2 | Isa::AvxVnni => unsafe { scores_avx2(q, keys, scale, out) },
        _ => scores_lanes::<8>(q, keys, scale, out),
    }
}

#[inline(always)]
fn scores_lanes<const L: usize>(q: &[f32], keys: &[f32], scale: f32, out: &mut Vec<f32>) {
    // A plain loop, not an iterator closure: closures do not inherit the caller's
    // `target_feature`, and the dot product would fall back to baseline SSE.
    for k in keys.chunks_exact(q.len()) {
        out.push(dot_lanes::<L>(q, k) * scale);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn scores_avx512(q: &[f32], keys: &[f32], scale: f32, out: &mut Vec<f32>) {
    scores_lanes::<16>(q, keys, scale, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn scores_avx2(q: &[f32], keys: &[f32], scale: f32, out: &mut Vec<f32>) {
    scores_lanes::<8>(q, keys, scale, out)
}

/// `out = Σ_p weights[p] · values[p]` (`values`: `[n_pos, head_dim]`), one dispatch per head.
pub fn weighted_sum(weights: &[f32], values: &[f32], out: &mut [f32]) {
    out.fill(0.0);
    match isa::active() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx512` and `Isa::Amx` are only selected when the CPU has AVX-512F.
        Isa::Avx512 | Isa::Amx => unsafe { weighted_sum_avx512(weights, values, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx2` is only selected when the CPU has AVX2 and FMA.
        Isa::Avx2 | Isa::AvxVnni => unsafe { weighted_sum_avx2(weights, values, out) },
        _ => weighted_sum_scalar(weights, values, out),
    }
}

#[inline(always)]
fn weighted_sum_scalar(weights: &[f32], values: &[f32], out: &mut [f32]) {
    for (&w, v) in weights.iter().zip(values.chunks_exact(out.len())) {
        axpy_scalar(out, w, v);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn weighted_sum_avx512(weights: &[f32], values: &[f32], out: &mut [f32]) {
    weighted_sum_scalar(weights, values, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn weighted_sum_avx2(weights: &[f32], values: &[f32], out: &mut [f32]) {
    weighted_sum_scalar(weights, values, out)
}

/// [`attention_scores`] over an INT8 cache: `out[p] = scale · key_scales[p] · (q · keys[p])`.
pub fn attention_scores_i8(
    q: &[f32],
    keys: &[i8],
    key_scales: &[f32],
    scale: f32,
    out: &mut Vec<f32>,
) {
    out.clear();
    match isa::active() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx512` and `Isa::Amx` are only selected when the CPU has AVX-512F.
        Isa::Avx512 | Isa::Amx => unsafe { scores_i8_avx512(q, keys, key_scales, scale, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx2` is only selected when the CPU has AVX2 and FMA.
        Isa::Avx2 | Isa::AvxVnni => unsafe { scores_i8_avx2(q, keys, key_scales, scale, out) },
        _ => scores_i8_lanes::<8>(q, keys, key_scales, scale, out),
    }
}

#[inline(always)]
fn scores_i8_lanes<const L: usize>(
    q: &[f32],
    keys: &[i8],
    key_scales: &[f32],
    scale: f32,
    out: &mut Vec<f32>,
) {
    let hd = q.len();
    for (k, &ks) in keys.chunks_exact(hd).zip(key_scales) {
        let mut acc = [0.0f32; L];
        let chunks = hd / L * L;
        for (cq, ck) in q[..chunks].chunks_exact(L).zip(k[..chunks].chunks_exact(L)) {
            for l in 0..L {
                acc[l] += cq[l] * f32::from(ck[l]);
            }
        }
        let mut sum = acc.iter().sum::<f32>();
        for (x, &y) in q[chunks..].iter().zip(&k[chunks..]) {
            sum += x * f32::from(y);
        }
        out.push(sum * ks * scale);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn scores_i8_avx512(
    q: &[f32],
    keys: &[i8],
    key_scales: &[f32],
    scale: f32,
    out: &mut Vec<f32>,
) {
    scores_i8_lanes::<16>(q, keys, key_scales, scale, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn scores_i8_avx2(
    q: &[f32],
    keys: &[i8],
    key_scales: &[f32],
    scale: f32,
    out: &mut Vec<f32>,
) {
    scores_i8_lanes::<8>(q, keys, key_scales, scale, out)
}

/// [`weighted_sum`] over an INT8 cache: `out = Σ_p weights[p] · value_scales[p] · values[p]`.
pub fn weighted_sum_i8(weights: &[f32], values: &[i8], value_scales: &[f32], out: &mut [f32]) {
    out.fill(0.0);
    match isa::active() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx512` and `Isa::Amx` are only selected when the CPU has AVX-512F.
        Isa::Avx512 | Isa::Amx => unsafe {
            weighted_sum_i8_avx512(weights, values, value_scales, out)
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx2` is only selected when the CPU has AVX2 and FMA.
        Isa::Avx2 | Isa::AvxVnni => unsafe {
            weighted_sum_i8_avx2(weights, values, value_scales, out)
        },
        _ => weighted_sum_i8_scalar(weights, values, value_scales, out),
    }
}

#[inline(always)]
fn weighted_sum_i8_scalar(weights: &[f32], values: &[i8], value_scales: &[f32], out: &mut [f32]) {
    for ((&w, &vs), v) in weights
        .iter()
        .zip(value_scales)
        .zip(values.chunks_exact(out.len()))
    {
        let alpha = w * vs;
        for (o, &x) in out.iter_mut().zip(v) {
            *o += alpha * f32::from(x);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn weighted_sum_i8_avx512(
    weights: &[f32],
    values: &[i8],
    value_scales: &[f32],
    out: &mut [f32],
) {
    weighted_sum_i8_scalar(weights, values, value_scales, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn weighted_sum_i8_avx2(
    weights: &[f32],
    values: &[i8],
    value_scales: &[f32],
    out: &mut [f32],
) {
    weighted_sum_i8_scalar(weights, values, value_scales, out)
}

/// Longest head the f16 attention helpers widen on the stack.
pub const MAX_F16_HEAD_DIM: usize = 512;

/// [`attention_scores`] over an f16 cache: each key row is widened to f32 (with F16C where
/// the CPU has it) and dotted with the active ISA's [`dot`].
pub fn attention_scores_f16(q: &[f32], keys: &[f16], scale: f32, out: &mut Vec<f32>) {
    out.clear();
    let hd = q.len();
    assert!(
        hd <= MAX_F16_HEAD_DIM,
        "head_dim {hd} beyond {MAX_F16_HEAD_DIM}"
    );
    let mut row = [0.0f32; MAX_F16_HEAD_DIM];
    for k in keys.chunks_exact(hd) {
        k.convert_to_f32_slice(&mut row[..hd]);
        out.push(dot(q, &row[..hd]) * scale);
    }
}

/// [`weighted_sum`] over an f16 cache, widening each value row as above.
pub fn weighted_sum_f16(weights: &[f32], values: &[f16], out: &mut [f32]) {
    out.fill(0.0);
    let hd = out.len();
    assert!(
        hd <= MAX_F16_HEAD_DIM,
        "head_dim {hd} beyond {MAX_F16_HEAD_DIM}"
    );
    let mut row = [0.0f32; MAX_F16_HEAD_DIM];
    for (&w, v) in weights.iter().zip(values.chunks_exact(hd)) {
        v.convert_to_f32_slice(&mut row[..hd]);
        axpy(out, w, &row[..hd]);
    }
}

/// In-place softmax; a row of all `-inf` (fully masked) is left as zeros rather than NaN.
pub fn softmax_in_place(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        x.fill(0.0);
        return;
    }
    let mut sum = 0.0;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::dot_scalar;

    #[test]
    fn softmax_sums_to_one_and_handles_full_mask() {
        let mut x = [1.0, 2.0, 3.0, f32::NEG_INFINITY];
        softmax_in_place(&mut x);
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert_eq!(x[3], 0.0);
        let mut masked = [f32::NEG_INFINITY; 3];
        softmax_in_place(&mut masked);
        assert_eq!(masked, [0.0; 3]);
    }

    #[test]
    fn attention_helpers_match_per_position_loops() {
        let hd = 24;
        let q: Vec<f32> = (0..hd).map(|i| (i as f32 * 0.3).sin()).collect();
        let keys: Vec<f32> = (0..hd * 37).map(|i| (i as f32 * 0.07).cos()).collect();
        let mut scores = Vec::new();
        attention_scores(&q, &keys, 0.5, &mut scores);
        assert_eq!(scores.len(), 37);
        for (p, s) in scores.iter().enumerate() {
            assert!((s - 0.5 * dot_scalar(&q, &keys[p * hd..(p + 1) * hd])).abs() < 1e-5);
        }
        let mut out = vec![1.0; hd];
        weighted_sum(&scores, &keys, &mut out);
        let mut want = vec![0.0; hd];
        for (p, &w) in scores.iter().enumerate() {
            axpy_scalar(&mut want, w, &keys[p * hd..(p + 1) * hd]);
        }
        assert_eq!(out, want);
    }

    #[test]
    fn int8_attention_helpers_match_dequantised_f32() {
        let hd = 20;
        let n_pos = 9;
        let q: Vec<f32> = (0..hd).map(|i| (i as f32 * 0.3).sin()).collect();
        let keys: Vec<i8> = (0..hd * n_pos).map(|i| ((i * 37) % 255) as i8).collect();
        let scales: Vec<f32> = (0..n_pos).map(|p| 0.01 * (p + 1) as f32).collect();
        let dequant: Vec<f32> = keys
            .iter()
            .enumerate()
            .map(|(i, &k)| f32::from(k) * scales[i / hd])
            .collect();
        let (mut got, mut want) = (Vec::new(), Vec::new());
        attention_scores_i8(&q, &keys, &scales, 0.25, &mut got);
        attention_scores(&q, &dequant, 0.25, &mut want);
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() < 1e-4, "{g} vs {w}");
        }
        let mut out = vec![0.0; hd];
        weighted_sum_i8(&want, &keys, &scales, &mut out);
        let mut expected = vec![0.0; hd];
        weighted_sum(&want, &dequant, &mut expected);
        for (g, w) in out.iter().zip(&expected) {
            assert!((g - w).abs() < 1e-4, "{g} vs {w}");
        }
    }

    #[test]
    fn f16_attention_helpers_match_widened_f32() {
        let hd = 20;
        let n_pos = 9;
        let q: Vec<f32> = (0..hd).map(|i| (i as f32 * 0.3).sin()).collect();
        let keys: Vec<f16> = (0..hd * n_pos)
            .map(|i| f16::from_f32(((i * 37) % 255) as f32 / 100.0 - 1.2))
            .collect();
        let widened: Vec<f32> = keys.iter().map(|k| k.to_f32()).collect();
        let (mut got, mut want) = (Vec::new(), Vec::new());
        attention_scores_f16(&q, &keys, 0.25, &mut got);
        attention_scores(&q, &widened, 0.25, &mut want);
        assert_eq!(got, want);
        let mut out = vec![0.0; hd];
        weighted_sum_f16(&want, &keys, &mut out);
        let mut expected = vec![0.0; hd];
        weighted_sum(&want, &widened, &mut expected);
        for (g, w) in out.iter().zip(&expected) {
            assert!((g - w).abs() < 1e-5, "{g} vs {w}");
        }
    }
}
