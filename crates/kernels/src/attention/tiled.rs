//! Prefill attention in tiles: a block's query rows in the lanes of a vector.
//!
//! The row kernel ([`super::x86`]) puts `head_dim` in the lanes: a score is eight chains
//! of products summed across the lanes of a register, and with three heads to a group
//! (SmolLM2) five of the softmax's eight lanes carry nothing. Here a block's rows are the
//! lanes, one vector per query head: sixteen rows to a tile on AVX-512, eight on AVX2 (a
//! block of sixteen rows is two tiles there). A key element, broadcast, meets every
//! row and head of the block at once; a score needs no lane sums; every lane of the
//! exponentials is a row's. The weighted sums turn the other way, a value row's columns in
//! the lanes meeting one broadcast weight per (head, row) pair, which keeps their loads
//! below their products for any group size. Both sides of the softmax are small matrix
//! products, which is what makes attention at depth cost its multiply-adds rather than its
//! shuffles.
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
//!
//! One body serves both widths (`tile_kernel!`): each width's module names its vector
//! type, its primitives and its register budgets, and the body is expanded there under
//! that width's target features, so every primitive inlines.

/// Positions widened, scored and weighed together: a multiple of every count of positions
/// a score step takes at once (1, 2, 3, 4, 6, 8, 12, 24).
const CHUNK: usize = 48;

/// Score tree slots per position and head: the partial sums `l0 + l1`, `l2 + l3` (then
/// `l4 + l5`) and `l6` waiting for the chains after them.
const TREE_SLOTS: usize = 3;

/// One KV head's rows in their storage type, and where the tile's rows start.
struct Cache<'a, T> {
    keys: &'a [T],
    key_scales: Option<&'a [f32]>,
    values: &'a [T],
    value_scales: Option<&'a [f32]>,
    head_dim: usize,
    first_len: usize,
}

impl<'a, T> Cache<'a, T> {
    fn new(
        keys: &'a [T],
        key_scales: Option<&'a [f32]>,
        values: &'a [T],
        value_scales: Option<&'a [f32]>,
        head_dim: usize,
        first_len: usize,
    ) -> Self {
        Self {
            keys,
            key_scales,
            values,
            value_scales,
            head_dim,
            first_len,
        }
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
    /// A chunk of keys widened to f32 (from an f16 or INT8 cache) and one of values widened
    /// or copied (aligned for vector loads), `[CHUNK][head_dim]` each.
    keys: *mut f32,
    values: *mut f32,
    /// Each row's weighted sums so far, `[NQ][LANES][head_dim]`.
    sums: *mut f32,
    /// Each head's running maximum score per row, `[NQ][LANES]`: in memory rather than
    /// registers, which the products need.
    max: *mut f32,
}

/// Columns `first..` of the value rows that one `weighted_sums` takes.
#[derive(Clone, Copy)]
struct Columns {
    first: usize,
    head_dim: usize,
}

/// Runs `$then` with `$cache` bound to the [`Cache`] over `$kv`'s storage type (a
/// `KvRows` already cut to the tile's last row).
macro_rules! over_cache {
    ($kv:expr, $head_dim:expr, $first_len:expr, |$cache:ident| $then:expr) => {
        match $kv {
            KvRows::F32 { keys, values } => {
                let $cache = Cache::new(keys, None, values, None, $head_dim, $first_len);
                $then
            }
            KvRows::F16 { keys, values } => {
                let $cache = Cache::new(keys, None, values, None, $head_dim, $first_len);
                $then
            }
            KvRows::Int8 {
                keys,
                key_scales,
                values,
                value_scales,
            } => {
                let (ks, vs) = (Some(key_scales), Some(value_scales));
                let $cache = Cache::new(keys, ks, values, vs, $head_dim, $first_len);
                $then
            }
        }
    };
}

/// The tile kernel for one vector width, expanded inside that width's module, which
/// defines `V` (the vector), `Seen` (a lane mask), `LANES`, `MAX_SUMS` (sums a score step
/// keeps in registers), `POSITIONS` (positions a score step takes per group size),
/// `BLOCK_COLS` (value columns a weighted-sum step takes), the
/// primitives (`zero`, `load`, `store`, `splat`, `fmadd`, `add`, `sub`, `mul`, `div`,
/// `exp`, `rows_seeing`, `masked_max`, `masked_add`, `load_cols`, `store_cols`, `widen`)
/// and `weigh_columns!`, which picks the weighted-sum shape for a block of columns.
macro_rules! tile_kernel {
    ($features:literal) => {
        /// The tiled [`super::super::attend_rows`]: the block's rows a tile of [`LANES`]
        /// at a time.
        ///
        /// # Safety
        /// The CPU has the module's features; `head_dim` is a multiple of 8; the shapes
        /// are as [`super::super::attend_rows_with`] checks, with at least one query head,
        /// `first_len >= 1` and `kv` holding exactly the last row's positions.
        #[target_feature(enable = $features)]
        pub(in crate::attention) unsafe fn attend_rows(
            q: &[&[f32]],
            head_dim: usize,
            kv: KvRows<'_>,
            first_len: usize,
            scale: f32,
            scratch: &mut Vec<f32>,
            out: &mut [&mut [f32]],
        ) {
            for (t, (q, out)) in q.chunks(LANES).zip(out.chunks_mut(LANES)).enumerate() {
                let first_len = first_len + t * LANES;
                let kv = kv.prefix(first_len + q.len() - 1, head_dim);
                over_cache!(kv, head_dim, first_len, |cache| {
                    by_heads(q, &cache, scale, scratch, out)
                });
            }
        }

        /// [`tile`] for the block's number of query heads, with the positions per score
        /// step the module's register budget allows (`POSITIONS`).
        ///
        /// # Safety
        /// As [`tile`].
        #[target_feature(enable = $features)]
        #[inline]
        unsafe fn by_heads<T: Widen>(
            q: &[&[f32]],
            cache: &Cache<'_, T>,
            scale: f32,
            scratch: &mut Vec<f32>,
            out: &mut [&mut [f32]],
        ) {
            match q[0].len() / cache.head_dim {
                1 => tile::<_, 1, { POSITIONS[0] }>(q, cache, scale, scratch, out),
                2 => tile::<_, 2, { POSITIONS[1] }>(q, cache, scale, scratch, out),
                3 => tile::<_, 3, { POSITIONS[2] }>(q, cache, scale, scratch, out),
                4 => tile::<_, 4, { POSITIONS[3] }>(q, cache, scale, scratch, out),
                5 => tile::<_, 5, { POSITIONS[4] }>(q, cache, scale, scratch, out),
                6 => tile::<_, 6, { POSITIONS[5] }>(q, cache, scale, scratch, out),
                7 => tile::<_, 7, { POSITIONS[6] }>(q, cache, scale, scratch, out),
                8 => tile::<_, 8, { POSITIONS[7] }>(q, cache, scale, scratch, out),
                n_q => unreachable!("{n_q} query heads: the caller checks 1..={MAX_GROUP}"),
            }
        }

        /// A tile of rows against one KV head: the scores of every position and their
        /// softmax, each lane a row, then the weighted sums of values.
        ///
        /// # Safety
        /// As [`attend_rows`], with at most [`LANES`] rows of `NQ` query heads and `P · NQ
        /// <= MAX_SUMS`.
        #[target_feature(enable = $features)]
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
            // Every region is written before it is read, so old contents need no
            // clearing. Each starts on a multiple of the vector's width (every size is a
            // multiple of 8 floats) from a cache line: a vector load that straddles two
            // lines costs two.
            let total: usize = sizes.iter().sum::<usize>() + 16;
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

        /// Positions `span` of `rows` as f32 `[span.len(), head_dim]`: the cache itself
        /// if it is f32 and `in_place`, else widened (or copied) into `buf`, which starts
        /// on a cache line, so that vector loads of its rows do not straddle two.
        ///
        /// # Safety
        /// The CPU has the module's features; the positions are in `rows` and `buf`
        /// holds `CHUNK · head_dim` floats.
        #[target_feature(enable = $features)]
        #[inline]
        unsafe fn rows_f32<T: Widen>(
            rows: &[T],
            head_dim: usize,
            span: std::ops::Range<usize>,
            buf: *mut f32,
            in_place: bool,
        ) -> *const f32 {
            let span = &rows[span.start * head_dim..span.end * head_dim];
            if let Some(f32_rows) = T::as_f32(span).filter(|_| in_place) {
                return f32_rows.as_ptr();
            }
            widen(span, buf);
            buf
        }

        /// Every position's scores, `scale · q · k` times the key row's scale if any,
        /// stored in `at.scores`, and each head's maximum over the positions each row
        /// sees in `at.max`.
        ///
        /// # Safety
        /// As [`tile`], with `at` laid out for it.
        #[target_feature(enable = $features)]
        #[inline]
        unsafe fn score_all<T: Widen, const NQ: usize, const P: usize>(
            cache: &Cache<'_, T>,
            at: &Regions,
            scale: f32,
        ) {
            let n_pos = cache.keys.len() / cache.head_dim;
            for h in 0..NQ {
                store(at.max.add(h * LANES), splat(f32::NEG_INFINITY));
            }
            for c0 in (0..n_pos).step_by(CHUNK) {
                let c1 = (c0 + CHUNK).min(n_pos);
                // Keys are read one element at a time, so alignment does not matter.
                let keys = rows_f32(cache.keys, cache.head_dim, c0..c1, at.keys, true);
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

        /// The scores of positions `p0..p0 + P` (keys at `keys`, f32 `[P][head_dim]`),
        /// folded into `at.max` where a row sees them.
        ///
        /// The eight chains of a score are taken one after the other, each for all `P ·
        /// NQ` scores at once, and joined in the row kernel's tree through `at.tree`: a
        /// chain of `head_dim / 8` products per score in registers, where all eight
        /// chains at once would leave room for an eighth of the scores.
        ///
        /// # Safety
        /// As [`score_all`]; the positions are in the cache.
        #[target_feature(enable = $features)]
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

        /// Chain `J` of [`scores`], added into the tree `((l0 + l1) + (l2 + l3)) + ((l4 +
        /// l5) + (l6 + l7))`; the last chain completes the scores, stores them and folds
        /// them into `at.max`. `J` is a constant, so each step is straight-line code. Not
        /// inlined: in a function of its own the chain's sums keep to registers (inlined
        /// eight times into one body, they were spilled and shuffled).
        ///
        /// # Safety
        /// As [`scores`].
        #[target_feature(enable = $features)]
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
                    match J {
                        // l0, l0 + l1; l2, (l0 + l1) + (l2 + l3); l4, l4 + l5; l6.
                        0 => store(slot(0), l),
                        1 => store(slot(0), add(load(slot(0)), l)),
                        2 | 4 => store(slot(1), l),
                        3 => store(slot(0), add(load(slot(0)), add(load(slot(1)), l))),
                        5 => store(slot(1), add(load(slot(1)), l)),
                        6 => store(slot(2), l),
                        _ => {
                            // (l4 + l5) + (l6 + l7), then the whole tree.
                            let high = add(load(slot(1)), add(load(slot(2)), l));
                            let p = p0 + i;
                            let row_scale = cache
                                .key_scales
                                .map_or(scale, |s| scale * *s.get_unchecked(p));
                            let s = mul(add(load(slot(0)), high), splat(row_scale));
                            store(at.scores.add((p * NQ + h) * LANES), s);
                            let seen = rows_seeing(p, cache.first_len);
                            let max = at.max.add(h * LANES);
                            store(max, masked_max(load(max), seen, s));
                        }
                    }
                }
            }
        }

        /// Chain `j` of the scores of `P` positions (keys at `keys`, f32 `[P][head_dim]`):
        /// for each position and head, the fused sum of `q[d] · k[d]` over `d = j, j + 8,
        /// …` in order.
        ///
        /// # Safety
        /// As [`scores`].
        #[target_feature(enable = $features)]
        #[inline]
        unsafe fn chain<const NQ: usize, const P: usize>(
            queries: *const f32,
            keys: *const f32,
            head_dim: usize,
            j: usize,
        ) -> [[V; NQ]; P] {
            let mut acc = [[zero(); NQ]; P];
            let mut d = j;
            while d < head_dim {
                let mut q = [zero(); NQ];
                for (h, q_h) in q.iter_mut().enumerate() {
                    *q_h = load(queries.add((h * head_dim + d) * LANES));
                }
                for (i, acc_i) in acc.iter_mut().enumerate() {
                    let k = splat(*keys.add(i * head_dim + d));
                    for (a, q_h) in acc_i.iter_mut().zip(&q) {
                        *a = fmadd(*q_h, k, *a);
                    }
                }
                d += 8;
            }
            acc
        }

        /// The softmax weights and weighted sums of values, a chunk of positions at a
        /// time: leaves `Σ_p exp(s_p - max) · v_p` in `at.sums` and returns each head's `1
        /// / Σ_p exp(s_p - max)` per row.
        ///
        /// # Safety
        /// As [`tile`], with the scores and maxima of [`score_all`] in `at`.
        #[target_feature(enable = $features)]
        #[inline]
        unsafe fn weigh_all<T: Widen, const NQ: usize>(
            cache: &Cache<'_, T>,
            at: &Regions,
            n_rows: usize,
        ) -> [[f32; LANES]; NQ] {
            let mut max = [zero(); NQ];
            for (h, max_h) in max.iter_mut().enumerate() {
                *max_h = load(at.max.add(h * LANES));
            }
            let (head_dim, first_len) = (cache.head_dim, cache.first_len);
            let n_pos = cache.keys.len() / head_dim;
            let mut total = [zero(); NQ];
            for c0 in (0..n_pos).step_by(CHUNK) {
                let c1 = (c0 + CHUNK).min(n_pos);
                // exp(s - max) in place, a value row's scale folded in; the sum stays
                // unscaled and takes the positions in order.
                for p in c0..c1 {
                    let seen = rows_seeing(p, first_len);
                    for (h, total_h) in total.iter_mut().enumerate() {
                        let s = at.scores.add((p * NQ + h) * LANES);
                        let e = exp(sub(load(s), max[h]));
                        *total_h = masked_add(*total_h, seen, e);
                        let weight = match cache.value_scales {
                            Some(vs) => mul(e, splat(*vs.get_unchecked(p))),
                            None => e,
                        };
                        store(s, weight);
                    }
                }
                let values = rows_f32(cache.values, head_dim, c0..c1, at.values, false);
                for col0 in (0..head_dim).step_by(BLOCK_COLS) {
                    let width = (head_dim - col0).min(BLOCK_COLS);
                    let cols = Columns {
                        first: col0,
                        head_dim,
                    };
                    weigh_columns!(width, at, values, cols, c0..c1, first_len, n_rows);
                }
            }
            let mut inv = [[0.0f32; LANES]; NQ];
            for (inv_h, total_h) in inv.iter_mut().zip(&total) {
                store(inv_h.as_mut_ptr(), div(splat(1.0), *total_h));
            }
            inv
        }

        /// The `Z` vectors of [`load_cols`] at `at`.
        ///
        /// # Safety
        /// As [`load_cols`].
        #[target_feature(enable = $features)]
        #[inline]
        unsafe fn load_row<const Z: usize, const HALF: bool>(at: *const f32) -> [V; Z] {
            // A loop, not `array::from_fn`: a closure does not inherit the target
            // features, so `load_cols` would not be inlined into it.
            let mut v = [zero(); Z];
            for (z, v_z) in v.iter_mut().enumerate() {
                *v_z = load_cols::<Z, HALF>(at, z);
            }
            v
        }

        /// Adds positions `span`'s weighted values (f32 `[span.len()][head_dim]` at
        /// `values`) to `Z` vectors of columns from `cols.first` (the last one half if
        /// `HALF`) of every row and head's sums, in position order; a row takes only the
        /// positions it sees.
        ///
        /// Here the columns are the lanes: a value row's vectors meet `G` broadcast
        /// weights, one per (head, row) pair, so a step loads `Z + G` operands for `Z · G`
        /// products whatever the group's size. A short last group repeats its last pair,
        /// which computes and stores the same sums twice.
        ///
        /// # Safety
        /// As [`weigh_all`]; the columns are within `head_dim`, and the weights of `span`
        /// are in `at.scores`.
        #[target_feature(enable = $features)]
        #[inline]
        unsafe fn weighted_sums<
            const NQ: usize,
            const G: usize,
            const Z: usize,
            const HALF: bool,
        >(
            at: &Regions,
            values: *const f32,
            cols: Columns,
            span: std::ops::Range<usize>,
            first_len: usize,
            n_rows: usize,
        ) {
            let head_dim = cols.head_dim;
            let n_pairs = NQ * n_rows;
            // Positions before the tile's first row are seen by every row.
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
                let mut acc = [[zero(); Z]; G];
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
                        let w = splat(*weights.add(*offset));
                        for (a, v_z) in acc_g.iter_mut().zip(&v) {
                            *a = fmadd(w, *v_z, *a);
                        }
                    }
                }
                for p in seen_by_all..span.end {
                    let v = load_row::<Z, HALF>(row(p));
                    let weights = at.scores.add(p * NQ * LANES);
                    for (g, acc_g) in acc.iter_mut().enumerate() {
                        if p < first_len + pairs[g].1 {
                            let w = splat(*weights.add(offsets[g]));
                            for (a, v_z) in acc_g.iter_mut().zip(&v) {
                                *a = fmadd(w, *v_z, *a);
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
    };
}

/// Sixteen rows to a tile, 32 registers.
pub(super) mod avx512 {
    use std::arch::x86_64::*;

    use super::{Cache, Columns, Regions, CHUNK, TREE_SLOTS};
    use crate::attention::x86::Widen;
    use crate::attention::{KvRows, MAX_GROUP, MAX_ROWS};

    type V = __m512;
    type Seen = __mmask16;
    pub(in crate::attention) const LANES: usize = 16;
    const _: () = assert!(MAX_ROWS <= LANES, "a block's rows fit one tile");
    const MAX_SUMS: usize = 24;
    const BLOCK_COLS: usize = 64;

    /// Positions per score step for 1 to 8 query heads: as many sums as fit in 32
    /// registers beside their operands.
    const POSITIONS: [usize; MAX_GROUP] = [24, 12, 8, 6, 4, 3, 2, 2];

    /// Up to four vectors of columns, `G` (head, row) pairs at a time: `G · Z` sums in 24
    /// registers. `head_dim` is a multiple of 8, so the last vector may be half.
    macro_rules! weigh_columns {
        ($width:expr, $($args:expr),*) => {
            match ($width.div_ceil(16), !$width.is_multiple_of(16)) {
                (4, false) => weighted_sums::<NQ, 6, 4, false>($($args),*),
                (4, true) => weighted_sums::<NQ, 6, 4, true>($($args),*),
                (3, false) => weighted_sums::<NQ, 8, 3, false>($($args),*),
                (3, true) => weighted_sums::<NQ, 8, 3, true>($($args),*),
                (2, false) => weighted_sums::<NQ, 12, 2, false>($($args),*),
                (2, true) => weighted_sums::<NQ, 12, 2, true>($($args),*),
                (_, false) => weighted_sums::<NQ, 24, 1, false>($($args),*),
                (_, true) => weighted_sums::<NQ, 24, 1, true>($($args),*),
            }
        };
    }

    tile_kernel!("avx512f,avx512bw,avx512vl,avx2,fma,f16c");

    // The primitives: AVX-512 intrinsics under the names the body uses.
    use crate::ops::exp_avx512 as exp;
    use std::arch::x86_64::_mm512_add_ps as add;
    use std::arch::x86_64::_mm512_div_ps as div;
    use std::arch::x86_64::_mm512_fmadd_ps as fmadd;
    use std::arch::x86_64::_mm512_loadu_ps as load;
    use std::arch::x86_64::_mm512_mul_ps as mul;
    use std::arch::x86_64::_mm512_set1_ps as splat;
    use std::arch::x86_64::_mm512_setzero_ps as zero;
    use std::arch::x86_64::_mm512_storeu_ps as store;
    use std::arch::x86_64::_mm512_sub_ps as sub;

    /// The lanes (rows) whose causal window holds position `p`: rows from `p + 1 -
    /// first_len` on, every row before the first new position.
    fn rows_seeing(p: usize, first_len: usize) -> Seen {
        let hidden = (p + 1).saturating_sub(first_len) as u32;
        (u32::from(u16::MAX) << hidden.min(LANES as u32)) as Seen
    }

    /// `max(max, s)` in the lanes of `seen`, `max` elsewhere.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn masked_max(max: V, seen: Seen, s: V) -> V {
        _mm512_mask_max_ps(max, seen, max, s)
    }

    /// `total + e` in the lanes of `seen`, `total` elsewhere.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn masked_add(total: V, seen: Seen, e: V) -> V {
        _mm512_mask_add_ps(total, seen, total, e)
    }

    /// Vector `z` of `Z` at `at`: sixteen floats, or eight if it is the last and `HALF`.
    ///
    /// # Safety
    /// The CPU has AVX-512 F; the floats are readable.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn load_cols<const Z: usize, const HALF: bool>(at: *const f32, z: usize) -> V {
        if HALF && z == Z - 1 {
            _mm512_maskz_loadu_ps(0x00FF, at.add(16 * z))
        } else {
            _mm512_loadu_ps(at.add(16 * z))
        }
    }

    /// Stores [`load_cols`]'s floats.
    ///
    /// # Safety
    /// The CPU has AVX-512 F; the floats are writable.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn store_cols<const Z: usize, const HALF: bool>(at: *mut f32, z: usize, v: V) {
        if HALF && z == Z - 1 {
            _mm512_mask_storeu_ps(at.add(16 * z), 0x00FF, v)
        } else {
            _mm512_storeu_ps(at.add(16 * z), v)
        }
    }

    /// `rows` widened to f32 at `buf`.
    ///
    /// # Safety
    /// The CPU has AVX-512 F and BW, AVX2 and F16C; `buf` holds `rows.len()` floats, a
    /// multiple of 8.
    #[target_feature(enable = "avx512f,avx512bw,avx2,f16c")]
    #[inline]
    unsafe fn widen<T: Widen>(rows: &[T], buf: *mut f32) {
        let (src, n) = (rows.as_ptr(), rows.len());
        let mut i = 0;
        while i + 16 <= n {
            _mm512_storeu_ps(buf.add(i), T::load16(src.add(i)));
            i += 16;
        }
        if i < n {
            _mm256_storeu_ps(buf.add(i), T::load8(src.add(i)));
        }
    }
}

/// Eight rows to a tile (a block of sixteen is two tiles), 16 registers.
pub(super) mod avx2 {
    use std::arch::x86_64::*;

    use super::{Cache, Columns, Regions, CHUNK, TREE_SLOTS};
    use crate::attention::x86::Widen;
    use crate::attention::{KvRows, MAX_GROUP};

    type V = __m256;
    /// A lane mask as a vector: all ones in the lanes it holds.
    type Seen = __m256;
    pub(in crate::attention) const LANES: usize = 8;
    const MAX_SUMS: usize = 9;
    const BLOCK_COLS: usize = 16;

    /// Positions per score step for 1 to 8 query heads: as many sums as fit in 16
    /// registers beside their operands.
    const POSITIONS: [usize; MAX_GROUP] = [8, 4, 3, 2, 1, 1, 1, 1];

    /// Two vectors of columns, five (head, row) pairs at a time (ten sums); one vector,
    /// ten pairs. `head_dim` is a multiple of 8, so no vector is ever half.
    macro_rules! weigh_columns {
        ($width:expr, $($args:expr),*) => {
            if $width == 16 {
                weighted_sums::<NQ, 5, 2, false>($($args),*)
            } else {
                weighted_sums::<NQ, 10, 1, false>($($args),*)
            }
        };
    }

    tile_kernel!("avx2,fma,f16c");

    // The primitives: AVX2 intrinsics under the names the body uses.
    use crate::ops::exp_avx2 as exp;
    use std::arch::x86_64::_mm256_add_ps as add;
    use std::arch::x86_64::_mm256_div_ps as div;
    use std::arch::x86_64::_mm256_fmadd_ps as fmadd;
    use std::arch::x86_64::_mm256_loadu_ps as load;
    use std::arch::x86_64::_mm256_mul_ps as mul;
    use std::arch::x86_64::_mm256_set1_ps as splat;
    use std::arch::x86_64::_mm256_setzero_ps as zero;
    use std::arch::x86_64::_mm256_storeu_ps as store;
    use std::arch::x86_64::_mm256_sub_ps as sub;

    /// The lanes (rows) whose causal window holds position `p`: rows from `p + 1 -
    /// first_len` on, every row before the first new position.
    ///
    /// # Safety
    /// The CPU has AVX2.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn rows_seeing(p: usize, first_len: usize) -> Seen {
        let hidden = (p + 1).saturating_sub(first_len).min(LANES) as i32;
        let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        _mm256_castsi256_ps(_mm256_cmpgt_epi32(lanes, _mm256_set1_epi32(hidden - 1)))
    }

    /// `max(max, s)` in the lanes of `seen`, `max` elsewhere.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn masked_max(max: V, seen: Seen, s: V) -> V {
        _mm256_blendv_ps(max, _mm256_max_ps(max, s), seen)
    }

    /// `total + e` in the lanes of `seen`, `total` elsewhere.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn masked_add(total: V, seen: Seen, e: V) -> V {
        _mm256_blendv_ps(total, _mm256_add_ps(total, e), seen)
    }

    /// Vector `z` of `Z` at `at`: eight floats (`HALF` never holds on this width).
    ///
    /// # Safety
    /// The CPU has AVX; the floats are readable.
    #[target_feature(enable = "avx")]
    #[inline]
    unsafe fn load_cols<const Z: usize, const HALF: bool>(at: *const f32, z: usize) -> V {
        const { assert!(!HALF) };
        _mm256_loadu_ps(at.add(8 * z))
    }

    /// Stores [`load_cols`]'s floats.
    ///
    /// # Safety
    /// The CPU has AVX; the floats are writable.
    #[target_feature(enable = "avx")]
    #[inline]
    unsafe fn store_cols<const Z: usize, const HALF: bool>(at: *mut f32, z: usize, v: V) {
        const { assert!(!HALF) };
        _mm256_storeu_ps(at.add(8 * z), v)
    }

    /// `rows` widened to f32 at `buf`.
    ///
    /// # Safety
    /// The CPU has AVX2 and F16C; `buf` holds `rows.len()` floats, a multiple of 8.
    #[target_feature(enable = "avx2,f16c")]
    #[inline]
    unsafe fn widen<T: Widen>(rows: &[T], buf: *mut f32) {
        let (src, n) = (rows.as_ptr(), rows.len());
        let mut i = 0;
        while i < n {
            _mm256_storeu_ps(buf.add(i), T::load8(src.add(i)));
            i += 8;
        }
    }
}
