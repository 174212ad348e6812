//! The scratch the vector forms share: which (row, head) pairs a tile's lanes hold, and
//! the regions of one buffer that hold the queries' codes, each pair's running state and
//! a block's keys, values, scores and weight codes.

use super::{interleaved_column, Cache, BLOCK, MAX_HEAD_DIM};
use crate::int8::quantize_row;

/// The layout the vector kernels share: (row, head) pairs in the order of their heads,
/// then their rows, dealt to tiles of `lanes`, and the regions of one scratch buffer.
pub(super) struct Plan {
    pub(super) head_dim: usize,
    pub(super) lanes: usize,
    pub(super) n_rows: usize,
    pub(super) n_pairs: usize,
    pub(super) n_tiles: usize,
}

impl Plan {
    pub(super) fn new(head_dim: usize, lanes: usize, n_rows: usize, n_q: usize) -> Self {
        let n_pairs = n_rows * n_q;
        Self {
            head_dim,
            lanes,
            n_rows,
            n_pairs,
            n_tiles: n_pairs.div_ceil(lanes),
        }
    }

    /// Row and head of pair `p`.
    fn pair(&self, p: usize) -> (usize, usize) {
        (p % self.n_rows, p / self.n_rows)
    }

    /// Word counts of the regions, in [`Regions`] order.
    fn sizes(&self) -> [usize; REGIONS] {
        let (hd, lanes, slots) = (self.head_dim, self.lanes, self.n_tiles * self.lanes);
        [
            slots * hd / 4, // queries: INT8 quads in their `Queries` layout
            slots,          // -128 · Σ query codes
            slots,          // query scales times the softmax scale
            slots,          // lengths
            slots,          // running maxima
            slots,          // running sums
            self.n_pairs * hd,
            BLOCK * hd / 2, // a last block's keys zero-padded, then a block's transposed
            BLOCK,          // its key scales
            BLOCK,          // its value scales
            BLOCK,          // -128 · Σ key codes per position
            BLOCK * hd / 4, // the block's values interleaved: [quad][column] quads
            BLOCK * lanes,  // a tile's scores, then weights
            BLOCK / 4 * lanes + 2 * lanes, // weight codes, rescale and step
        ]
    }
}

/// How many regions [`Regions`] has.
const REGIONS: usize = 14;

/// How a vector form wants the queries' INT8 codes.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Queries {
    /// `[tile][quad][lane]`, each byte offset by 128 when `offset`: pairs in the lanes.
    Tiles { offset: bool },
    /// `[pair][quad]`, signed, beside `-128 · Σ codes`: positions in the lanes.
    Rows,
}

/// Pointers to the disjoint regions of a scratch buffer laid out by [`Plan::sizes`].
pub(super) struct Regions {
    pub(super) queries: *mut u32,
    pub(super) query_starts: *mut i32,
    pub(super) query_scales: *mut f32,
    pub(super) lens: *mut i32,
    pub(super) maxima: *mut f32,
    pub(super) sums: *mut f32,
    pub(super) outputs: *mut f32,
    pub(super) keys: *mut u32,
    pub(super) key_scales: *mut f32,
    pub(super) value_scales: *mut f32,
    pub(super) key_starts: *mut i32,
    pub(super) values: *mut u32,
    pub(super) scores: *mut f32,
    pub(super) codes: *mut u32,
}

impl Regions {
    /// Sizes `scratch` for `plan` and fills the per-pair state: queries quantised (their
    /// bytes offset by 128 when `offset`), lengths, maxima at -inf, sums and outputs at 0.
    pub(super) fn prepare(
        plan: &Plan,
        q: &[&[f32]],
        first_len: usize,
        scale: f32,
        layout: Queries,
        scratch: &mut Vec<f32>,
    ) -> Self {
        let sizes = plan.sizes();
        scratch.clear();
        scratch.resize(sizes.iter().sum(), 0.0);
        let mut at = [0usize; REGIONS];
        for i in 1..REGIONS {
            at[i] = at[i - 1] + sizes[i - 1];
        }
        let base = scratch.as_mut_ptr();
        // SAFETY: every offset is within the buffer just sized to the sum of the sizes.
        let r = unsafe {
            Regions {
                queries: base.add(at[0]).cast(),
                query_starts: base.add(at[1]).cast(),
                query_scales: base.add(at[2]),
                lens: base.add(at[3]).cast(),
                maxima: base.add(at[4]),
                sums: base.add(at[5]),
                outputs: base.add(at[6]),
                keys: base.add(at[7]).cast(),
                key_scales: base.add(at[8]),
                value_scales: base.add(at[9]),
                key_starts: base.add(at[10]).cast(),
                values: base.add(at[11]).cast(),
                scores: base.add(at[12]),
                codes: base.add(at[13]).cast(),
            }
        };
        let (hd, lanes) = (plan.head_dim, plan.lanes);
        // On the stack: this runs for every block of rows of every layer.
        let mut query = [0i8; MAX_HEAD_DIM];
        let codes = &mut query[..hd];
        let flip = u8::from(layout == Queries::Tiles { offset: true }) << 7;
        for p in 0..plan.n_tiles * lanes {
            let (tile, lane) = (p / lanes, p % lanes);
            // SAFETY: `p` is within the tiles' slots, each region sized for them.
            unsafe {
                *r.maxima.add(p) = f32::NEG_INFINITY;
                if p >= plan.n_pairs {
                    continue;
                }
                let (row, head) = plan.pair(p);
                *r.lens.add(p) = (first_len + row) as i32;
                let q_scale = quantize_row(&q[row][head * hd..(head + 1) * hd], codes);
                *r.query_scales.add(p) = q_scale * scale;
                *r.query_starts.add(p) = -128 * codes.iter().map(|&c| c as i32).sum::<i32>();
                for (quad, c) in codes.chunks_exact(4).enumerate() {
                    let bytes = [c[0], c[1], c[2], c[3]].map(|b| (b as u8) ^ flip);
                    let at = match layout {
                        Queries::Tiles { .. } => (tile * hd / 4 + quad) * lanes + lane,
                        Queries::Rows => p * hd / 4 + quad,
                    };
                    *r.queries.add(at) = u32::from_le_bytes(bytes);
                }
            }
        }
        r
    }

    /// The keys of positions `b0..b0 + BLOCK`, and their scales: the cache itself for a
    /// whole block, a zero-padded copy for the last.
    ///
    /// # Safety
    /// The regions are live and sized for `head_dim`.
    pub(super) unsafe fn block_keys(
        &self,
        cache: Cache<'_>,
        b0: usize,
        head_dim: usize,
    ) -> (*const i8, *const f32, *const f32) {
        let n_pos = cache.key_scales.len();
        if b0 + BLOCK <= n_pos {
            return (
                cache.keys[b0 * head_dim..].as_ptr(),
                cache.key_scales[b0..].as_ptr(),
                cache.value_scales[b0..].as_ptr(),
            );
        }
        let n = n_pos - b0;
        let keys = std::slice::from_raw_parts_mut(self.keys.cast::<i8>(), BLOCK * head_dim);
        keys[..n * head_dim].copy_from_slice(&cache.keys[b0 * head_dim..]);
        keys[n * head_dim..].fill(0);
        let ks = std::slice::from_raw_parts_mut(self.key_scales, BLOCK);
        let vs = std::slice::from_raw_parts_mut(self.value_scales, BLOCK);
        ks[..n].copy_from_slice(&cache.key_scales[b0..]);
        vs[..n].copy_from_slice(&cache.value_scales[b0..]);
        ks[n..].fill(0.0);
        vs[n..].fill(0.0);
        (self.keys.cast(), self.key_scales, self.value_scales)
    }

    /// Writes each pair's output, `o / l`, to its place in `out`, in column order.
    ///
    /// # Safety
    /// The regions are live and hold every pair's final state.
    pub(super) unsafe fn finish(&self, plan: &Plan, first_len: usize, out: &mut [&mut [f32]]) {
        let hd = plan.head_dim;
        for p in 0..plan.n_pairs {
            let (row, head) = plan.pair(p);
            let dst = &mut out[row][head * hd..(head + 1) * hd];
            if first_len + row == 0 {
                dst.fill(0.0);
                continue;
            }
            let inv_sum = 1.0 / *self.sums.add(p);
            let o = std::slice::from_raw_parts(self.outputs.add(p * hd), hd);
            for (idx, &v) in o.iter().enumerate() {
                dst[interleaved_column(idx, plan.lanes)] = v * inv_sum;
            }
        }
    }
}

/// Rows `b0..b0 + BLOCK` of the values, zero rows past the cache: the four rows of quad
/// `quad` as pointers.
pub(super) fn value_quad<'a>(
    values: &'a [i8],
    head_dim: usize,
    b0: usize,
    quad: usize,
    zeros: &'a [i8],
) -> [&'a [i8]; 4] {
    std::array::from_fn(|i| {
        let p = b0 + 4 * quad + i;
        values
            .get(p * head_dim..(p + 1) * head_dim)
            .unwrap_or(zeros)
    })
}
