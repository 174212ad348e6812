//! Element-wise and row-wise operations of a transformer layer.
//!
//! Most are memory-light next to the matmuls, so one portable version serves. `dot` and
//! `axpy`, which the per-head attention helpers here (the oracle of [`crate::attention`])
//! call once per cached position, also have AVX2 and AVX-512 builds of the same code (the
//! scalar one is their oracle); the outlier side product has an AVX2 tiling. Loops use
//! independent accumulators so the compiler vectorises them without reassociating sums.

pub use half::f16;
use half::slice::HalfFloatSliceExt;

use std::ops::Range;

use crate::isa::{self, Isa};
use crate::threadpool::SharedSlice;

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

/// Dot product, vectorised for the active ISA (attention calls it once per cached position).
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    match isa::active() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx512` and `Isa::Amx` are only selected when the CPU has AVX-512F.
        Isa::Avx512 | Isa::Amx => unsafe { dot_avx512(a, b) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx2` is only selected when the CPU has AVX2 and FMA.
        Isa::Avx2 => unsafe { dot_avx2(a, b) },
        _ => dot_lanes::<8>(a, b),
    }
}

/// The scalar oracle for [`dot`]: eight independent partial sums.
pub fn dot_scalar(a: &[f32], b: &[f32]) -> f32 {
    dot_lanes::<8>(a, b)
}

/// `L` independent partial sums: with a vector ISA enabled the compiler maps them onto
/// one register of `L` lanes without reassociating any sum.
#[inline(always)]
fn dot_lanes<const L: usize>(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; L];
    let chunks = a.len() / L * L;
    for (ca, cb) in a[..chunks].chunks_exact(L).zip(b[..chunks].chunks_exact(L)) {
        for l in 0..L {
            acc[l] += ca[l] * cb[l];
        }
    }
    let mut sum = acc.iter().sum::<f32>();
    for (x, y) in a[chunks..].iter().zip(&b[chunks..]) {
        sum += x * y;
    }
    sum
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn dot_avx512(a: &[f32], b: &[f32]) -> f32 {
    dot_lanes::<16>(a, b)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    dot_lanes::<8>(a, b)
}

/// `y += alpha * x`, vectorised for the active ISA.
pub fn axpy(y: &mut [f32], alpha: f32, x: &[f32]) {
    debug_assert_eq!(x.len(), y.len());
    match isa::active() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx512` and `Isa::Amx` are only selected when the CPU has AVX-512F.
        Isa::Avx512 | Isa::Amx => unsafe { axpy_avx512(y, alpha, x) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx2` is only selected when the CPU has AVX2 and FMA.
        Isa::Avx2 => unsafe { axpy_avx2(y, alpha, x) },
        _ => axpy_scalar(y, alpha, x),
    }
}

/// The scalar oracle for [`axpy`].
#[inline(always)]
pub fn axpy_scalar(y: &mut [f32], alpha: f32, x: &[f32]) {
    for (yi, &xi) in y.iter_mut().zip(x) {
        *yi += alpha * xi;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn axpy_avx512(y: &mut [f32], alpha: f32, x: &[f32]) {
    axpy_scalar(y, alpha, x)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn axpy_avx2(y: &mut [f32], alpha: f32, x: &[f32]) {
    axpy_scalar(y, alpha, x)
}

/// The outlier channels' side product: `out[r][j] += Σ_o x[r][o] · w[o][j]` for every row
/// `r` of `x` (`[m, n_o]`) and the columns `cols` of `w` (`[n_o, n_out]`, f16: decode
/// reads all of it every token) and of `out` (`[m, n_out]`).
///
/// Each output adds its channels in ascending order, each with a multiply and an add, so
/// its value depends on nothing but its own row, whatever the batch or the tiling; the
/// vector version tiles four rows by sixteen columns so a widened weight serves four
/// tokens, and agrees with the scalar one bit for bit.
///
/// # Safety
/// No other thread accesses these columns of `out` until the next barrier.
pub unsafe fn outlier_product_cols(
    x: &[f32],
    n_o: usize,
    w: &[f16],
    out: &SharedSlice<'_, f32>,
    n_out: usize,
    cols: Range<usize>,
) {
    outlier_product_cols_with(isa::active(), x, n_o, w, out, n_out, cols)
}

/// As [`outlier_product_cols`] with an explicit ISA (tests compare every ISA against scalar).
///
/// # Safety
/// As [`outlier_product_cols`].
pub unsafe fn outlier_product_cols_with(
    isa: Isa,
    x: &[f32],
    n_o: usize,
    w: &[f16],
    out: &SharedSlice<'_, f32>,
    n_out: usize,
    cols: Range<usize>,
) {
    if n_o == 0 || cols.is_empty() {
        return;
    }
    let m = x.len() / n_o;
    assert!(
        x.len() == m * n_o && Some(w.len()) == n_o.checked_mul(n_out),
        "x must be [m, n_o] and w [n_o, n_out]"
    );
    assert!(
        Some(out.len()) == m.checked_mul(n_out) && cols.end <= n_out,
        "out must be [m, n_out] and cols within it"
    );
    isa.assert_supported();
    let out = out.as_mut_ptr();
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx512` and `Isa::Amx` are only selected when the CPU has AVX-512F,
        // AVX2 and F16C; shapes checked above.
        Isa::Amx | Isa::Avx512 => outlier_product_avx512(x, n_o, w, out, n_out, cols),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::detect` requires AVX2 and F16C for `Isa::Avx2`; shapes checked above.
        Isa::Avx2 => outlier_product_avx2(x, n_o, w, out, n_out, cols),
        _ => outlier_product_scalar(x, n_o, w, out, n_out, cols),
    }
}

/// # Safety
/// Shapes as [`outlier_product_cols_with`] checks; `out` points to `[m, n_out]` floats.
#[inline(always)]
unsafe fn outlier_product_scalar(
    x: &[f32],
    n_o: usize,
    w: &[f16],
    out: *mut f32,
    n_out: usize,
    cols: Range<usize>,
) {
    for (r, x_r) in x.chunks_exact(n_o).enumerate() {
        let row = std::slice::from_raw_parts_mut(out.add(r * n_out + cols.start), cols.len());
        for (&x_ro, w_o) in x_r.iter().zip(w.chunks_exact(n_out)) {
            for (y, w_oj) in row.iter_mut().zip(&w_o[cols.clone()]) {
                *y += x_ro * w_oj.to_f32();
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn outlier_product_avx2(
    x: &[f32],
    n_o: usize,
    w: &[f16],
    out: *mut f32,
    n_out: usize,
    cols: Range<usize>,
) {
    let m = x.len() / n_o;
    let whole = cols.start + cols.len() / 16 * 16;
    let mut r = 0;
    while r < m {
        let rows = (m - r).min(4);
        for j in (cols.start..whole).step_by(16) {
            match rows {
                4 => outlier_tile::<4>(x, n_o, w, out, n_out, r, j),
                3 => outlier_tile::<3>(x, n_o, w, out, n_out, r, j),
                2 => outlier_tile::<2>(x, n_o, w, out, n_out, r, j),
                _ => outlier_tile::<1>(x, n_o, w, out, n_out, r, j),
            }
        }
        r += rows;
    }
    outlier_product_scalar(x, n_o, w, out, n_out, whole..cols.end);
}

/// As [`outlier_product_avx2`], in tiles of up to eight rows by 32 columns; the columns
/// past the last whole 32 take the AVX2 path. Each output is the same chain in the same
/// order on every path.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,f16c")]
unsafe fn outlier_product_avx512(
    x: &[f32],
    n_o: usize,
    w: &[f16],
    out: *mut f32,
    n_out: usize,
    cols: Range<usize>,
) {
    let m = x.len() / n_o;
    let whole = cols.start + cols.len() / 32 * 32;
    let mut r = 0;
    while r < m {
        let rows = (m - r).min(8);
        for j in (cols.start..whole).step_by(32) {
            match rows {
                8 => outlier_tile_wide::<8>(x, n_o, w, out, n_out, r, j),
                7 => outlier_tile_wide::<7>(x, n_o, w, out, n_out, r, j),
                6 => outlier_tile_wide::<6>(x, n_o, w, out, n_out, r, j),
                5 => outlier_tile_wide::<5>(x, n_o, w, out, n_out, r, j),
                4 => outlier_tile_wide::<4>(x, n_o, w, out, n_out, r, j),
                3 => outlier_tile_wide::<3>(x, n_o, w, out, n_out, r, j),
                2 => outlier_tile_wide::<2>(x, n_o, w, out, n_out, r, j),
                _ => outlier_tile_wide::<1>(x, n_o, w, out, n_out, r, j),
            }
        }
        r += rows;
    }
    outlier_product_avx2(x, n_o, w, out, n_out, whole..cols.end);
}

/// Rows `r0..r0 + MR` by columns `j0..j0 + 32`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn outlier_tile_wide<const MR: usize>(
    x: &[f32],
    n_o: usize,
    w: &[f16],
    out: *mut f32,
    n_out: usize,
    r0: usize,
    j0: usize,
) {
    use std::arch::x86_64::*;
    let mut acc = [[_mm512_setzero_ps(); 2]; MR];
    for (r, acc_r) in acc.iter_mut().enumerate() {
        for (h, a) in acc_r.iter_mut().enumerate() {
            *a = _mm512_loadu_ps(out.add((r0 + r) * n_out + j0 + 16 * h));
        }
    }
    for o in 0..n_o {
        let w_o = w.as_ptr().add(o * n_out + j0);
        let wv = [
            _mm512_cvtph_ps(_mm256_loadu_si256(w_o.cast())),
            _mm512_cvtph_ps(_mm256_loadu_si256(w_o.add(16).cast())),
        ];
        for (r, acc_r) in acc.iter_mut().enumerate() {
            let xv = _mm512_set1_ps(*x.get_unchecked((r0 + r) * n_o + o));
            for (a, wh) in acc_r.iter_mut().zip(wv) {
                // Multiply then add, not fused: the scalar oracle's two roundings.
                *a = _mm512_add_ps(*a, _mm512_mul_ps(xv, wh));
            }
        }
    }
    for (r, acc_r) in acc.iter().enumerate() {
        for (h, a) in acc_r.iter().enumerate() {
            _mm512_storeu_ps(out.add((r0 + r) * n_out + j0 + 16 * h), *a);
        }
    }
}

/// Rows `r0..r0 + MR` by columns `j0..j0 + 16`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
#[inline]
unsafe fn outlier_tile<const MR: usize>(
    x: &[f32],
    n_o: usize,
    w: &[f16],
    out: *mut f32,
    n_out: usize,
    r0: usize,
    j0: usize,
) {
    use std::arch::x86_64::*;
    let mut acc = [[_mm256_setzero_ps(); 2]; MR];
    for (r, acc_r) in acc.iter_mut().enumerate() {
        for (h, a) in acc_r.iter_mut().enumerate() {
            *a = _mm256_loadu_ps(out.add((r0 + r) * n_out + j0 + 8 * h));
        }
    }
    for o in 0..n_o {
        let w_o = w.as_ptr().add(o * n_out + j0);
        let wv = [
            _mm256_cvtph_ps(_mm_loadu_si128(w_o.cast())),
            _mm256_cvtph_ps(_mm_loadu_si128(w_o.add(8).cast())),
        ];
        for (r, acc_r) in acc.iter_mut().enumerate() {
            let xv = _mm256_set1_ps(*x.get_unchecked((r0 + r) * n_o + o));
            for (a, wh) in acc_r.iter_mut().zip(wv) {
                // Multiply then add, not fused: the scalar oracle's two roundings.
                *a = _mm256_add_ps(*a, _mm256_mul_ps(xv, wh));
            }
        }
    }
    for (r, acc_r) in acc.iter().enumerate() {
        for (h, a) in acc_r.iter().enumerate() {
            _mm256_storeu_ps(out.add((r0 + r) * n_out + j0 + 8 * h), *a);
        }
    }
}

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
        Isa::Avx2 => unsafe { scores_avx2(q, keys, scale, out) },
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
        Isa::Avx2 => unsafe { weighted_sum_avx2(weights, values, out) },
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
        Isa::Avx2 => unsafe { scores_i8_avx2(q, keys, key_scales, scale, out) },
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
        Isa::Avx2 => unsafe { weighted_sum_i8_avx2(weights, values, value_scales, out) },
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

/// `x += y`.
pub fn add_in_place(x: &mut [f32], y: &[f32]) {
    debug_assert_eq!(x.len(), y.len());
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
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

/// SwiGLU: `gate = silu(gate) * up`, the feed-forward activation of Llama and Qwen2,
/// vectorised for the active ISA: it runs over every FFN column of every token, and the
/// scalar path's `exp` is a libm call per element.
pub fn silu_mul_in_place(gate: &mut [f32], up: &[f32]) {
    silu_mul_in_place_with(isa::active(), gate, up)
}

/// As [`silu_mul_in_place`] with an explicit ISA; [`Isa::Scalar`] is the oracle.
pub fn silu_mul_in_place_with(isa: Isa, gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "gate and up differ in length");
    isa.assert_supported();
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::detect` requires AVX-512F, AVX2 and FMA for `Isa::Avx512` and
        // `Isa::Amx`.
        Isa::Avx512 | Isa::Amx => unsafe { silu_mul_avx512(gate, up) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::detect` requires AVX2 and FMA for `Isa::Avx2`.
        Isa::Avx2 => unsafe { silu_mul_avx2(gate, up) },
        _ => silu_mul_scalar(gate, up),
    }
}

fn silu_mul_scalar(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn silu_mul_avx2(gate: &mut [f32], up: &[f32]) {
    use std::arch::x86_64::*;
    let whole = gate.len() / 8 * 8;
    let (g, u) = (gate.as_mut_ptr(), up.as_ptr());
    for i in (0..whole).step_by(8) {
        let x = _mm256_loadu_ps(g.add(i));
        let e = exp_avx2(_mm256_sub_ps(_mm256_setzero_ps(), x));
        let silu = _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0), e));
        _mm256_storeu_ps(g.add(i), _mm256_mul_ps(silu, _mm256_loadu_ps(u.add(i))));
    }
    silu_mul_scalar(&mut gate[whole..], &up[whole..]);
}

/// [`silu_mul_avx2`] on sixteen lanes, the rest on AVX2: the same operations per value
/// ([`exp_avx512`] is [`exp_avx2`]'s), so the same result as on AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn silu_mul_avx512(gate: &mut [f32], up: &[f32]) {
    use std::arch::x86_64::*;
    let whole = gate.len() / 16 * 16;
    let (g, u) = (gate.as_mut_ptr(), up.as_ptr());
    for i in (0..whole).step_by(16) {
        let x = _mm512_loadu_ps(g.add(i));
        let e = exp_avx512(_mm512_sub_ps(_mm512_setzero_ps(), x));
        let silu = _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0), e));
        _mm512_storeu_ps(g.add(i), _mm512_mul_ps(silu, _mm512_loadu_ps(u.add(i))));
    }
    silu_mul_avx2(&mut gate[whole..], &up[whole..]);
}

/// GeGLU: `gate = gelu_tanh(gate) * up`, the feed-forward activation of Gemma, with GELU in
/// its tanh approximation `x/2 · (1 + tanh(√(2/π) · (x + 0.044715 x³)))` (PyTorch's
/// `gelu(approximate="tanh")`). Vectorised like [`silu_mul_in_place`], which it matches in
/// cost per element.
pub fn gelu_tanh_mul_in_place(gate: &mut [f32], up: &[f32]) {
    gelu_tanh_mul_in_place_with(isa::active(), gate, up)
}

/// As [`gelu_tanh_mul_in_place`] with an explicit ISA; [`Isa::Scalar`] is the oracle.
pub fn gelu_tanh_mul_in_place_with(isa: Isa, gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "gate and up differ in length");
    isa.assert_supported();
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::detect` requires AVX-512F, AVX2 and FMA for `Isa::Avx512` and
        // `Isa::Amx`.
        Isa::Avx512 | Isa::Amx => unsafe { gelu_tanh_mul_avx512(gate, up) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::detect` requires AVX2 and FMA for `Isa::Avx2`.
        Isa::Avx2 => unsafe { gelu_tanh_mul_avx2(gate, up) },
        _ => gelu_tanh_mul_scalar(gate, up),
    }
}

/// `√(2/π)`.
const GELU_SQRT_2_OVER_PI: f32 = 0.797_884_6;
const GELU_CUBIC: f32 = 0.044_715;

fn gelu_tanh_mul_scalar(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        let inner = GELU_SQRT_2_OVER_PI * (x + GELU_CUBIC * x * x * x);
        *g = 0.5 * x * (1.0 + inner.tanh()) * u;
    }
}

/// `(1 + tanh y) / 2 = 1 / (1 + e^(-2y))`: one vector `exp` and a division per lane,
/// without the cancellation `1 + tanh y` suffers for large negative `y`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn gelu_tanh_mul_avx2(gate: &mut [f32], up: &[f32]) {
    use std::arch::x86_64::*;
    let whole = gate.len() / 8 * 8;
    let (g, u) = (gate.as_mut_ptr(), up.as_ptr());
    let (c, k) = (
        _mm256_set1_ps(-2.0 * GELU_SQRT_2_OVER_PI),
        _mm256_set1_ps(GELU_CUBIC),
    );
    for i in (0..whole).step_by(8) {
        let x = _mm256_loadu_ps(g.add(i));
        let x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
        let minus_2y = _mm256_mul_ps(c, _mm256_fmadd_ps(k, x3, x));
        let e = exp_avx2(minus_2y);
        let gelu = _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0), e));
        _mm256_storeu_ps(g.add(i), _mm256_mul_ps(gelu, _mm256_loadu_ps(u.add(i))));
    }
    gelu_tanh_mul_scalar(&mut gate[whole..], &up[whole..]);
}

/// [`gelu_tanh_mul_avx2`] on sixteen lanes, the rest on AVX2: the same operations per
/// value, so the same result as on AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn gelu_tanh_mul_avx512(gate: &mut [f32], up: &[f32]) {
    use std::arch::x86_64::*;
    let whole = gate.len() / 16 * 16;
    let (g, u) = (gate.as_mut_ptr(), up.as_ptr());
    let (c, k) = (
        _mm512_set1_ps(-2.0 * GELU_SQRT_2_OVER_PI),
        _mm512_set1_ps(GELU_CUBIC),
    );
    for i in (0..whole).step_by(16) {
        let x = _mm512_loadu_ps(g.add(i));
        let x3 = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
        let minus_2y = _mm512_mul_ps(c, _mm512_fmadd_ps(k, x3, x));
        let e = exp_avx512(minus_2y);
        let gelu = _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0), e));
        _mm512_storeu_ps(g.add(i), _mm512_mul_ps(gelu, _mm512_loadu_ps(u.add(i))));
    }
    gelu_tanh_mul_avx2(&mut gate[whole..], &up[whole..]);
}

/// `e^x` per lane: `2^n · p(r)` with `x = n·ln 2 + r`, `|r| ≤ ln 2 / 2`, and a degree-6
/// polynomial (relative error about 2e-7); `x ≤ -88` gives 0, as softmax needs.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(crate) unsafe fn exp_avx2(x: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let x = _mm256_min_ps(x, _mm256_set1_ps(88.0));
    let underflow = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(-87.0));
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        x,
        _mm256_set1_ps(std::f32::consts::LOG2_E),
    ));
    // ln 2 split in two so `n · ln 2` subtracts without losing `r`'s low bits.
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_145_75), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428_606_8e-6), r);
    let mut p = _mm256_set1_ps(1.0 / 720.0);
    for c in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    let pow2n = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
        _mm256_cvtps_epi32(n),
        _mm256_set1_epi32(127),
    )));
    _mm256_andnot_ps(underflow, _mm256_mul_ps(p, pow2n))
}

/// [`exp_avx2`] on sixteen lanes: the same operations per lane, so the same values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) unsafe fn exp_avx512(x: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    let x = _mm512_min_ps(x, _mm512_set1_ps(88.0));
    let kept = _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(x, _mm512_set1_ps(-87.0));
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
        _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)),
    );
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_145_75), x);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428_606_8e-6), r);
    let mut p = _mm512_set1_ps(1.0 / 720.0);
    for c in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
    }
    let pow2n = _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(
        _mm512_cvtps_epi32(n),
        _mm512_set1_epi32(127),
    )));
    _mm512_maskz_mov_ps(kept, _mm512_mul_ps(p, pow2n))
}

/// How RoPE pairs the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs `(2i, 2i+1)`: Llama as stored in GGUF (Q/K rows were permuted at conversion).
    Interleaved,
    /// Halves `(i, i + d/2)`: Qwen2 and other "NeoX" models.
    Neox,
}

/// Inverse frequencies `base^(-2i/d)` for `i < n_rot/2`, computed as the reference does in f32.
pub fn rope_inv_freq(n_rot: usize, base: f32) -> Vec<f32> {
    (0..n_rot / 2)
        .map(|i| 1.0 / base.powf((2 * i) as f32 / n_rot as f32))
        .collect()
}

/// Rotates every head in `x` (`[n_head, head_dim]`) for position `pos`; only the first
/// `2 * inv_freq.len()` dimensions of each head rotate.
pub fn rope_in_place(
    x: &mut [f32],
    head_dim: usize,
    pos: usize,
    inv_freq: &[f32],
    style: RopeStyle,
) {
    debug_assert!(x.len().is_multiple_of(head_dim) && 2 * inv_freq.len() <= head_dim);
    let n_rot = 2 * inv_freq.len();
    // Frequencies outside, heads inside: one `sin_cos` (a libm call) per frequency serves
    // every head.
    for (i, &freq) in inv_freq.iter().enumerate() {
        let theta = pos as f32 * freq;
        let (sin, cos) = theta.sin_cos();
        let (a, b) = match style {
            RopeStyle::Interleaved => (2 * i, 2 * i + 1),
            RopeStyle::Neox => (i, i + n_rot / 2),
        };
        for head in x.chunks_exact_mut(head_dim) {
            let (x0, x1) = (head[a], head[b]);
            head[a] = x0 * cos - x1 * sin;
            head[b] = x0 * sin + x1 * cos;
        }
    }
}

/// Index of the largest logit, the lowest index among equals; a NaN never wins, and
/// with nothing above -inf the answer is 0.
///
/// Two passes in sixteen lanes, the maximum and then the first chunk holding it, because
/// a running index does not vectorise and this scans the whole vocabulary for every
/// greedy token of a batch (49,152 logits for SmolLM2: 2.6 % of a 32-row decode step
/// done one logit at a time, 0.7 % this way).
pub fn argmax(logits: &[f32]) -> u32 {
    const LANES: usize = 16;
    let larger = |m: f32, l: f32| if l > m { l } else { m };
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = logits.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (m, &l) in lanes.iter_mut().zip(chunk) {
            *m = larger(*m, l);
        }
    }
    let max = lanes
        .iter()
        .chain(tail)
        .fold(f32::NEG_INFINITY, |m, &l| larger(m, l));
    if max == f32::NEG_INFINITY {
        return 0;
    }
    let holds_max = |chunk: &[f32]| chunk.iter().fold(false, |found, &l| found | (l == max));
    let Some((c, chunk)) = logits
        .chunks(LANES)
        .enumerate()
        .find(|(_, chunk)| holds_max(chunk))
    else {
        return 0;
    };
    let within = chunk.iter().position(|&l| l == max).unwrap_or(0);
    (c * LANES + within) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first strictly larger logit wins, one at a time: what [`argmax`] must equal.
    fn argmax_one_by_one(logits: &[f32]) -> u32 {
        let mut best = None;
        for (i, &l) in logits.iter().enumerate() {
            if l > best.map_or(f32::NEG_INFINITY, |b: usize| logits[b]) {
                best = Some(i);
            }
        }
        best.unwrap_or(0) as u32
    }

    #[test]
    fn argmax_takes_the_first_of_the_largest_in_any_lane() {
        let mut seed = 7u64;
        let mut next = move || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 40) as u32
        };
        for len in [0, 1, 5, 15, 16, 17, 31, 33, 100, 1000, 49_152] {
            for _ in 0..20 {
                // Few distinct values, so the maximum is often tied across lanes and chunks.
                let mut logits: Vec<f32> = (0..len).map(|_| (next() % 7) as f32 - 3.0).collect();
                if len > 0 && next() % 3 == 0 {
                    let nan_at = next() as usize % len;
                    logits[nan_at] = f32::NAN;
                }
                assert_eq!(argmax(&logits), argmax_one_by_one(&logits), "len {len}");
            }
        }
        assert_eq!(argmax(&[f32::NEG_INFINITY, f32::NAN, f32::NEG_INFINITY]), 0);
        assert_eq!(argmax(&[f32::NAN, -1.0, 2.0, 2.0]), 2);
    }

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
    fn vectorised_silu_matches_scalar() {
        for len in [1, 7, 8, 13, 96, 1000, 1021] {
            // Past ±88 the vector `exp` saturates; SiLU is then `x` or ±0 either way.
            let gate: Vec<f32> = crate::test_support::random(len, len as u64)
                .iter()
                .enumerate()
                .map(|(i, v)| if i % 97 == 5 { v * 200.0 } else { v * 12.0 })
                .collect();
            let up = crate::test_support::random(len, len as u64 + 1);
            let mut expected = gate.clone();
            silu_mul_in_place_with(Isa::Scalar, &mut expected, &up);
            // AVX-512 runs AVX2's operations per value: the same bits.
            let on = |isa| {
                let mut got = gate.clone();
                silu_mul_in_place_with(isa, &mut got, &up);
                got.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            };
            for isa in Isa::available()
                .into_iter()
                .filter(|&isa| isa >= Isa::Avx512)
            {
                assert_eq!(on(isa), on(Isa::Avx2), "{isa} len {len}");
            }
            for isa in Isa::available() {
                let mut got = gate.clone();
                silu_mul_in_place_with(isa, &mut got, &up);
                for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
                    assert!(
                        (g - e).abs() <= 1e-6 * e.abs().max(1e-3),
                        "{isa} len {len} at {i}: {g} vs {e} (gate {})",
                        gate[i]
                    );
                }
            }
        }
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn sixteen_lane_exp_equals_two_eight_lane_ones() {
        use std::arch::x86_64::*;
        if !Isa::available().contains(&Isa::Avx512) {
            return;
        }
        let mut xs: Vec<f32> = (0..4096).map(|i| -100.0 + i as f32 * 0.0495).collect();
        xs.extend([
            f32::NEG_INFINITY,
            -87.0,
            -87.000_01,
            -88.0,
            0.0,
            -0.0,
            88.0,
            89.0,
        ]);
        xs.extend([
            f32::INFINITY,
            f32::NAN,
            -1e-30,
            1e-30,
            -20.5,
            0.3466,
            -0.3466,
            1.0,
        ]);
        for chunk in xs.chunks_exact(16) {
            let (mut wide, mut narrow) = ([0.0f32; 16], [0.0f32; 16]);
            // SAFETY: the CPU has AVX-512F (checked above), so AVX2 and FMA too.
            unsafe {
                _mm512_storeu_ps(
                    wide.as_mut_ptr(),
                    exp_avx512(_mm512_loadu_ps(chunk.as_ptr())),
                );
                for half in 0..2 {
                    let x = _mm256_loadu_ps(chunk.as_ptr().add(8 * half));
                    _mm256_storeu_ps(narrow.as_mut_ptr().add(8 * half), exp_avx2(x));
                }
            }
            assert_eq!(
                wide.map(f32::to_bits),
                narrow.map(f32::to_bits),
                "{chunk:?}"
            );
        }
    }

    #[test]
    fn vectorised_gelu_tanh_matches_scalar() {
        for len in [1, 7, 8, 13, 96, 1000, 1021] {
            let gate: Vec<f32> = crate::test_support::random(len, len as u64)
                .iter()
                .enumerate()
                .map(|(i, v)| if i % 97 == 5 { v * 200.0 } else { v * 12.0 })
                .collect();
            let up = crate::test_support::random(len, len as u64 + 1);
            let mut expected = gate.clone();
            gelu_tanh_mul_in_place_with(Isa::Scalar, &mut expected, &up);
            // AVX-512 runs AVX2's operations per value: the same bits.
            let on = |isa| {
                let mut got = gate.clone();
                gelu_tanh_mul_in_place_with(isa, &mut got, &up);
                got.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            };
            for isa in Isa::available()
                .into_iter()
                .filter(|&isa| isa >= Isa::Avx512)
            {
                assert_eq!(on(isa), on(Isa::Avx2), "{isa} len {len}");
            }
            for isa in Isa::available() {
                let mut got = gate.clone();
                gelu_tanh_mul_in_place_with(isa, &mut got, &up);
                for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
                    // The oracle's `1 + tanh y` loses up to an ulp of 1 where it cancels:
                    // an error of about `1e-7 · |x · up|`, however small the result.
                    let tol = 1e-6 * e.abs() + 2e-7 * (gate[i] * up[i]).abs();
                    assert!(
                        (g - e).abs() <= tol,
                        "{isa} len {len} at {i}: {g} vs {e} (gate {})",
                        gate[i]
                    );
                }
            }
        }
        // Known values of PyTorch's gelu(approximate="tanh").
        let mut g = [0.0f32, 1.0, -1.0, 3.0];
        gelu_tanh_mul_in_place_with(Isa::Scalar, &mut g, &[1.0; 4]);
        for (got, want) in g.iter().zip([0.0, 0.841_192, -0.158_808, 2.996_363]) {
            assert!((got - want).abs() < 1e-5, "{got} vs {want}");
        }
    }

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

    #[test]
    fn rope_preserves_norm_and_is_identity_at_zero() {
        let inv_freq = rope_inv_freq(8, 10000.0);
        for style in [RopeStyle::Interleaved, RopeStyle::Neox] {
            let orig: Vec<f32> = (0..16).map(|i| i as f32 * 0.1 - 0.5).collect();
            let mut x = orig.clone();
            rope_in_place(&mut x, 8, 0, &inv_freq, style);
            assert_eq!(x, orig);
            rope_in_place(&mut x, 8, 37, &inv_freq, style);
            assert!((dot(&x, &x) - dot(&orig, &orig)).abs() < 1e-4);
            assert_ne!(x, orig);
        }
    }

    #[test]
    fn vectorised_dot_and_axpy_match_scalar() {
        for len in [0, 1, 15, 16, 17, 64, 100] {
            let a: Vec<f32> = (0..len).map(|i| (i as f32 * 0.37).sin()).collect();
            let b: Vec<f32> = (0..len).map(|i| (i as f32 * 0.11).cos()).collect();
            assert!((dot(&a, &b) - dot_scalar(&a, &b)).abs() < 1e-5, "len {len}");
            let (mut y, mut y_ref) = (b.clone(), b.clone());
            axpy(&mut y, 0.5, &a);
            axpy_scalar(&mut y_ref, 0.5, &a);
            assert_eq!(y, y_ref, "len {len}");
        }
    }

    #[test]
    fn outlier_product_matches_scalar_and_each_row_alone() {
        // (outlier channels, outputs, rows): a partial tile of each width, and on the wide
        // path a full one, a partial one and a tail past the last 32 columns.
        for (n_o, n_out, m) in [(5, 45, 6), (3, 100, 11)] {
            let w: Vec<f16> = (0..n_o * n_out)
                .map(|i| f16::from_f32((i as f32 * 0.37).sin()))
                .collect();
            let x: Vec<f32> = (0..m * n_o)
                .map(|i| (i as f32 * 0.11).cos() * 3.0)
                .collect();
            let start: Vec<f32> = (0..m * n_out).map(|i| (i as f32 * 0.05).sin()).collect();
            let run = |isa, x: &[f32], start: &[f32], cols: Range<usize>| {
                let mut out = start.to_vec();
                let shared = SharedSlice::new(&mut out);
                // SAFETY: one thread owns every column.
                unsafe { outlier_product_cols_with(isa, x, n_o, &w, &shared, n_out, cols) };
                out
            };
            for cols in [0..n_out, 16..n_out, 3..7] {
                let expected = run(Isa::Scalar, &x, &start, cols.clone());
                let last = m - 1;
                for isa in Isa::available() {
                    let got = run(isa, &x, &start, cols.clone());
                    assert_eq!(got, expected, "{isa} {cols:?}");
                    // The last row alone (a batch of one) gets exactly its values in the batch.
                    let alone = run(isa, &x[last * n_o..], &start[last * n_out..], cols.clone());
                    assert_eq!(alone, got[last * n_out..], "{isa} {cols:?}");
                }
                let untouched = (0..n_out).filter(|j| !cols.contains(j));
                assert!(untouched.into_iter().all(|j| expected[j] == start[j]));
            }
        }
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

    #[test]
    fn dot_matches_naive_on_ragged_lengths() {
        for len in [0, 1, 7, 8, 9, 31] {
            let a: Vec<f32> = (0..len).map(|i| i as f32).collect();
            let naive: f32 = a.iter().map(|v| v * v).sum();
            assert_eq!(dot(&a, &a), naive);
        }
    }
}
