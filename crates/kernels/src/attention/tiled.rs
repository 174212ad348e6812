//! Prefill attention in tiles: a block's query rows in the lanes of an AVX-512 vector.
//!
//! The row kernel ([`super::x86`]) puts `head_dim` in the lanes: a score is eight chains
//! of products summed across the lanes of a register, and with three heads to a group
//! (SmolLM2) five of the softmax's eight lanes carry nothing. Here a block's sixteen rows
//! are the sixteen lanes, one vector per query head. A key element, broadcast, meets every
//! row and head of the block at once; a score needs no lane sums; every lane of the
//! exponentials and of the weighted sums is a row's. It is a small matrix product on both
//! sides of the softmax, which is what makes attention at depth cost its multiply-adds
//! rather than its shuffles.
//!
//! The arithmetic is the row kernel's, element for element. Each lane runs the eight
//! chains of fused products over `d ≡ j (mod 8)` that the row kernel runs in lane `j`,
//! adds them in its tree `((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7))`, and takes the
//! same maximum, exponentials, position-ordered sums and fused weighted sums of values.
//! So a row's output is bit for bit what it gets alone, and a verified draft's logits are
//! plain decoding's. For the same reason the scores of every position are kept and the
//! softmax taken in two passes, as the row kernel does, rather than rescaled block by
//! block as flash attention does: an online softmax would change the sums, and the
//! equality with decoding is what keeps speculative verification exact.
//!
//! Keys and values are read in chunks of [`CHUNK`] positions (widened to f32 once, when
//! the cache holds f16 or INT8), and a chunk of weights meets a chunk of values while both
//! are in L1; each row's weighted sums are carried from chunk to chunk in memory, stored
//! and reloaded exactly.

use std::arch::x86_64::*;

use super::x86::Widen;
use super::{KvRows, MAX_GROUP, MAX_ROWS};
use crate::ops::exp_avx512 as exp512;

/// Rows a tile holds: the lanes of one vector.
pub(super) const LANES: usize = 16;
const _: () = assert!(MAX_ROWS <= LANES, "a block's rows must fit a tile's lanes");

/// Positions widened, scored and weighed together: a multiple of every count of positions
/// [`scores`] takes at once (1, 2, 3, 4, 6, 8, 12, 24).
const CHUNK: usize = 48;

/// Score tree slots per position and head: the partial sums `l0 + l1`, `l2 + l3` (then
/// `l4 + l5`) and `l6` waiting for the chains after them.
const TREE_SLOTS: usize = 3;

/// Positions [`scores`] takes at once and its register budget: `P · NQ` sums in flight.
const MAX_SUMS: usize = 24;

/// The lanes (rows) whose causal window holds position `p`: rows from `p + 1 -
/// first_len` on, every row before the first new position.
fn rows_seeing(p: usize, first_len: usize) -> __mmask16 {
    let hidden = (p + 1).saturating_sub(first_len) as u32;
    (u32::from(u16::MAX) << hidden.min(LANES as u32)) as __mmask16
}

/// The tiled [`super::attend_rows`].
///
/// # Safety
/// The CPU has AVX-512 F, BW and VL, FMA and F16C; `head_dim` is a multiple of 8; the
/// shapes are as [`super::attend_rows_with`] checks, with at most [`LANES`] rows, at least
/// one query head, `first_len >= 1` and `kv` holding exactly the last row's positions.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(super) unsafe fn attend_rows(
    q: &[&[f32]],
    head_dim: usize,
    kv: KvRows<'_>,
    first_len: usize,
    scale: f32,
    scratch: &mut Vec<f32>,
    out: &mut [&mut [f32]],
) {
    macro_rules! by_group {
        ($keys:expr, $ks:expr, $values:expr, $vs:expr) => {{
            let cache = Cache {
                keys: $keys,
                key_scales: $ks,
                values: $values,
                value_scales: $vs,
                head_dim,
                first_len,
            };
            // `P` positions per score step: as many sums as fit in 32 registers beside
            // their operands.
            match q[0].len() / head_dim {
                1 => tile::<_, 1, 24>(q, &cache, scale, scratch, out),
                2 => tile::<_, 2, 12>(q, &cache, scale, scratch, out),
                3 => tile::<_, 3, 8>(q, &cache, scale, scratch, out),
                4 => tile::<_, 4, 6>(q, &cache, scale, scratch, out),
                5 => tile::<_, 5, 4>(q, &cache, scale, scratch, out),
                6 => tile::<_, 6, 3>(q, &cache, scale, scratch, out),
                7 => tile::<_, 7, 2>(q, &cache, scale, scratch, out),
                8 => tile::<_, 8, 2>(q, &cache, scale, scratch, out),
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

/// One KV head's rows in their storage type, and where the block's rows start.
struct Cache<'a, T> {
    keys: &'a [T],
    key_scales: Option<&'a [f32]>,
    values: &'a [T],
    value_scales: Option<&'a [f32]>,
    head_dim: usize,
    first_len: usize,
}

impl<T: Widen> Cache<'_, T> {
    /// Positions `from..to` of `rows` as f32 `[to - from, head_dim]`: the cache itself if
    /// it is f32 and `in_place`, else widened (or copied) into `buf`, which starts on a
    /// cache line, so that vector loads of its rows do not straddle two.
    ///
    /// # Safety
    /// The CPU has AVX-512 F and BW, AVX2 and F16C; the positions are in the cache and
    /// `buf` holds `CHUNK · head_dim` floats when it is used.
    #[target_feature(enable = "avx512f,avx512bw,avx2,f16c")]
    #[inline]
    unsafe fn rows_f32(
        &self,
        rows: &[T],
        span: std::ops::Range<usize>,
        buf: *mut f32,
        in_place: bool,
    ) -> *const f32 {
        let span = &rows[span.start * self.head_dim..span.end * self.head_dim];
        if let Some(f32_rows) = T::as_f32(span).filter(|_| in_place) {
            return f32_rows.as_ptr();
        }
        let (src, n) = (span.as_ptr(), span.len());
        let mut i = 0;
        while i + 16 <= n {
            _mm512_storeu_ps(buf.add(i), T::load16(src.add(i)));
            i += 16;
        }
        // `head_dim` is a multiple of 8, so at most one group of eight is left.
        if i < n {
            _mm256_storeu_ps(buf.add(i), T::load8(src.add(i)));
        }
        buf
    }
}

/// The scratch a tile works in, as disjoint regions of one buffer.
struct Regions {
    /// The queries transposed, `[NQ][head_dim][LANES]`: head `h`, column `d` of every row.
    queries: *mut f32,
    /// `[n_pos][NQ][LANES]`: scores, then softmax weights (a value row's scale folded in).
    scores: *mut f32,
    /// `[TREE_SLOTS][P][NQ][LANES]`: a score's chains waiting for the rest of its tree.
    tree: *mut f32,
    /// A chunk of keys and one of values widened to f32, `[CHUNK][head_dim]` each.
    keys: *mut f32,
    values: *mut f32,
    /// Each row's weighted sums so far, `[NQ][LANES][head_dim]`.
    sums: *mut f32,
    /// Each head's running maximum score per row, `[NQ][LANES]`: in memory rather than
    /// registers, which the products need.
    max: *mut f32,
}

/// A block of rows against one KV head: the scores of every position, their softmax, and
/// the weighted sums of values, each lane a row.
///
/// # Safety
/// As [`attend_rows`], with `NQ` query heads and `P · NQ <= MAX_SUMS`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
unsafe fn tile<T: Widen, const NQ: usize, const P: usize>(
    q: &[&[f32]],
    cache: &Cache<'_, T>,
    scale: f32,
    scratch: &mut Vec<f32>,
    out: &mut [&mut [f32]],
) {
    const { assert!(NQ <= MAX_GROUP && P * NQ <= MAX_SUMS && CHUNK.is_multiple_of(P)) };
    let head_dim = cache.head_dim;
    let n_pos = cache.keys.len() / head_dim;
    let sizes = [
        NQ * head_dim * LANES,
        n_pos * NQ * LANES,
        TREE_SLOTS * P * NQ * LANES,
        CHUNK * head_dim,
        CHUNK * head_dim,
        NQ * LANES * head_dim,
        NQ * LANES,
    ];
    // Every region is written before it is read, so old contents need no clearing. Each
    // starts on a cache line (every size is a multiple of 16 floats): a vector load that
    // straddles two lines costs two.
    let total: usize = sizes.iter().sum::<usize>() + LANES;
    if scratch.len() < total {
        scratch.resize(total, 0.0);
    }
    let base = scratch.as_mut_ptr();
    let base = base.add(base.align_offset(64));
    let start = |i: usize| base.add(sizes[..i].iter().sum());
    let at = Regions {
        queries: start(0),
        scores: start(1),
        tree: start(2),
        keys: start(3),
        values: start(4),
        sums: start(5),
        max: start(6),
    };

    for h in 0..NQ {
        for d in 0..head_dim {
            let lanes = at.queries.add((h * head_dim + d) * LANES);
            for r in 0..LANES {
                let x = q
                    .get(r)
                    .map_or(0.0, |q_r| *q_r.get_unchecked(h * head_dim + d));
                *lanes.add(r) = x;
            }
        }
    }

    score_all::<T, NQ, P>(cache, &at, scale);
    let inv = weigh_all::<T, NQ>(cache, &at, q.len());

    for (r, o) in out.iter_mut().enumerate() {
        for (h, inv_h) in inv.iter().enumerate() {
            let sums = at.sums.add((h * LANES + r) * head_dim);
            for d in 0..head_dim {
                *o.get_unchecked_mut(h * head_dim + d) = *sums.add(d) * inv_h[r];
            }
        }
    }
}

/// Every position's scores, `scale · q · k` times the key row's scale if any, stored in
/// `at.scores`, and each head's maximum over the positions each row sees in `at.max`.
///
/// # Safety
/// As [`tile`], with `at` laid out for it.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
unsafe fn score_all<T: Widen, const NQ: usize, const P: usize>(
    cache: &Cache<'_, T>,
    at: &Regions,
    scale: f32,
) {
    let n_pos = cache.keys.len() / cache.head_dim;
    for h in 0..NQ {
        _mm512_storeu_ps(at.max.add(h * LANES), _mm512_set1_ps(f32::NEG_INFINITY));
    }
    for c0 in (0..n_pos).step_by(CHUNK) {
        let c1 = (c0 + CHUNK).min(n_pos);
        // Keys are read one element at a time, so alignment does not matter.
        let keys = cache.rows_f32(cache.keys, c0..c1, at.keys, true);
        let mut p = c0;
        while p < c1 {
            let row = keys.add((p - c0) * cache.head_dim);
            if c1 - p >= P {
                scores::<T, NQ, P>(cache, at, row, p, scale);
                p += P;
            } else {
                scores::<T, NQ, 1>(cache, at, row, p, scale);
                p += 1;
            }
        }
    }
}

/// The scores of positions `p0..p0 + P` (keys at `keys`, f32 `[P][head_dim]`), folded into
/// `at.max` where a row sees them.
///
/// The eight chains of a score are taken one after the other, each for all `P · NQ`
/// scores at once, and joined in the row kernel's tree through `at.tree`: a chain of
/// `head_dim / 8` products per score in 24 registers, where all eight chains at once
/// would leave room for only three scores.
///
/// # Safety
/// As [`score_all`]; the positions are in the cache.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
unsafe fn scores<T: Widen, const NQ: usize, const P: usize>(
    cache: &Cache<'_, T>,
    at: &Regions,
    keys: *const f32,
    p0: usize,
    scale: f32,
) {
    chain_into_tree::<T, NQ, P, 0>(cache, at, keys, p0, scale);
    chain_into_tree::<T, NQ, P, 1>(cache, at, keys, p0, scale);
    chain_into_tree::<T, NQ, P, 2>(cache, at, keys, p0, scale);
    chain_into_tree::<T, NQ, P, 3>(cache, at, keys, p0, scale);
    chain_into_tree::<T, NQ, P, 4>(cache, at, keys, p0, scale);
    chain_into_tree::<T, NQ, P, 5>(cache, at, keys, p0, scale);
    chain_into_tree::<T, NQ, P, 6>(cache, at, keys, p0, scale);
    chain_into_tree::<T, NQ, P, 7>(cache, at, keys, p0, scale);
}

/// Chain `J` of [`scores`], added into the tree `((l0 + l1) + (l2 + l3)) + ((l4 + l5) +
/// (l6 + l7))`; the last chain completes the scores, stores them and folds them into
/// `at.max`. `J` is a constant, so each step is straight-line code. Not inlined: in a
/// function of its own the chain's sums keep to registers (inlined eight times into one
/// body, they were spilled and shuffled).
///
/// # Safety
/// As [`scores`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline(never)]
unsafe fn chain_into_tree<T: Widen, const NQ: usize, const P: usize, const J: usize>(
    cache: &Cache<'_, T>,
    at: &Regions,
    keys: *const f32,
    p0: usize,
    scale: f32,
) {
    let acc = chain::<NQ, P>(at.queries, keys, cache.head_dim, J);
    for (i, acc_i) in acc.iter().enumerate() {
        for (h, &l) in acc_i.iter().enumerate() {
            let slot = |s: usize| at.tree.add(((s * P + i) * NQ + h) * LANES);
            let load = |s| _mm512_loadu_ps(slot(s));
            let store = |s, v| _mm512_storeu_ps(slot(s), v);
            match J {
                // l0, l0 + l1; l2, (l0 + l1) + (l2 + l3); l4, l4 + l5; l6.
                0 => store(0, l),
                1 => store(0, _mm512_add_ps(load(0), l)),
                2 | 4 => store(1, l),
                3 => store(0, _mm512_add_ps(load(0), _mm512_add_ps(load(1), l))),
                5 => store(1, _mm512_add_ps(load(1), l)),
                6 => store(2, l),
                _ => {
                    // (l4 + l5) + (l6 + l7), then the whole tree.
                    let high = _mm512_add_ps(load(1), _mm512_add_ps(load(2), l));
                    let p = p0 + i;
                    let row_scale = cache
                        .key_scales
                        .map_or(scale, |s| scale * *s.get_unchecked(p));
                    let s = _mm512_mul_ps(_mm512_add_ps(load(0), high), _mm512_set1_ps(row_scale));
                    _mm512_storeu_ps(at.scores.add((p * NQ + h) * LANES), s);
                    let seen = rows_seeing(p, cache.first_len);
                    let max = _mm512_loadu_ps(at.max.add(h * LANES));
                    let max = _mm512_mask_max_ps(max, seen, max, s);
                    _mm512_storeu_ps(at.max.add(h * LANES), max);
                }
            }
        }
    }
}

/// Chain `j` of the scores of `P` positions (keys at `keys`, f32 `[P][head_dim]`): for
/// each position and head, the fused sum of `q[d] · k[d]` over `d = j, j + 8, …` in order.
///
/// # Safety
/// As [`scores`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
unsafe fn chain<const NQ: usize, const P: usize>(
    queries: *const f32,
    keys: *const f32,
    head_dim: usize,
    j: usize,
) -> [[__m512; NQ]; P] {
    let mut acc = [[_mm512_setzero_ps(); NQ]; P];
    let mut d = j;
    while d < head_dim {
        let q: [__m512; NQ] =
            std::array::from_fn(|h| _mm512_loadu_ps(queries.add((h * head_dim + d) * LANES)));
        for (i, acc_i) in acc.iter_mut().enumerate() {
            let k = _mm512_set1_ps(*keys.add(i * head_dim + d));
            for (a, q_h) in acc_i.iter_mut().zip(&q) {
                *a = _mm512_fmadd_ps(*q_h, k, *a);
            }
        }
        d += 8;
    }
    acc
}

/// The softmax weights and weighted sums of values, a chunk of positions at a time:
/// leaves `Σ_p exp(s_p - max) · v_p` in `at.sums` and returns each head's `1 / Σ_p exp(s_p
/// - max)` per row.
///
/// # Safety
/// As [`tile`], with the scores and maxima of [`score_all`] in `at`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
unsafe fn weigh_all<T: Widen, const NQ: usize>(
    cache: &Cache<'_, T>,
    at: &Regions,
    n_rows: usize,
) -> [[f32; LANES]; NQ] {
    let max: [__m512; NQ] = std::array::from_fn(|h| _mm512_loadu_ps(at.max.add(h * LANES)));
    let (head_dim, first_len) = (cache.head_dim, cache.first_len);
    let n_pos = cache.keys.len() / head_dim;
    let mut total = [_mm512_setzero_ps(); NQ];
    for c0 in (0..n_pos).step_by(CHUNK) {
        let c1 = (c0 + CHUNK).min(n_pos);
        // exp(s - max) in place, a value row's scale folded in; the sum stays unscaled and
        // takes the positions in order.
        for p in c0..c1 {
            let seen = rows_seeing(p, first_len);
            for (h, total_h) in total.iter_mut().enumerate() {
                let s = at.scores.add((p * NQ + h) * LANES);
                let e = exp512(_mm512_sub_ps(_mm512_loadu_ps(s), max[h]));
                *total_h = _mm512_mask_add_ps(*total_h, seen, *total_h, e);
                let weight = match cache.value_scales {
                    Some(vs) => _mm512_mul_ps(e, _mm512_set1_ps(*vs.get_unchecked(p))),
                    None => e,
                };
                _mm512_storeu_ps(s, weight);
            }
        }
        let values = cache.rows_f32(cache.values, c0..c1, at.values, false);
        for col0 in (0..head_dim).step_by(64) {
            // Up to four vectors of columns; `head_dim` is a multiple of 8, so the last
            // may be half a vector.
            let width = (head_dim - col0).min(64);
            let cols = Columns {
                first: col0,
                head_dim,
            };
            let span = c0..c1;
            // `G` (head, row) pairs at a time: `G · Z` sums in 24 registers.
            macro_rules! sums {
                ($g:literal, $z:literal, $half:literal) => {
                    weighted_sums::<NQ, $g, $z, $half>(at, values, cols, span, first_len, n_rows)
                };
            }
            match (width.div_ceil(16), width % 16 != 0) {
                (4, false) => sums!(6, 4, false),
                (4, true) => sums!(6, 4, true),
                (3, false) => sums!(8, 3, false),
                (3, true) => sums!(8, 3, true),
                (2, false) => sums!(12, 2, false),
                (2, true) => sums!(12, 2, true),
                (_, false) => sums!(24, 1, false),
                (_, true) => sums!(24, 1, true),
            }
        }
    }
    let mut inv = [[0.0f32; LANES]; NQ];
    for (inv_h, total_h) in inv.iter_mut().zip(&total) {
        _mm512_storeu_ps(
            inv_h.as_mut_ptr(),
            _mm512_div_ps(_mm512_set1_ps(1.0), *total_h),
        );
    }
    inv
}

/// Columns `first..` of the value rows that one [`weighted_sums`] takes.
#[derive(Clone, Copy)]
struct Columns {
    first: usize,
    head_dim: usize,
}

/// Vector `z` of `Z` at `at`: sixteen floats, or eight if it is the last and `HALF`.
///
/// # Safety
/// The CPU has AVX-512 F; the floats are readable.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn load_cols<const Z: usize, const HALF: bool>(at: *const f32, z: usize) -> __m512 {
    if HALF && z == Z - 1 {
        _mm512_maskz_loadu_ps(0x00FF, at.add(16 * z))
    } else {
        _mm512_loadu_ps(at.add(16 * z))
    }
}

/// The `Z` vectors of [`load_cols`] at `at`.
///
/// # Safety
/// As [`load_cols`].
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn load_row<const Z: usize, const HALF: bool>(at: *const f32) -> [__m512; Z] {
    // A loop, not `array::from_fn`: a closure does not inherit the target features, so
    // `load_cols` would not be inlined into it.
    let mut v = [_mm512_setzero_ps(); Z];
    for (z, v_z) in v.iter_mut().enumerate() {
        *v_z = load_cols::<Z, HALF>(at, z);
    }
    v
}

/// Stores [`load_cols`]'s floats.
///
/// # Safety
/// The CPU has AVX-512 F; the floats are writable.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn store_cols<const Z: usize, const HALF: bool>(at: *mut f32, z: usize, v: __m512) {
    if HALF && z == Z - 1 {
        _mm512_mask_storeu_ps(at.add(16 * z), 0x00FF, v)
    } else {
        _mm512_storeu_ps(at.add(16 * z), v)
    }
}

/// Adds positions `span`'s weighted values (f32 `[span.len()][head_dim]` at `values`) to
/// `Z` vectors of columns from `cols.first` (the last one half if `HALF`) of every row
/// and head's sums, in position order; a row takes only the positions it sees.
///
/// Here the columns are the lanes: a value row's vectors meet `G` broadcast weights, one
/// per (head, row) pair, so a step loads `Z + G` operands for `Z · G` products whatever the
/// group's size. A short last group repeats its last pair, which computes and stores the
/// same sums twice.
///
/// # Safety
/// As [`weigh_all`]; the columns are within `head_dim`, and the weights of `span` are in
/// `at.scores`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[inline]
unsafe fn weighted_sums<const NQ: usize, const G: usize, const Z: usize, const HALF: bool>(
    at: &Regions,
    values: *const f32,
    cols: Columns,
    span: std::ops::Range<usize>,
    first_len: usize,
    n_rows: usize,
) {
    let head_dim = cols.head_dim;
    let n_pairs = NQ * n_rows;
    // Positions before the block's first row are seen by every row.
    let seen_by_all = span.end.min(first_len).max(span.start);
    for g0 in (0..n_pairs).step_by(G) {
        let pairs: [(usize, usize); G] = std::array::from_fn(|g| {
            let k = (g0 + g).min(n_pairs - 1);
            (k / n_rows, k % n_rows)
        });
        let sums: [*mut f32; G] = std::array::from_fn(|g| {
            let (h, r) = pairs[g];
            at.sums.add((h * LANES + r) * head_dim + cols.first)
        });
        // Pair `g`'s weight of position `p` is at `(p · NQ) · LANES + offsets[g]`.
        let offsets: [usize; G] = std::array::from_fn(|g| pairs[g].0 * LANES + pairs[g].1);
        let mut acc = [[_mm512_setzero_ps(); Z]; G];
        if span.start > 0 {
            for (acc_g, sums_g) in acc.iter_mut().zip(&sums) {
                for (z, a) in acc_g.iter_mut().enumerate() {
                    *a = load_cols::<Z, HALF>(*sums_g, z);
                }
            }
        }
        let row = |p: usize| values.add((p - span.start) * head_dim + cols.first);
        for p in span.start..seen_by_all {
            let v = load_row::<Z, HALF>(row(p));
            let weights = at.scores.add(p * NQ * LANES);
            for (acc_g, offset) in acc.iter_mut().zip(&offsets) {
                let w = _mm512_set1_ps(*weights.add(*offset));
                for (a, v_z) in acc_g.iter_mut().zip(&v) {
                    *a = _mm512_fmadd_ps(w, *v_z, *a);
                }
            }
        }
        for p in seen_by_all..span.end {
            let v = load_row::<Z, HALF>(row(p));
            let weights = at.scores.add(p * NQ * LANES);
            for (g, acc_g) in acc.iter_mut().enumerate() {
                if p < first_len + pairs[g].1 {
                    let w = _mm512_set1_ps(*weights.add(offsets[g]));
                    for (a, v_z) in acc_g.iter_mut().zip(&v) {
                        *a = _mm512_fmadd_ps(w, *v_z, *a);
                    }
                }
            }
        }
        for (acc_g, sums_g) in acc.iter().zip(&sums) {
            for (z, a) in acc_g.iter().enumerate() {
                store_cols::<Z, HALF>(*sums_g, z, *a);
            }
        }
    }
}
