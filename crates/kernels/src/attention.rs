//! Attention of one token's query heads that share a KV head (grouped-query attention)
//! over that head's cached rows, and of a block of consecutive tokens at once.
//!
//! Walking the cache once per query head reads every key and value `group` times (seven
//! for Qwen2.5) and, with an f16 or INT8 cache, widens each element as often. Taking the
//! heads of a group together reads and widens each row once: a key row's eight-value
//! chunks meet every head's query while in registers, and a value chunk meets every
//! head's weight. That is what makes long contexts cost what reading their cache costs.
//!
//! A prompt chunk or a speculative draft has consecutive rows over the same cache: row `r`
//! attends to the first `first_len + r` positions. Taken one row at a time, every row
//! reads the whole cache again; past the last-level cache that is the cost of prefill at
//! depth. [`attend_rows`] takes up to [`MAX_ROWS`] of them per call: each key row meets
//! every query row while it is in L1, and the values are read in blocks of
//! [`VALUE_BLOCK`] positions that every query row uses before the next block. Each row's
//! arithmetic is exactly the single-row kernel's (the same products and sums in the same
//! order; one row is the same code with `n_rows = 1`), so a row's result does not depend
//! on the block it is in: chunked prefill equals whole prefill, and a verified draft's
//! logits equal plain decoding's, bit for bit.
//!
//! The scalar oracle is the plain per-head path ([`attention_scores`], [`softmax_in_place`],
//! [`weighted_sum`] and their f16 and INT8 forms). The AVX2 version computes the same
//! softmax-weighted sums in another order (and with a polynomial `exp`), so the two agree
//! to rounding, not bit for bit.

use half::f16;

use crate::isa::{self, Isa};
use crate::ops::{
    attention_scores, attention_scores_f16, attention_scores_i8, softmax_in_place, weighted_sum,
    weighted_sum_f16, weighted_sum_i8,
};

/// Query heads one call takes at most: the lanes of one AVX2 register of scores.
pub const MAX_GROUP: usize = 8;

/// Query rows [`attend_rows`] takes at most: each block reads its KV head's cache once.
/// 16 rather than 8 made prefill 3-6 % faster on Sapphire Rapids (pp512, both models).
pub const MAX_ROWS: usize = 16;

/// Value positions read once for every query row of a block.
pub const VALUE_BLOCK: usize = 64;

/// Score floats a thread's scratch needs for up to `n_rows` rows of one segment over
/// caches of up to `n_pos` positions.
pub fn scratch_len(n_pos: usize, n_rows: usize) -> usize {
    n_pos * MAX_GROUP * n_rows.min(MAX_ROWS)
}

/// One KV head's cached rows, `[n_pos, head_dim]`, in the cache's storage type.
#[derive(Debug, Clone, Copy)]
pub enum KvRows<'a> {
    F32 {
        keys: &'a [f32],
        values: &'a [f32],
    },
    F16 {
        keys: &'a [f16],
        values: &'a [f16],
    },
    /// INT8 rows with one scale per row, `[n_pos]`.
    Int8 {
        keys: &'a [i8],
        key_scales: &'a [f32],
        values: &'a [i8],
        value_scales: &'a [f32],
    },
}

impl<'a> KvRows<'a> {
    fn len(&self) -> usize {
        match self {
            KvRows::F32 { keys, .. } => keys.len(),
            KvRows::F16 { keys, .. } => keys.len(),
            KvRows::Int8 { keys, .. } => keys.len(),
        }
    }

    /// The first `n_pos` rows (at most all of them).
    fn prefix(self, n_pos: usize, head_dim: usize) -> KvRows<'a> {
        let n_rows = self.len() / head_dim;
        self.span(0..n_pos.min(n_rows), head_dim)
    }

    /// The rows from position `start` on (none if `start` is past the end): the span a
    /// sliding-window layer attends to.
    pub fn skip(self, start: usize, head_dim: usize) -> KvRows<'a> {
        let n_rows = self.len() / head_dim;
        self.span(start.min(n_rows)..n_rows, head_dim)
    }

    /// Rows `rows` (within the rows held) of keys, values and scales.
    fn span(self, rows: std::ops::Range<usize>, head_dim: usize) -> KvRows<'a> {
        let elems = rows.start * head_dim..rows.end * head_dim;
        match self {
            KvRows::F32 { keys, values } => KvRows::F32 {
                keys: &keys[elems.clone()],
                values: &values[elems],
            },
            KvRows::F16 { keys, values } => KvRows::F16 {
                keys: &keys[elems.clone()],
                values: &values[elems],
            },
            KvRows::Int8 {
                keys,
                key_scales,
                values,
                value_scales,
            } => KvRows::Int8 {
                keys: &keys[elems.clone()],
                key_scales: &key_scales[rows.clone()],
                values: &values[elems],
                value_scales: &value_scales[rows],
            },
        }
    }

    /// Whether keys, values and scales describe `len / head_dim` whole rows.
    fn is_consistent(&self, head_dim: usize) -> bool {
        let n_pos = self.len() / head_dim;
        let same = match *self {
            KvRows::F32 { keys, values } => keys.len() == values.len(),
            KvRows::F16 { keys, values } => keys.len() == values.len(),
            KvRows::Int8 {
                keys,
                key_scales,
                values,
                value_scales,
            } => {
                keys.len() == values.len()
                    && key_scales.len() == n_pos
                    && value_scales.len() == n_pos
            }
        };
        same && self.len() == n_pos * head_dim
    }
}

/// `out[h] = softmax(scale · q[h] · keysᵀ) · values` for each of the `n_q = q.len() /
/// head_dim` query heads (at most [`MAX_GROUP`]); `q` and `out` are `[n_q, head_dim]`.
/// `scratch` is reused between calls (`8 · n_pos` floats).
pub fn attend_group(
    q: &[f32],
    head_dim: usize,
    kv: KvRows<'_>,
    scale: f32,
    scratch: &mut Vec<f32>,
    out: &mut [f32],
) {
    attend_group_with(isa::active(), q, head_dim, kv, scale, scratch, out)
}

/// As [`attend_group`] with an explicit ISA (tests compare every ISA against scalar).
pub fn attend_group_with(
    isa: Isa,
    q: &[f32],
    head_dim: usize,
    kv: KvRows<'_>,
    scale: f32,
    scratch: &mut Vec<f32>,
    out: &mut [f32],
) {
    assert!(head_dim > 0, "head_dim must be positive");
    let n_pos = kv.len() / head_dim;
    attend_rows_with(isa, &[q], head_dim, kv, n_pos, scale, scratch, &mut [out]);
}

/// Causal attention of consecutive query rows over one KV head: row `r` (`q[r]`, `[n_q,
/// head_dim]` with `n_q <= MAX_GROUP`, the same for every row) attends to the first
/// `first_len + r` positions of `kv`, which holds at least `first_len + q.len() - 1`, and
/// writes `out[r]`. At most [`MAX_ROWS`] rows; `scratch` is reused between calls
/// ([`scratch_len`] floats). Each row's result is exactly what
/// [`attend_group`] gives it alone.
pub fn attend_rows(
    q: &[&[f32]],
    head_dim: usize,
    kv: KvRows<'_>,
    first_len: usize,
    scale: f32,
    scratch: &mut Vec<f32>,
    out: &mut [&mut [f32]],
) {
    attend_rows_with(
        isa::active(),
        q,
        head_dim,
        kv,
        first_len,
        scale,
        scratch,
        out,
    )
}

/// As [`attend_rows`] with an explicit ISA.
#[allow(clippy::too_many_arguments)]
pub fn attend_rows_with(
    isa: Isa,
    q: &[&[f32]],
    head_dim: usize,
    kv: KvRows<'_>,
    first_len: usize,
    scale: f32,
    scratch: &mut Vec<f32>,
    out: &mut [&mut [f32]],
) {
    assert!(head_dim > 0, "head_dim must be positive");
    isa.assert_supported();
    let n_rows = q.len();
    assert!(
        n_rows <= MAX_ROWS && out.len() == n_rows,
        "at most {MAX_ROWS} rows, one output per query row"
    );
    let Some(first) = q.first() else {
        return;
    };
    let n_q = first.len() / head_dim;
    assert!(
        first.len() == n_q * head_dim
            && n_q <= MAX_GROUP
            && q.iter().all(|r| r.len() == first.len())
            && out.iter().all(|o| o.len() == first.len()),
        "every query row and output must be [n_q <= {MAX_GROUP}, head_dim]"
    );
    assert!(
        kv.is_consistent(head_dim),
        "keys and values must be [n_pos, head_dim] (with a scale per row)"
    );
    let last_len = first_len + n_rows - 1;
    assert!(
        last_len <= kv.len() / head_dim,
        "the last row attends to {last_len} positions but the cache holds {}",
        kv.len() / head_dim
    );
    if n_q == 0 {
        return;
    }
    if last_len == 0 {
        // Only a single row can see no position: it attends to nothing.
        out.iter_mut().for_each(|o| o.fill(0.0));
        return;
    }
    let kv = kv.prefix(last_len, head_dim);
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::detect` requires AVX2, FMA and F16C for `Isa::Avx2` and every
        // family above it; the shapes were checked above, and every row sees a position.
        Isa::Amx | Isa::Avx512 | Isa::Avx2 if head_dim.is_multiple_of(8) && first_len > 0 => unsafe {
            let wide = isa >= Isa::Avx512 && head_dim.is_multiple_of(16);
            x86::attend_rows(q, head_dim, kv, first_len, scale, scratch, out, wide)
        },
        _ => {
            for (r, (q_r, o)) in q.iter().zip(out.iter_mut()).enumerate() {
                let seen = kv.prefix(first_len + r, head_dim);
                if first_len + r == 0 {
                    o.fill(0.0);
                } else {
                    attend_group_scalar(q_r, head_dim, seen, scale, scratch, o);
                }
            }
        }
    }
}

/// The oracle: each head on its own.
fn attend_group_scalar(
    q: &[f32],
    head_dim: usize,
    kv: KvRows<'_>,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    for (q_h, o) in q.chunks_exact(head_dim).zip(out.chunks_exact_mut(head_dim)) {
        match kv {
            KvRows::F32 { keys, values } => {
                attention_scores(q_h, keys, scale, scores);
                softmax_in_place(scores);
                weighted_sum(scores, values, o);
            }
            KvRows::F16 { keys, values } => {
                attention_scores_f16(q_h, keys, scale, scores);
                softmax_in_place(scores);
                weighted_sum_f16(scores, values, o);
            }
            KvRows::Int8 {
                keys,
                key_scales,
                values,
                value_scales,
            } => {
                attention_scores_i8(q_h, keys, key_scales, scale, scores);
                softmax_in_place(scores);
                weighted_sum_i8(scores, values, value_scales, o);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use half::f16;

    use super::{KvRows, MAX_GROUP, MAX_ROWS};
    use crate::ops::exp_avx2 as exp256;
    use crate::ops::exp_avx512 as exp512;

    /// A cache element type: eight of them widen to one f32 vector.
    trait Widen: Copy {
        /// # Safety
        /// Eight elements are readable at `p`; the CPU has AVX2 and F16C.
        unsafe fn load8(p: *const Self) -> __m256;

        /// # Safety
        /// Sixteen elements are readable at `p`; the CPU has AVX-512 F and BW.
        unsafe fn load16(p: *const Self) -> __m512;
    }

    impl Widen for f32 {
        #[target_feature(enable = "avx2,f16c")]
        #[inline]
        unsafe fn load8(p: *const Self) -> __m256 {
            _mm256_loadu_ps(p)
        }

        #[target_feature(enable = "avx512f,avx512bw")]
        #[inline]
        unsafe fn load16(p: *const Self) -> __m512 {
            _mm512_loadu_ps(p)
        }
    }

    impl Widen for f16 {
        #[target_feature(enable = "avx2,f16c")]
        #[inline]
        unsafe fn load8(p: *const Self) -> __m256 {
            _mm256_cvtph_ps(_mm_loadu_si128(p.cast()))
        }

        #[target_feature(enable = "avx512f,avx512bw")]
        #[inline]
        unsafe fn load16(p: *const Self) -> __m512 {
            _mm512_cvtph_ps(_mm256_loadu_si256(p.cast()))
        }
    }

    impl Widen for i8 {
        #[target_feature(enable = "avx2,f16c")]
        #[inline]
        unsafe fn load8(p: *const Self) -> __m256 {
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p.cast())))
        }

        #[target_feature(enable = "avx512f,avx512bw")]
        #[inline]
        unsafe fn load16(p: *const Self) -> __m512 {
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p.cast())))
        }
    }

    /// # Safety
    /// The CPU has AVX2, FMA and F16C; `head_dim` is a multiple of 8; the shapes are as
    /// [`super::attend_rows_with`] checks, with at least one query head, `first_len >= 1`
    /// and `kv` holding exactly the last row's positions. `wide`: the CPU has AVX-512 (F,
    /// BW, VL) and `head_dim` is a multiple of 16, so the 16-lane paths may run.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn attend_rows(
        q: &[&[f32]],
        head_dim: usize,
        kv: KvRows<'_>,
        first_len: usize,
        scale: f32,
        scratch: &mut Vec<f32>,
        out: &mut [&mut [f32]],
        wide: bool,
    ) {
        macro_rules! by_group {
            ($keys:expr, $ks:expr, $values:expr, $vs:expr) => {{
                let cache = Cache {
                    keys: $keys,
                    key_scales: $ks,
                    values: $values,
                    value_scales: $vs,
                    head_dim,
                };
                match q[0].len() / head_dim {
                    1 => rows::<_, 1, 8, 8>(q, &cache, first_len, scale, scratch, out, wide),
                    2 => rows::<_, 2, 4, 4>(q, &cache, first_len, scale, scratch, out, wide),
                    3 => rows::<_, 3, 3, 2>(q, &cache, first_len, scale, scratch, out, wide),
                    4 => rows::<_, 4, 2, 2>(q, &cache, first_len, scale, scratch, out, wide),
                    5 => rows::<_, 5, 2, 1>(q, &cache, first_len, scale, scratch, out, wide),
                    6 => rows::<_, 6, 2, 1>(q, &cache, first_len, scale, scratch, out, wide),
                    7 => rows::<_, 7, 1, 1>(q, &cache, first_len, scale, scratch, out, wide),
                    8 => rows::<_, 8, 1, 1>(q, &cache, first_len, scale, scratch, out, wide),
                    n_q => unreachable!("{n_q} query heads: the caller checks 1..={MAX_GROUP}"),
                }
            }};
        }
        match kv {
            KvRows::F32 { keys, values } => by_group!(keys, None, values, None),
            KvRows::F16 { keys, values } => by_group!(keys, None, values, None),
            KvRows::Int8 {
                keys,
                key_scales,
                values,
                value_scales,
            } => by_group!(keys, Some(key_scales), values, Some(value_scales)),
        }
    }

    /// One KV head's rows in their storage type.
    struct Cache<'a, T> {
        keys: &'a [T],
        key_scales: Option<&'a [f32]>,
        values: &'a [T],
        value_scales: Option<&'a [f32]>,
        head_dim: usize,
    }

    /// Scores are kept position-major per row, `[n_rows][n_pos][8]` with head `h` in lane
    /// `h`, so the softmax of all heads runs on whole vectors. Row `r`'s products, sums and
    /// exponentials are the same operations in the same order whatever `n_rows` is: the
    /// loops over rows only sit inside the loops over positions, so that a key row and a
    /// block of value rows are read once for every query row.
    ///
    /// A sum of products is a chain of fused multiply-adds, each waiting for the last. A
    /// group of few heads (SmolLM2 has three per KV head) gives too few chains to keep the
    /// multipliers busy, so the scores take `P` positions and the weighted sums `Z`
    /// eight-wide column chunks at once: more independent chains, and every element still
    /// the same chain in the same order, so the results do not depend on `P` or `Z`.
    /// `wide` (AVX-512) runs the same chains two positions to a vector: scores in pairs
    /// ([`score_pairs_wide`]), exponentials and weighted sums 16 lanes at a time.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn rows<T: Widen, const NQ: usize, const P: usize, const Z: usize>(
        q: &[&[f32]],
        cache: &Cache<'_, T>,
        first_len: usize,
        scale: f32,
        scratch: &mut Vec<f32>,
        out: &mut [&mut [f32]],
        wide: bool,
    ) {
        const { assert!(NQ <= MAX_GROUP) };
        let head_dim = cache.head_dim;
        let n_rows = q.len();
        let n_pos = cache.keys.len() / head_dim;
        let len = |r: usize| first_len + r;
        scratch.clear();
        scratch.resize(n_rows * n_pos * 8, 0.0);
        let scores = scratch.as_mut_ptr();
        let row_scores = |r: usize| scores.add(r * n_pos * 8);

        // Scores, and their running maximum per row and head, `step` positions at a time.
        let mut max = [_mm256_set1_ps(f32::NEG_INFINITY); MAX_ROWS];
        let step = if wide { 2 * wide_pairs(NQ) } else { P };
        for p0 in (0..n_pos).step_by(step) {
            // Rows from the first whose causal window holds position p0.
            let first_row = (p0 + 1).saturating_sub(first_len);
            for (r, max_r) in max.iter_mut().enumerate().take(n_rows).skip(first_row) {
                let q_r = q.get_unchecked(r).as_ptr();
                let seen = (len(r) - p0).min(step);
                if seen == step && wide {
                    score_pairs_wide::<T, NQ>(q_r, cache, p0, scale, row_scores(r), max_r);
                } else if seen == step {
                    score_positions::<T, NQ, P>(q_r, cache, p0, scale, row_scores(r), max_r);
                } else {
                    for p in p0..p0 + seen {
                        score_positions::<T, NQ, 1>(q_r, cache, p, scale, row_scores(r), max_r);
                    }
                }
            }
        }

        // exp(s - max) in place, a value row's scale folded in; the sum stays unscaled.
        let mut inv = [[0.0f32; 8]; MAX_ROWS];
        for r in 0..n_rows {
            let (at, value_scales) = (row_scores(r), cache.value_scales);
            let sum = if wide {
                exponentiate_wide(at, len(r), max[r], value_scales)
            } else {
                exponentiate(at, 0, len(r), max[r], value_scales, _mm256_setzero_ps())
            };
            _mm256_storeu_ps(inv[r].as_mut_ptr(), _mm256_div_ps(_mm256_set1_ps(1.0), sum));
        }

        let weights = Weights {
            scores,
            n_pos,
            first_len,
            n_rows,
            inv: &inv,
        };
        if wide {
            weighted_sums_wide::<T, NQ>(cache, &weights, out);
        } else {
            let chunks = head_dim / 8;
            let mut c = 0;
            while c < chunks {
                if chunks - c >= Z {
                    columns::<T, NQ, Z>(cache, &weights, out, c);
                    c += Z;
                } else {
                    columns::<T, NQ, 1>(cache, &weights, out, c);
                    c += 1;
                }
            }
        }
    }

    /// Replaces one row's scores of positions `from..to` (`scores[p][..8]`) by `exp(s - max)`
    /// times the position's value scale, if any; returns `sum` plus the exponentials, added
    /// in position order.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; `scores` holds the positions, `value_scales` (if any) too.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn exponentiate(
        scores: *mut f32,
        from: usize,
        to: usize,
        max: __m256,
        value_scales: Option<&[f32]>,
        mut sum: __m256,
    ) -> __m256 {
        for p in from..to {
            let at = scores.add(p * 8);
            let e = exp256(_mm256_sub_ps(_mm256_loadu_ps(at), max));
            sum = _mm256_add_ps(sum, e);
            let weight = match value_scales {
                Some(s) => _mm256_mul_ps(e, _mm256_set1_ps(*s.get_unchecked(p))),
                None => e,
            };
            _mm256_storeu_ps(at, weight);
        }
        sum
    }

    /// [`exponentiate`] of positions `0..len`, two positions to a 16-wide vector: the same
    /// operations per lane, and the sum still taken one position after the other.
    ///
    /// # Safety
    /// As [`exponentiate`], and the CPU has AVX-512F.
    #[target_feature(enable = "avx512f,avx2,fma")]
    #[inline]
    unsafe fn exponentiate_wide(
        scores: *mut f32,
        len: usize,
        max: __m256,
        value_scales: Option<&[f32]>,
    ) -> __m256 {
        let max2 = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(max)));
        let mut sum = _mm256_setzero_ps();
        let pairs = len / 2 * 2;
        for p in (0..pairs).step_by(2) {
            let at = scores.add(p * 8);
            let e = exp512(_mm512_sub_ps(_mm512_loadu_ps(at), max2));
            let first = _mm512_castps512_ps256(e);
            let second = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(e)));
            sum = _mm256_add_ps(_mm256_add_ps(sum, first), second);
            let weight = match value_scales {
                Some(s) => _mm512_mul_ps(
                    e,
                    _mm512_mask_blend_ps(
                        0xFF00,
                        _mm512_set1_ps(*s.get_unchecked(p)),
                        _mm512_set1_ps(*s.get_unchecked(p + 1)),
                    ),
                ),
                None => e,
            };
            _mm512_storeu_ps(at, weight);
        }
        exponentiate(scores, pairs, len, max, value_scales, sum)
    }

    /// One query row's scores of positions `p0..p0 + P` (each the lane sums of its heads'
    /// products, times the scale), stored at `dst[p][..8]` and folded into `max`.
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C; `q_r` holds `NQ` heads of `head_dim`, the cache
    /// holds the positions and `dst` has room for them.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn score_positions<T: Widen, const NQ: usize, const P: usize>(
        q_r: *const f32,
        cache: &Cache<'_, T>,
        p0: usize,
        scale: f32,
        dst: *mut f32,
        max: &mut __m256,
    ) {
        let head_dim = cache.head_dim;
        let keys = cache.keys.as_ptr();
        let mut acc = [[_mm256_setzero_ps(); 8]; P];
        for c in 0..head_dim / 8 {
            let mut k = [_mm256_setzero_ps(); P];
            for (i, k_i) in k.iter_mut().enumerate() {
                *k_i = T::load8(keys.add((p0 + i) * head_dim + c * 8));
            }
            for h in 0..NQ {
                let q_hc = _mm256_loadu_ps(q_r.add(h * head_dim + c * 8));
                for (acc_i, k_i) in acc.iter_mut().zip(&k) {
                    acc_i[h] = _mm256_fmadd_ps(q_hc, *k_i, acc_i[h]);
                }
            }
        }
        for (i, acc_i) in acc.iter().enumerate() {
            let p = p0 + i;
            let row_scale = cache
                .key_scales
                .map_or(scale, |s| scale * *s.get_unchecked(p));
            let s = _mm256_mul_ps(sum_lanes::<NQ>(acc_i), _mm256_set1_ps(row_scale));
            _mm256_storeu_ps(dst.add(p * 8), s);
            *max = _mm256_max_ps(*max, s);
        }
    }

    /// Position pairs [`score_pairs_wide`] takes at once for a group of `nq` heads: as many
    /// sums as fit in 32 registers beside the keys.
    const fn wide_pairs(nq: usize) -> usize {
        match nq {
            1..=3 => 4,
            4..=6 => 2,
            _ => 1,
        }
    }

    /// [`score_positions`] of `2 · wide_pairs(NQ)` positions with AVX-512: two positions
    /// to a vector, lanes 0–7 the first one's and 8–15 the second's, so every lane is the
    /// 8-wide path's chain and the lane sums its additions, on half the instructions.
    ///
    /// # Safety
    /// As [`score_positions`], and the CPU has AVX-512 F.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    #[inline]
    unsafe fn score_pairs_wide<T: Widen, const NQ: usize>(
        q_r: *const f32,
        cache: &Cache<'_, T>,
        p0: usize,
        scale: f32,
        dst: *mut f32,
        max: &mut __m256,
    ) {
        match wide_pairs(NQ) {
            4 => score_pairs::<T, NQ, 4>(q_r, cache, p0, scale, dst, max),
            2 => score_pairs::<T, NQ, 2>(q_r, cache, p0, scale, dst, max),
            _ => score_pairs::<T, NQ, 1>(q_r, cache, p0, scale, dst, max),
        }
    }

    /// Two 8-lane vectors as one 16-lane one, `lo` in lanes 0–7.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn join(lo: __m256, hi: __m256) -> __m512 {
        let lo = _mm512_castpd256_pd512(_mm256_castps_pd(lo));
        _mm512_castpd_ps(_mm512_insertf64x4::<1>(lo, _mm256_castps_pd(hi)))
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    #[inline]
    unsafe fn score_pairs<T: Widen, const NQ: usize, const PAIRS: usize>(
        q_r: *const f32,
        cache: &Cache<'_, T>,
        p0: usize,
        scale: f32,
        dst: *mut f32,
        max: &mut __m256,
    ) {
        let head_dim = cache.head_dim;
        let keys = cache.keys.as_ptr();
        let mut acc = [[_mm512_setzero_ps(); 8]; PAIRS];
        for c in 0..head_dim / 8 {
            let mut k = [_mm512_setzero_ps(); PAIRS];
            for (i, k_i) in k.iter_mut().enumerate() {
                let first = keys.add((p0 + 2 * i) * head_dim + c * 8);
                *k_i = join(T::load8(first), T::load8(first.add(head_dim)));
            }
            for h in 0..NQ {
                let q_hc = _mm256_loadu_ps(q_r.add(h * head_dim + c * 8));
                let q_hc = join(q_hc, q_hc);
                for (acc_i, k_i) in acc.iter_mut().zip(&k) {
                    acc_i[h] = _mm512_fmadd_ps(q_hc, *k_i, acc_i[h]);
                }
            }
        }
        for (i, acc_i) in acc.iter().enumerate() {
            let sums = sum_lane_pairs::<NQ>(acc_i);
            let halves = [
                _mm512_castps512_ps256(sums),
                _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(sums))),
            ];
            for (j, half) in halves.into_iter().enumerate() {
                let p = p0 + 2 * i + j;
                let row_scale = cache
                    .key_scales
                    .map_or(scale, |s| scale * *s.get_unchecked(p));
                let s = _mm256_mul_ps(half, _mm256_set1_ps(row_scale));
                _mm256_storeu_ps(dst.add(p * 8), s);
                *max = _mm256_max_ps(*max, s);
            }
        }
    }

    /// [`sum_lanes`] of two positions at once: `acc[h]` holds head `h`'s sums of the first
    /// position in lanes 0–7 and of the second in 8–15; so does the result, head `h` in
    /// lane `h` of each half. The same additions of the same operands as [`sum_lanes`].
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn sum_lane_pairs<const NQ: usize>(acc: &[__m512; 8]) -> __m512 {
        // `vhaddps` within each 128-bit lane, which AVX-512 lacks: [a0+a1, a2+a3, b0+b1, b2+b3].
        let hadd = |a: __m512, b: __m512| {
            _mm512_add_ps(
                _mm512_shuffle_ps::<0b10_00_10_00>(a, b),
                _mm512_shuffle_ps::<0b11_01_11_01>(a, b),
            )
        };
        let s0123 = hadd(hadd(acc[0], acc[1]), hadd(acc[2], acc[3]));
        let s4567 = if NQ <= 4 {
            _mm512_setzero_ps()
        } else {
            hadd(hadd(acc[4], acc[5]), hadd(acc[6], acc[7]))
        };
        // 128-bit lanes: s0123 = [A0, A1, B0, B1] (A the first position, B the second),
        // s4567 = [C0, C1, D0, D1]; the sums are [A0 + A1, B0 + B1, C0 + C1, D0 + D1].
        let sums = _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b10_00_10_00>(s0123, s4567),
            _mm512_shuffle_f32x4::<0b11_01_11_01>(s0123, s4567),
        );
        // [A, C, B, D]: the first position's eight heads, then the second's.
        _mm512_shuffle_f32x4::<0b11_01_10_00>(sums, sums)
    }

    /// Each row's softmax weights, `[n_rows][n_pos][8]`, and its heads' `1 / Σ exp`.
    struct Weights<'a> {
        scores: *const f32,
        n_pos: usize,
        first_len: usize,
        n_rows: usize,
        inv: &'a [[f32; 8]; MAX_ROWS],
    }

    impl Weights<'_> {
        /// Row `r`'s weights of position `p`, head `h` in lane `h`.
        ///
        /// # Safety
        /// `r < n_rows`, `p < n_pos`.
        unsafe fn at(&self, r: usize, p: usize) -> *const f32 {
            self.scores.add((r * self.n_pos + p) * 8)
        }

        /// The first row whose causal window holds position `p`.
        fn first_row_seeing(&self, p: usize) -> usize {
            (p + 1).saturating_sub(self.first_len)
        }
    }

    /// `out[r][h] = inv[r][h] · Σ_p w[r][p][h] · v[p]` for output columns `8 c0..8 (c0 +
    /// Z)` of every head; each row's sums carried across value blocks in `partial` (stored
    /// and reloaded exactly), so every element is the same fused sum over `p` in order.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn columns<T: Widen, const NQ: usize, const Z: usize>(
        cache: &Cache<'_, T>,
        weights: &Weights<'_>,
        out: &mut [&mut [f32]],
        c0: usize,
    ) {
        let head_dim = cache.head_dim;
        let values = cache.values.as_ptr();
        let mut partial = [[[_mm256_setzero_ps(); Z]; NQ]; MAX_ROWS];
        for block in (0..weights.n_pos).step_by(super::VALUE_BLOCK) {
            let first_row = weights.first_row_seeing(block);
            let rows = partial.iter_mut().enumerate().take(weights.n_rows);
            for (r, part) in rows.skip(first_row) {
                let end = (block + super::VALUE_BLOCK).min(weights.first_len + r);
                let mut acc = *part;
                for p in block..end {
                    let row = values.add(p * head_dim + c0 * 8);
                    let w = weights.at(r, p);
                    let mut w_h = [_mm256_setzero_ps(); NQ];
                    for (h, w_h) in w_h.iter_mut().enumerate() {
                        *w_h = _mm256_broadcast_ss(&*w.add(h));
                    }
                    for j in 0..Z {
                        let v = T::load8(row.add(8 * j));
                        for (acc_h, w_h) in acc.iter_mut().zip(&w_h) {
                            acc_h[j] = _mm256_fmadd_ps(*w_h, v, acc_h[j]);
                        }
                    }
                }
                *part = acc;
            }
        }
        for (r, o) in out.iter_mut().enumerate() {
            let o = o.as_mut_ptr();
            for (h, acc_h) in partial[r].iter().enumerate() {
                let inv = _mm256_set1_ps(weights.inv[r][h]);
                for (j, a) in acc_h.iter().enumerate() {
                    let at = o.add(h * head_dim + (c0 + j) * 8);
                    _mm256_storeu_ps(at, _mm256_mul_ps(*a, inv));
                }
            }
        }
    }

    /// [`columns`] with 16-wide vectors, 32 output columns of every head at a time
    /// (32 registers hold the sums of up to eight heads): one weight broadcast feeds two
    /// products instead of one, and the loads no longer bound the products. The same fused
    /// sum per element in the same order, so the results equal the 8-wide ones bit for bit.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    #[inline]
    unsafe fn weighted_sums_wide<T: Widen, const NQ: usize>(
        cache: &Cache<'_, T>,
        weights: &Weights<'_>,
        out: &mut [&mut [f32]],
    ) {
        let head_dim = cache.head_dim;
        let mut d = 0;
        while d < head_dim {
            if head_dim - d >= 32 {
                columns_wide::<T, NQ, 2>(cache, weights, out, d);
                d += 32;
            } else {
                columns_wide::<T, NQ, 1>(cache, weights, out, d);
                d += 16;
            }
        }
    }

    /// Output columns `d0..d0 + 16 Z` of every head and row.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    #[inline]
    unsafe fn columns_wide<T: Widen, const NQ: usize, const Z: usize>(
        cache: &Cache<'_, T>,
        weights: &Weights<'_>,
        out: &mut [&mut [f32]],
        d0: usize,
    ) {
        let head_dim = cache.head_dim;
        let values = cache.values.as_ptr();
        let mut partial = [[[_mm512_setzero_ps(); Z]; NQ]; MAX_ROWS];
        for block in (0..weights.n_pos).step_by(super::VALUE_BLOCK) {
            let first_row = weights.first_row_seeing(block);
            let rows = partial.iter_mut().enumerate().take(weights.n_rows);
            for (r, part) in rows.skip(first_row) {
                let end = (block + super::VALUE_BLOCK).min(weights.first_len + r);
                let mut acc = *part;
                for p in block..end {
                    let row = values.add(p * head_dim + d0);
                    let v: [__m512; Z] = std::array::from_fn(|j| T::load16(row.add(16 * j)));
                    let w = weights.at(r, p);
                    for (h, acc_h) in acc.iter_mut().enumerate() {
                        let w_h = _mm512_set1_ps(*w.add(h));
                        for (a, v_j) in acc_h.iter_mut().zip(&v) {
                            *a = _mm512_fmadd_ps(w_h, *v_j, *a);
                        }
                    }
                }
                *part = acc;
            }
        }
        for (r, o) in out.iter_mut().enumerate() {
            let o = o.as_mut_ptr();
            for (h, acc_h) in partial[r].iter().enumerate() {
                let inv = _mm512_set1_ps(weights.inv[r][h]);
                for (j, a) in acc_h.iter().enumerate() {
                    _mm512_storeu_ps(o.add(h * head_dim + d0 + 16 * j), _mm512_mul_ps(*a, inv));
                }
            }
        }
    }

    /// The eight horizontal sums of `acc`, lane `h` holding `Σ acc[h]`, where the heads
    /// from `NQ` on are zero. Lanes 0–3 come from heads 0–3 alone and lanes 4–7 from
    /// heads 4–7, so with four heads or fewer the upper half is a sum of zeros (zero) and
    /// is not computed: half the shuffles of a score, bit for bit the same lanes.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn sum_lanes<const NQ: usize>(acc: &[__m256; 8]) -> __m256 {
        let s01 = _mm256_hadd_ps(acc[0], acc[1]);
        let s23 = _mm256_hadd_ps(acc[2], acc[3]);
        let s0123 = _mm256_hadd_ps(s01, s23);
        if NQ <= 4 {
            let halves = _mm_add_ps(
                _mm256_castps256_ps128(s0123),
                _mm256_extractf128_ps::<1>(s0123),
            );
            return _mm256_zextps128_ps256(halves);
        }
        let s45 = _mm256_hadd_ps(acc[4], acc[5]);
        let s67 = _mm256_hadd_ps(acc[6], acc[7]);
        let s4567 = _mm256_hadd_ps(s45, s67);
        // Each 128-bit half now holds partial sums of heads 0-3 / 4-7 in lane order.
        let lo = _mm256_permute2f128_ps::<0x20>(s0123, s4567);
        let hi = _mm256_permute2f128_ps::<0x31>(s0123, s4567);
        _mm256_add_ps(lo, hi)
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use crate::test_support::random;

        /// Rows of `q` through [`rows`] with `P` positions and `Z` column chunks at once.
        fn run<T: Widen, const NQ: usize, const P: usize, const Z: usize>(
            q: &[Vec<f32>],
            cache: &Cache<'_, T>,
            first_len: usize,
        ) -> Vec<Vec<f32>> {
            let q_rows: Vec<&[f32]> = q.iter().map(Vec::as_slice).collect();
            let mut out = vec![vec![f32::NAN; q[0].len()]; q.len()];
            let mut outs: Vec<&mut [f32]> = out.iter_mut().map(Vec::as_mut_slice).collect();
            // SAFETY: the caller checked AVX2, FMA and F16C; `check` gives a head_dim that
            // is a multiple of 8, NQ heads per row and a cache of exactly the last row's
            // positions.
            unsafe {
                rows::<T, NQ, P, Z>(
                    &q_rows,
                    cache,
                    first_len,
                    0.3,
                    &mut Vec::new(),
                    &mut outs,
                    false,
                )
            };
            out
        }

        /// `rows::<NQ, P, Z>` equals `rows::<NQ, 1, 1>` bit for bit on f32 and INT8
        /// caches, across value blocks, with position groups and column chunks left over.
        fn check<const NQ: usize, const P: usize, const Z: usize>() {
            let (head_dim, first_len, n_rows) = (40, 70, 5);
            let n_pos = first_len + n_rows - 1;
            let q: Vec<Vec<f32>> = (0..n_rows)
                .map(|r| random(NQ * head_dim, 10 + r as u64))
                .collect();
            let (keys, values) = (random(n_pos * head_dim, 1), random(n_pos * head_dim, 2));
            let to_i8 = |v: &[f32]| -> Vec<i8> { v.iter().map(|x| (x * 127.0) as i8).collect() };
            let (keys_q, values_q) = (to_i8(&keys), to_i8(&values));
            let scales: Vec<f32> = random(n_pos, 3).iter().map(|s| s.abs() + 0.01).collect();
            let f32_cache = Cache {
                keys: &keys[..],
                key_scales: None,
                values: &values[..],
                value_scales: None,
                head_dim,
            };
            let i8_cache = Cache {
                keys: &keys_q[..],
                key_scales: Some(&scales[..]),
                values: &values_q[..],
                value_scales: Some(&scales[..]),
                head_dim,
            };
            assert_eq!(
                run::<_, NQ, P, Z>(&q, &f32_cache, first_len),
                run::<_, NQ, 1, 1>(&q, &f32_cache, first_len),
                "f32, {NQ} heads, P={P}, Z={Z}"
            );
            assert_eq!(
                run::<_, NQ, P, Z>(&q, &i8_cache, first_len),
                run::<_, NQ, 1, 1>(&q, &i8_cache, first_len),
                "int8, {NQ} heads, P={P}, Z={Z}"
            );
        }

        #[test]
        fn positions_and_columns_taken_together_change_no_bit() {
            if !crate::isa::Isa::available().contains(&crate::isa::Isa::Avx2) {
                return;
            }
            check::<1, 8, 8>();
            check::<2, 4, 4>();
            check::<3, 3, 2>();
            check::<4, 2, 2>();
            check::<6, 2, 1>();
            check::<3, 5, 3>();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::random;

    /// One KV head's random rows in every storage type.
    struct Caches {
        keys: Vec<f32>,
        values: Vec<f32>,
        keys_h: Vec<f16>,
        values_h: Vec<f16>,
        keys_q: Vec<i8>,
        values_q: Vec<i8>,
        key_scales: Vec<f32>,
        value_scales: Vec<f32>,
    }

    impl Caches {
        fn random(n_pos: usize, head_dim: usize, seed: u64) -> Self {
            let keys = random(n_pos * head_dim, seed);
            let values = random(n_pos * head_dim, seed + 1);
            Self {
                keys_h: keys.iter().map(|&v| f16::from_f32(v)).collect(),
                values_h: values.iter().map(|&v| f16::from_f32(v)).collect(),
                keys_q: keys.iter().map(|&v| (v * 127.0) as i8).collect(),
                values_q: values.iter().map(|&v| (v * 127.0) as i8).collect(),
                key_scales: (0..n_pos).map(|p| 0.01 + 0.001 * p as f32).collect(),
                value_scales: (0..n_pos).map(|p| 0.02 - 0.0001 * p as f32).collect(),
                keys,
                values,
            }
        }

        fn all(&self) -> [KvRows<'_>; 3] {
            [
                KvRows::F32 {
                    keys: &self.keys,
                    values: &self.values,
                },
                KvRows::F16 {
                    keys: &self.keys_h,
                    values: &self.values_h,
                },
                KvRows::Int8 {
                    keys: &self.keys_q,
                    key_scales: &self.key_scales,
                    values: &self.values_q,
                    value_scales: &self.value_scales,
                },
            ]
        }
    }

    fn check(head_dim: usize, n_q: usize, n_pos: usize, seed: u64) {
        let q: Vec<f32> = random(n_q * head_dim, seed)
            .iter()
            .map(|v| v * 3.0)
            .collect();
        let caches = Caches::random(n_pos, head_dim, seed + 1);
        let scale = 1.0 / (head_dim as f32).sqrt();
        for kv in caches.all() {
            let mut scratch = Vec::new();
            let mut want = vec![0.0; q.len()];
            attend_group_with(
                Isa::Scalar,
                &q,
                head_dim,
                kv,
                scale,
                &mut scratch,
                &mut want,
            );
            for isa in Isa::available() {
                let mut got = vec![f32::NAN; q.len()];
                attend_group_with(isa, &q, head_dim, kv, scale, &mut scratch, &mut got);
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (g - w).abs() <= 1e-5 + 1e-4 * w.abs(),
                        "{isa} hd={head_dim} n_q={n_q} n_pos={n_pos} {kv:?} at {i}: {g} vs {w}",
                        kv = std::mem::discriminant(&kv)
                    );
                }
            }
        }
    }

    #[test]
    fn grouped_heads_match_each_head_alone() {
        for (head_dim, n_q, n_pos) in [
            (8, 1, 1),
            (64, 7, 300),
            (64, 3, 17),
            (16, 8, 5),
            (24, 2, 9),
            (64, 1, 13),
            (40, 4, 9),
            (64, 6, 7),
        ] {
            check(head_dim, n_q, n_pos, head_dim as u64 + n_pos as u64);
        }
    }

    /// A block of rows gives each row exactly what that row gives alone, on every ISA,
    /// across value blocks and with rows starting anywhere.
    #[test]
    fn rows_together_equal_each_row_alone_bit_for_bit() {
        for (head_dim, n_q, first_len, n_rows) in [
            (64, 7, 1, 8),
            (64, 2, 60, 8),
            (16, 3, 127, 5),
            (8, 8, 200, 3),
            (64, 1, 64, 1),
            (48, 5, 70, 4),
            (128, 2, 33, 7),
            (20, 4, 9, 6),
            (64, 6, 2, 8),
            (64, 3, 1, 8),
            (56, 1, 5, 8),
            (64, 4, 30, 6),
            (32, 8, 45, 5),
        ] {
            let n_pos = first_len + n_rows - 1 + 3; // the cache may hold more
            let seed = (head_dim * 1000 + first_len) as u64;
            let q = random(n_rows * n_q * head_dim, seed);
            let caches = Caches::random(n_pos, head_dim, seed + 1);
            let width = n_q * head_dim;
            let q_rows: Vec<&[f32]> = q.chunks_exact(width).collect();
            for kv in caches.all() {
                let mut vector_results: Vec<(Isa, Vec<f32>)> = Vec::new();
                for isa in Isa::available() {
                    let mut got = vec![f32::NAN; n_rows * width];
                    let mut outs: Vec<&mut [f32]> = got.chunks_exact_mut(width).collect();
                    let mut scratch = Vec::new();
                    attend_rows_with(
                        isa,
                        &q_rows,
                        head_dim,
                        kv,
                        first_len,
                        0.3,
                        &mut scratch,
                        &mut outs,
                    );
                    for (r, got) in got.chunks_exact(width).enumerate() {
                        let seen = kv.prefix(first_len + r, head_dim);
                        let mut alone = vec![0.0; width];
                        attend_group_with(
                            isa,
                            q_rows[r],
                            head_dim,
                            seen,
                            0.3,
                            &mut scratch,
                            &mut alone,
                        );
                        assert_eq!(got, alone, "{isa} hd={head_dim} first={first_len} row {r}");
                        let mut oracle = vec![0.0; width];
                        attend_group_with(
                            Isa::Scalar,
                            q_rows[r],
                            head_dim,
                            seen,
                            0.3,
                            &mut scratch,
                            &mut oracle,
                        );
                        for (g, w) in got.iter().zip(&oracle) {
                            assert!(
                                (g - w).abs() <= 1e-5 + 1e-4 * w.abs(),
                                "{isa} row {r}: {g} vs {w}"
                            );
                        }
                    }
                    if isa != Isa::Scalar {
                        vector_results.push((isa, got));
                    }
                }
                // The 16-wide weighted sums equal the 8-wide ones, element for element.
                if let [(a, first), rest @ ..] = vector_results.as_slice() {
                    for (b, other) in rest {
                        assert_eq!(first, other, "{a} and {b} differ (hd={head_dim})");
                    }
                }
            }
        }
    }

    #[test]
    fn head_dims_off_the_vector_width_take_the_scalar_path() {
        check(20, 4, 11, 7);
    }

    #[test]
    fn an_empty_query_reads_and_writes_nothing() {
        // The views are empty prefixes of real buffers, so a kernel that ran anyway would
        // read the query buffer and overwrite the output's sentinels.
        let head_dim = 8;
        let q_buf = vec![1.0; MAX_GROUP * head_dim];
        let (keys, values) = (random(4 * head_dim, 1), random(4 * head_dim, 2));
        for isa in Isa::available() {
            let mut out_buf = vec![f32::NAN; MAX_GROUP * head_dim];
            let kv = KvRows::F32 {
                keys: &keys,
                values: &values,
            };
            let (q, out) = (&q_buf[..0], &mut out_buf[..0]);
            attend_group_with(isa, q, head_dim, kv, 1.0, &mut Vec::new(), out);
            assert!(
                out_buf.iter().all(|v| v.is_nan()),
                "{isa} wrote past an empty output"
            );
        }
    }

    #[test]
    fn a_dominant_position_takes_all_the_weight() {
        // Scores far apart: the softmax must not overflow, and the output is that row.
        let head_dim = 8;
        let q = vec![10.0; head_dim];
        let mut keys = vec![-10.0; 3 * head_dim];
        keys[head_dim..2 * head_dim].fill(10.0);
        let values: Vec<f32> = (0..3 * head_dim).map(|i| i as f32).collect();
        let mut out = vec![0.0; head_dim];
        for isa in Isa::available() {
            let kv = KvRows::F32 {
                keys: &keys,
                values: &values,
            };
            attend_group_with(isa, &q, head_dim, kv, 1.0, &mut Vec::new(), &mut out);
            assert_eq!(out, values[head_dim..2 * head_dim], "{isa}");
        }
    }
}
