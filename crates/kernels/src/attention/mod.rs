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
//! logits equal plain decoding's, bit for bit. A block of 8 rows or more takes the tiles
//! of `tiled` instead (the rows in a vector's lanes, so both products are small matrix
//! products), with the same arithmetic per element and so the same bits.
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
pub use shared::{attend_rows_shared, can_share, meeting_len, worth_sharing, SHARE_MIN_BYTES};

/// Query heads one call takes at most: the lanes of one AVX2 register of scores.
pub const MAX_GROUP: usize = 8;

/// Query rows [`attend_rows`] takes at most: each block reads its KV head's cache once.
/// 16 rather than 8 made prefill 3-6 % faster on Sapphire Rapids (pp512, both models).
pub const MAX_ROWS: usize = 16;

/// Whether a block of `n_rows` rows of `n_q` heads takes the tiled kernel. Its lanes are
/// rows, so a short block leaves lanes idle, and the row kernel does better with more
/// heads to a group. Measured on Sapphire Rapids at depth 4,096 (`cargo bench -p
/// pyramid-kernels -- prefill_attention`, G multiply-adds/s, tiles against rows), AVX-512:
/// three heads, 8 rows: 33.6 against 30.8; seven heads, 8 rows: 33.5 against 39.4, 11
/// rows: 42.8 against 42.2. AVX2 (`PYRAMID_ISA=avx2`): three heads, 8 rows: 30.0 against
/// 23.0; seven heads, 8 rows: 22.7 against 22.9, 12 rows: 22.5 against 21.7.
fn takes_tiles(n_rows: usize, n_q: usize) -> bool {
    n_rows >= if n_q <= 4 { 8 } else { 11 }
}

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
    isa.assert_supported();
    let Some((n_rows, n_q)) = check_block(q, head_dim, kv, first_len, out) else {
        return;
    };
    let last_len = first_len + n_rows - 1;
    if n_q == 0 {
        return;
    }
    if last_len == 0 {
        // Only a single row can see no position: it attends to nothing.
        out.iter_mut().for_each(|o| o.fill(0.0));
        return;
    }
    let kv = kv.prefix(last_len, head_dim);
    // The vector kernels take whole eight-wide chunks of a row, every row seeing a position.
    let vector = head_dim.is_multiple_of(8) && first_len > 0;
    let tiles = vector && takes_tiles(n_rows, n_q);
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as below, and `Isa::detect` requires AVX-512 F, BW and VL for
        // `Isa::Avx512` and `Isa::Amx`; a block has at most `MAX_ROWS` rows.
        Isa::Amx | Isa::Avx512 if tiles => unsafe {
            tiled::avx512::attend_rows(q, head_dim, kv, first_len, scale, scratch, out)
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as below.
        Isa::Avx2 | Isa::AvxVnni if tiles => unsafe {
            tiled::avx2::attend_rows(q, head_dim, kv, first_len, scale, scratch, out)
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::detect` requires AVX2, FMA and F16C for `Isa::Avx2` and every
        // family above it; the shapes were checked above, and every row sees a position.
        Isa::Amx | Isa::Avx512 | Isa::AvxVnni | Isa::Avx2 if vector => unsafe {
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

/// Asserts the shapes every attention kernel takes: at most [`MAX_ROWS`] query rows of the
/// same `[n_q <= MAX_GROUP, head_dim]`, one output each, over whole cache rows holding the
/// last row's positions. Returns `(n_rows, n_q)`, or `None` for no rows.
pub(crate) fn check_block(
    q: &[&[f32]],
    head_dim: usize,
    kv: KvRows<'_>,
    first_len: usize,
    out: &[&mut [f32]],
) -> Option<(usize, usize)> {
    assert!(head_dim > 0, "head_dim must be positive");
    let n_rows = q.len();
    assert!(
        n_rows <= MAX_ROWS && out.len() == n_rows,
        "at most {MAX_ROWS} rows, one output per query row"
    );
    let first = q.first()?;
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
    Some((n_rows, n_q))
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

pub mod int8;
mod shared;
#[cfg(target_arch = "x86_64")]
mod tiled;
#[cfg(target_arch = "x86_64")]
mod x86;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::random;

    /// One KV head's random rows in every storage type.
    pub(super) struct Caches {
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
        pub(super) fn random(n_pos: usize, head_dim: usize, seed: u64) -> Self {
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

        pub(super) fn all(&self) -> [KvRows<'_>; 3] {
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
            // Blocks of 8 rows and more ([`takes_tiles`]) take the tiles: every
            // group size, whole, three, two, one and half vectors of value columns, key
            // and value chunks crossed and left over, and groups of (head, row) pairs
            // left short.
            (64, 3, 1, 16),
            (64, 7, 200, 16),
            (64, 1, 47, 16),
            (64, 2, 48, 9),
            (64, 4, 95, 12),
            (64, 5, 3, 15),
            (64, 6, 130, 11),
            (64, 8, 20, 16),
            (128, 2, 61, 10),
            (40, 3, 50, 13),
            (24, 7, 7, 12),
            (8, 5, 49, 14),
            (96, 1, 100, 16),
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
