//! W4A8 matrix multiplication for decode, where reading weights is the bound: 4-bit
//! weights in groups of [`GROUP`] along `k`, each group with its own scale and minimum
//! (`w ≈ q · scale + min`, `q` in 0..=15, both in f16 as in GGUF's Q4_1), times INT8
//! activations quantised per token and block of 32
//! ([`QuantizedRows`](crate::int8::QuantizedRows)).
//!
//! Scale-and-minimum groups of 32 are what GGUF's Q4_1 and Q4_K blocks are, so a model
//! shipped in those re-packs almost losslessly; a symmetric 4-bit format would round them
//! a second time. The minimum costs one extra term per group: `Σ a·w = scale·Σ a·q +
//! min·Σ a`, where `Σ a` comes once per token with the activations
//! ([`QuantizedRows::block_sums`](crate::int8::QuantizedRows::block_sums)).
//!
//! The layout follows the INT8 kernel's, so a tile works on sixteen output rows at once
//! and one broadcast activation serves all of them (no horizontal sum per output): weights
//! are `[n / 16][k / 4][32 bytes]`, where byte `4·r + j` of a group holds `k` element `j`
//! of row `r` in its low nibble and of row `r + 8` in its high nibble. A mask gives rows
//! 0–7 and a shift rows 8–15, each exactly the 8 × 4 bytes `vpmaddubsw` pairs with four
//! broadcast activations; unsigned nibbles times signed activations cannot saturate, so
//! no sign trick is needed. At 0.625 bytes per weight (against INT8's 1.0625) decode
//! reads 40 % fewer bytes. Integer sums are exact per group and every variant scales
//! them in the same order, so all agree with the scalar oracle bit for bit.

mod reference;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;

use std::ops::Range;

use half::f16;
use rayon::prelude::*;

use crate::int8::{
    check_operands, column_blocks, scale_index, QuantizedView, K_PER_GROUP, ROWS_PER_BLOCK,
};
use crate::isa::{self, Isa};
use crate::scales::Scales;
use crate::threadpool::{SharedSlice, ThreadPool};
use crate::COLUMN_ALIGN;

/// Weights per scale and minimum.
pub const GROUP: usize = crate::int8::BLOCK_K;
/// Activation rows from which [`Isa::Amx`] multiplies on tiles, each chunk of weights
/// unpacked to bytes once for all the rows' 32-row passes. With one pass the unpacking
/// costs what the tiles save: on a chain of SmolLM2's and Qwen2.5-0.5B's products
/// (2 threads, Sapphire Rapids) the tiles and VNNI tied at 32 rows, and the tiles led by
/// 10 % at 48, 14–17 % at 64 and 37 % at 512.
const AMX_MIN_ROWS: usize = 33;
/// Bytes of one packed group: sixteen rows × four `k`, two nibbles per byte.
pub(crate) const GROUP_BYTES: usize = ROWS_PER_BLOCK * K_PER_GROUP / 2;

/// 4-bit weights `[n, k]` with one scale and minimum per row and group of 32 along `k`.
#[derive(Debug, Clone)]
pub struct PackedI4 {
    pub n: usize,
    pub k: usize,
    /// `k` rounded up to whole groups; the padding is zero.
    pub k_pad: usize,
    /// `[n_pad / 16][k_pad / 4][32]`, see the module documentation.
    pub data: Vec<u8>,
    /// `w ≈ nibble · scale + min`, per row and group of 32: f16 each as in Q4_1, or
    /// Q4_K's 6-bit factors times its per-256 `d` (and `-dmin`).
    pub scales: Scales,
    /// Same form and layout as `scales`.
    pub mins: Scales,
}

/// Byte of `w[row][kk]` in the packed layout, and whether it is the high nibble.
#[inline]
fn nibble_position(row: usize, kk: usize, k_pad: usize) -> (usize, bool) {
    let (block, r) = (row / ROWS_PER_BLOCK, row % ROWS_PER_BLOCK);
    let group = block * (k_pad / K_PER_GROUP) + kk / K_PER_GROUP;
    let half = ROWS_PER_BLOCK / 2;
    (
        group * GROUP_BYTES + (r % half) * K_PER_GROUP + kk % K_PER_GROUP,
        r >= half,
    )
}

/// Row block `block`'s sixteen rows, `k_pad` bytes each, as `row_codes(row, out)` decodes
/// them (`out` is the row's first `k`), each code checked to fit in `bits`: the padding
/// rows past `n` and columns past `k` are 0. The INT4 and INT6 packers lay a block out
/// from these.
pub(crate) fn block_rows(
    block: usize,
    (n, k, k_pad): (usize, usize, usize),
    bits: u32,
    row_codes: &impl Fn(usize, &mut [u8]),
) -> Vec<u8> {
    let first = block * ROWS_PER_BLOCK;
    let mut rows = vec![0u8; ROWS_PER_BLOCK * k_pad];
    for (r, row) in rows.chunks_exact_mut(k_pad).enumerate() {
        if first + r < n {
            row_codes(first + r, &mut row[..k]);
        }
    }
    // An OR over the block, which vectorises where `all` would stop early.
    let all_bits = rows.iter().fold(0, |m, &c| m | c);
    assert!(u32::from(all_bits) < 1 << bits, "codes hold {bits} bits");
    rows
}

/// Lays out a block's rows ([`block_rows`]) as INT4's nibbles in `out`: row `r`'s low
/// four bits and row `r + 8`'s in one byte per `k`, a group's four bytes at a time (see
/// `nibble_position`). `combined` is `k_pad` bytes of scratch.
pub(crate) fn lay_out_nibbles(rows: &[u8], combined: &mut [u8], out: &mut [u8]) {
    let k_pad = combined.len();
    let row = |r: usize| &rows[r * k_pad..][..k_pad];
    for r in 0..ROWS_PER_BLOCK / 2 {
        for ((b, &lo), &hi) in combined.iter_mut().zip(row(r)).zip(row(r + 8)) {
            *b = (lo & 0x0f) | (hi & 0x0f) << 4;
        }
        lay_out_quads(combined, out, GROUP_BYTES, r);
    }
}

/// Copies each group's four bytes of `combined` (one per `k`) into slot `slot` of that
/// group's `group_bytes` in `out`: how a block's rows, combined a byte per `k`, are laid
/// out in the INT4 and INT6 layouts.
pub(crate) fn lay_out_quads(combined: &[u8], out: &mut [u8], group_bytes: usize, slot: usize) {
    let groups = out.chunks_exact_mut(group_bytes);
    for (quad, group) in combined.chunks_exact(K_PER_GROUP).zip(groups) {
        group[slot * K_PER_GROUP..][..K_PER_GROUP].copy_from_slice(quad);
    }
}

/// Row `w`'s group (at most [`GROUP`] values) cut into 15 steps from its minimum: its
/// nibbles into `nibbles` (padding left 0, whose activations are zero), its f16 scale and
/// minimum returned.
fn quantize_group(values: &[f32], nibbles: &mut [u8; GROUP]) -> (f16, f16) {
    let min = values.iter().copied().fold(f32::INFINITY, f32::min);
    let max = values.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let (min, scale) = if min.is_finite() && max > min {
        (f16::from_f32(min), f16::from_f32((max - min) / 15.0))
    } else {
        (
            f16::from_f32(if min.is_finite() { min } else { 0.0 }),
            f16::ZERO,
        )
    };
    let (min_f, scale_f) = (min.to_f32(), scale.to_f32());
    let inv = if scale_f == 0.0 { 0.0 } else { 1.0 / scale_f };
    for (nibble, &v) in nibbles.iter_mut().zip(values) {
        *nibble = round_to_nibble((v - min_f) * inv);
    }
    (scale, min)
}

/// `x.round().clamp(0.0, 15.0) as u8` (NaN gives 0) without `f32::round`, a libm call on
/// baseline x86-64 that was most of packing a model at load: within `0..=15` the
/// fraction `x - trunc(x)` is exact, so rounding half away from zero is adding whether
/// it reaches one half.
#[inline]
fn round_to_nibble(x: f32) -> u8 {
    let x = x.clamp(0.0, 15.0);
    let whole = x as u8;
    whole + u8::from(x - f32::from(whole) >= 0.5)
}

impl PackedI4 {
    /// Quantises a row-major f32 matrix `[n, k]`: each group's range `min..=max` is cut
    /// into 15 steps (against the stored f16 scale and minimum, so rounding them moves no
    /// weight by more than it must).
    pub fn quantize(w: &[f32], n: usize, k: usize) -> Self {
        assert_eq!(w.len(), n * k, "w must be [n, k]");
        Self::pack(n, k, |row, g, nibbles| {
            quantize_group(
                &w[row * k + g * GROUP..row * k + k.min((g + 1) * GROUP)],
                nibbles,
            )
        })
    }

    /// Packs weights already quantised as `w = nibble · scale + min` without rounding them
    /// again: GGUF's Q4_1 and Q4_0 (f16 per 32 from [`Scales::per_block`], Q4_0's minimum
    /// `-8 · scale`) and Q4_K (`scale = d · sc`, `min = -dmin · m`, from
    /// [`Scales::super_block`]). `row_nibbles(row, out)` writes row `row`'s `k` nibbles,
    /// each in `0..=15`, so a caller decodes its blocks one row at a time with no copy of
    /// the whole matrix.
    pub fn from_rows(
        n: usize,
        k: usize,
        scales: Scales,
        mins: Scales,
        row_nibbles: impl Fn(usize, &mut [u8]) + Sync,
    ) -> Self {
        let k_pad = k.div_ceil(GROUP) * GROUP;
        let n_pad = n.div_ceil(ROWS_PER_BLOCK) * ROWS_PER_BLOCK;
        assert!(
            [&scales, &mins]
                .iter()
                .all(|s| s.group_k() == GROUP && s.groups() == k_pad / GROUP && s.covers(n_pad)),
            "a scale and a minimum per row and group of 32"
        );
        let mut data = vec![0u8; n_pad * k_pad / 2];
        if n > 0 && k > 0 {
            data.par_chunks_mut(ROWS_PER_BLOCK * k_pad / 2)
                .enumerate()
                .for_each(|(block, data)| {
                    let rows = block_rows(block, (n, k, k_pad), 4, &row_nibbles);
                    lay_out_nibbles(&rows, &mut vec![0u8; k_pad], data);
                });
        }
        Self {
            n,
            k,
            k_pad,
            data,
            scales,
            mins,
        }
    }

    /// [`PackedI4::quantize`]'s packer: `group(row, g, nibbles)` writes row `row`'s group `g` into `nibbles` (zeroed before,
    /// so the padding past `k` stays 0) and returns its scale and minimum. Row blocks are
    /// packed on every core, as [`PackedI8`](crate::int8::PackedI8)'s are.
    fn pack(
        n: usize,
        k: usize,
        group: impl Fn(usize, usize, &mut [u8; GROUP]) -> (f16, f16) + Sync,
    ) -> Self {
        let k_pad = k.div_ceil(GROUP) * GROUP;
        let n_pad = n.div_ceil(ROWS_PER_BLOCK) * ROWS_PER_BLOCK;
        let n_groups = k_pad / GROUP;
        let mut data = vec![0u8; n_pad * k_pad / 2];
        let mut scales = vec![f16::ZERO; n_pad * n_groups];
        let mut mins = vec![f16::ZERO; n_pad * n_groups];
        if n > 0 && k > 0 {
            data.par_chunks_mut(ROWS_PER_BLOCK * k_pad / 2)
                .zip(scales.par_chunks_mut(ROWS_PER_BLOCK * n_groups))
                .zip(mins.par_chunks_mut(ROWS_PER_BLOCK * n_groups))
                .enumerate()
                .for_each(|(row_block, ((data, scales), mins))| {
                    let first = row_block * ROWS_PER_BLOCK;
                    for row in 0..ROWS_PER_BLOCK.min(n - first) {
                        for g in 0..n_groups {
                            let mut nibbles = [0u8; GROUP];
                            let at = scale_index(row, g, n_groups);
                            (scales[at], mins[at]) = group(first + row, g, &mut nibbles);
                            for (j, &nibble) in nibbles.iter().enumerate() {
                                let (byte, high) = nibble_position(row, g * GROUP + j, k_pad);
                                data[byte] |= if high { nibble << 4 } else { nibble };
                            }
                        }
                    }
                });
        }
        Self {
            n,
            k,
            k_pad,
            data,
            scales: Scales::half(GROUP, n_groups, scales),
            mins: Scales::half(GROUP, n_groups, mins),
        }
    }

    pub fn n_groups(&self) -> usize {
        self.k_pad / GROUP
    }

    /// The step of `row`'s group `group`.
    pub fn scale(&self, row: usize, group: usize) -> f32 {
        self.scales.get(row, group)
    }

    /// The minimum of `row`'s group `group`.
    pub fn min(&self, row: usize, group: usize) -> f32 {
        self.mins.get(row, group)
    }

    /// The nibble of `w[row][kk]`.
    fn nibble(&self, row: usize, kk: usize) -> u8 {
        let (byte, high) = nibble_position(row, kk, self.k_pad);
        if high {
            self.data[byte] >> 4
        } else {
            self.data[byte] & 0xF
        }
    }

    /// The weight as the kernels see it, back in f32.
    pub fn dequantize_row(&self, row: usize) -> Vec<f32> {
        let mut out = vec![0.0; self.k];
        self.dequantize_row_into(row, &mut out);
        out
    }

    /// As [`PackedI4::dequantize_row`], into `out` (`[k]`): a tied model's embeddings.
    pub fn dequantize_row_into(&self, row: usize, out: &mut [f32]) {
        for (kk, o) in out[..self.k].iter_mut().enumerate() {
            *o = self.weight(row, kk);
        }
    }

    /// `w[row][kk]` as the kernels see it.
    #[inline]
    pub fn weight(&self, row: usize, kk: usize) -> f32 {
        let g = kk / GROUP;
        f32::from(self.nibble(row, kk)) * self.scale(row, g) + self.min(row, g)
    }

    /// `out[i] += v · w[cols.start + i][kk]`, as [`PackedI8::add_column`](crate::int8::PackedI8::add_column).
    pub fn add_column(&self, kk: usize, v: f32, out: &mut [f32], cols: Range<usize>) {
        self.add_column_with(isa::active(), kk, v, out, cols)
    }

    /// As [`PackedI4::add_column`] with an explicit ISA: the same sums on every ISA.
    pub fn add_column_with(
        &self,
        isa: Isa,
        kk: usize,
        v: f32,
        out: &mut [f32],
        cols: Range<usize>,
    ) {
        assert!(kk < self.k && cols.end <= self.n && out.len() == cols.len());
        isa.assert_supported();
        #[cfg(target_arch = "x86_64")]
        if isa >= Isa::Avx2 {
            // SAFETY: `Isa::Avx2` and above have AVX2 and F16C (asserted); `kk` and `cols`
            // are inside the matrix.
            return unsafe { x86::add_column_avx2(self, kk, v, out, cols) };
        }
        for (o, row) in out.iter_mut().zip(cols) {
            *o += v * self.weight(row, kk);
        }
    }

    pub fn bytes(&self) -> usize {
        self.data.len() + self.scales.bytes() + self.mins.bytes()
    }
}

/// `out[m, n] = dequant(a) · dequant(w)ᵀ` with the active ISA.
pub fn gemm_i4(pool: &ThreadPool, a: &QuantizedView<'_>, w: &PackedI4, out: &mut [f32]) {
    gemm_i4_with(isa::active(), pool, a, w, out)
}

/// As [`gemm_i4`] with an explicit ISA (tests compare every ISA against scalar).
pub fn gemm_i4_with(
    isa: Isa,
    pool: &ThreadPool,
    a: &QuantizedView<'_>,
    w: &PackedI4,
    out: &mut [f32],
) {
    let out = SharedSlice::new(out);
    pool.run_team(&|team| {
        // SAFETY: the team's column splits are disjoint; `out` is not read until the end.
        unsafe { gemm_i4_cols(isa, a, w, &out, team.split(w.n, COLUMN_ALIGN)) }
    });
}

/// Computes output columns `cols` of every row: the part of a [`gemm_i4`] one thread of a
/// region does. `cols` starts on a multiple of [`COLUMN_ALIGN`].
///
/// # Safety
/// No other thread accesses these columns of `out` until the next barrier.
pub unsafe fn gemm_i4_cols(
    isa: Isa,
    a: &QuantizedView<'_>,
    w: &PackedI4,
    out: &SharedSlice<'_, f32>,
    cols: Range<usize>,
) {
    check_operands(a, (w.n, w.k, w.k_pad), out, true);
    let n_pad = w.n.div_ceil(ROWS_PER_BLOCK) * ROWS_PER_BLOCK;
    // The kernels load whole 16-row groups and 4-byte activation groups unchecked.
    assert_eq!(
        Some(w.data.len()),
        n_pad.checked_mul(w.k_pad / 2),
        "packed weights must be [n_pad, k_pad / 2]"
    );
    assert!(
        [&w.scales, &w.mins]
            .iter()
            .all(|s| s.group_k() == GROUP && s.groups() == w.n_groups() && s.covers(n_pad)),
        "one scale and minimum per row and group"
    );
    let Some(blocks) = column_blocks(cols, w.n) else {
        return;
    };
    isa.assert_supported();
    let m = a.m;
    let out = out.as_mut_ptr();
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Amx if m >= AMX_MIN_ROWS => crate::int8::amx::gemm_blocks_amx_i4(a, w, out, blocks),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx512` and above have AVX-512F; `has_vnni` checked VNNI and BW.
        Isa::Amx | Isa::Avx512 if crate::int8::x86::has_vnni() => {
            x86::gemm_blocks_vnni(a, w, out, blocks)
        }
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::AvxVnni` is only selected when the CPU has AVX2, FMA, F16C and
        // AVX-VNNI (asserted above).
        Isa::AvxVnni => x86::gemm_blocks_avxvnni(a, w, out, blocks),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::detect` requires AVX2, FMA and F16C for `Isa::Avx2` and every
        // family above it.
        Isa::Amx | Isa::Avx512 | Isa::Avx2 => x86::gemm_blocks_avx2(a, w, out, blocks),
        _ => reference::gemm_blocks_scalar(a, w, out, blocks),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::int8::QuantizedRows;
    use crate::test_support::{
        assert_an_empty_column_range_writes_nothing, assert_every_isa_matches_scalar, random,
        refuse_a_range_ending_inside_a_block, rows_of, SuperGroupI4, L2_CROSSING_GEMM_SHAPES,
        PREFILL_GEMM_SHAPES, RAGGED_GEMM_SHAPES,
    };

    #[test]
    fn every_isa_matches_scalar_exactly_across_l2_chunks() {
        assert_every_isa_matches_scalar::<PackedI4>(&L2_CROSSING_GEMM_SHAPES, &[1, 2], (7, 8));
    }

    /// From 33 rows AMX unpacks each chunk once for several passes (two of these shapes).
    #[test]
    fn every_isa_matches_scalar_exactly_on_prefill_batches() {
        assert_every_isa_matches_scalar::<PackedI4>(&PREFILL_GEMM_SHAPES, &[1, 2], (5, 6));
    }

    #[test]
    fn an_empty_column_range_writes_nothing() {
        assert_an_empty_column_range_writes_nothing::<PackedI4>();
    }

    #[test]
    #[should_panic(expected = "end on a block or at n")]
    fn a_range_ending_inside_a_block_is_refused() {
        refuse_a_range_ending_inside_a_block::<PackedI4>();
    }

    #[test]
    fn every_isa_matches_scalar_exactly_on_ragged_shapes() {
        assert_every_isa_matches_scalar::<PackedI4>(&RAGGED_GEMM_SHAPES, &[2], (2, 1));
    }

    #[test]
    fn q4_k_scales_match_scalar_on_every_isa() {
        assert_every_isa_matches_scalar::<SuperGroupI4>(&RAGGED_GEMM_SHAPES, &[2], (3, 4));
        assert_every_isa_matches_scalar::<SuperGroupI4>(&L2_CROSSING_GEMM_SHAPES, &[1], (5, 6));
        assert_every_isa_matches_scalar::<SuperGroupI4>(&PREFILL_GEMM_SHAPES, &[1, 2], (7, 8));
    }

    #[test]
    fn k_quant_scales_dequantise_to_q4_k_values_exactly() {
        let (n, k): (usize, usize) = (17, 256 + 64);
        let n_groups = k.div_ceil(GROUP);
        let nibbles: Vec<u8> = (0..n * k).map(|i| ((i * 7) % 16) as u8).collect();
        let d: Vec<f16> = (0..n * 2)
            .map(|i| f16::from_f32(0.00173 * (i as f32 + 1.0)))
            .collect();
        let dmin: Vec<f16> = (0..n * 2)
            .map(|i| f16::from_f32(0.00311 * (i as f32 + 2.0)))
            .collect();
        let sc: Vec<u8> = (0..n * n_groups).map(|i| (i * 13 % 64) as u8).collect();
        let m: Vec<u8> = (0..n * n_groups).map(|i| (i * 29 % 64) as u8).collect();
        let six_bits = |v: &[u8]| -> Vec<i8> { v.iter().map(|&x| x as i8).collect() };
        let minus_dmin: Vec<f16> = dmin.iter().map(|&x| -x).collect();
        let w = PackedI4::from_rows(
            n,
            k,
            Scales::super_block(n, k, GROUP, &d, &six_bits(&sc)),
            Scales::super_block(n, k, GROUP, &minus_dmin, &six_bits(&m)),
            rows_of(&nibbles, k),
        );
        for row in 0..n {
            let want: Vec<f32> = (0..k)
                .map(|kk| {
                    let (g, s) = (row * n_groups + kk / GROUP, row * 2 + kk / 256);
                    // GGUF's order: both products first, then code times scale minus min.
                    let (scale, min) = (
                        d[s].to_f32() * f32::from(sc[g]),
                        dmin[s].to_f32() * f32::from(m[g]),
                    );
                    scale * f32::from(nibbles[row * k + kk]) - min
                })
                .collect();
            assert_eq!(w.dequantize_row(row), want, "row {row}");
        }
    }

    #[test]
    fn product_equals_the_dequantised_operands_product() {
        let (m, k, n) = (3, 256, 20);
        let (x, wf) = (random(m * k, 3), random(n * k, 4));
        let w = PackedI4::quantize(&wf, n, k);
        let mut a = QuantizedRows::default();
        a.quantize(&x, m, k, w.k_pad);
        let mut got = vec![0.0; m * n];
        gemm_i4(&ThreadPool::new(1).unwrap(), &a.view(), &w, &mut got);
        for i in 0..m {
            for col in 0..n {
                let want: f64 = w
                    .dequantize_row(col)
                    .iter()
                    .zip(&a.data[i * w.k_pad..])
                    .enumerate()
                    .map(|(kk, (&wv, &q))| {
                        let a_scale = a.scales[i * w.n_groups() + kk / GROUP];
                        f64::from(wv) * f64::from(q) * f64::from(a_scale)
                    })
                    .sum();
                let g = f64::from(got[i * n + col]);
                assert!((g - want).abs() < 1e-4, "{g} vs {want}");
            }
        }
    }

    #[test]
    fn packing_round_trips_within_half_a_step() {
        let (n, k) = (21, 70);
        let wf = random(n * k, 5);
        let w = PackedI4::quantize(&wf, n, k);
        for row in 0..n {
            for (kk, (got, want)) in w
                .dequantize_row(row)
                .iter()
                .zip(&wf[row * k..(row + 1) * k])
                .enumerate()
            {
                let (step, min) = (w.scale(row, kk / GROUP), w.min(row, kk / GROUP));
                // Half a step, plus what rounding the minimum and the step to f16 moved.
                let f16_rounding = (min.abs() + 15.0 * step) * f32::from(f16::EPSILON);
                assert!(
                    (got - want).abs() <= step / 2.0 + f16_rounding,
                    "row {row} k {kk}: {got} vs {want}"
                );
            }
        }
    }

    #[test]
    fn nibbles_round_as_f32_round_does() {
        let mut xs = vec![
            -1.0,
            -0.5,
            -0.0,
            0.0,
            0.49999997,
            0.5,
            14.5,
            14.999999,
            15.0,
            15.5,
            1e9,
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
        ];
        xs.extend((0..17).map(|i| i as f32 + 0.5));
        xs.extend(random(4096, 3).iter().map(|v| v * 20.0));
        for x in xs {
            let want = x.round().clamp(0.0, 15.0) as u8;
            assert_eq!(round_to_nibble(x), want, "{x}");
        }
    }

    #[test]
    fn a_grid_of_sixteen_levels_packs_exactly() {
        // What a Q4_1 block dequantises to: q·d + m with q spanning 0..=15.
        let (d, m) = (0.03125f32, -0.25f32);
        let wf: Vec<f32> = (0..17 * 64)
            .map(|i| ((i * 7) % 16) as f32 * d + m)
            .collect();
        let w = PackedI4::quantize(&wf, 17, 64);
        for row in 0..17 {
            assert_eq!(w.dequantize_row(row), wf[row * 64..(row + 1) * 64]);
        }
    }

    /// `p`'s nibbles `[n, k]`, scales and minimums `[n, k / 32]`, row-major.
    fn unpacked(p: &PackedI4) -> (Vec<u8>, Vec<f16>, Vec<f16>) {
        let nibbles = (0..p.n * p.k).map(|i| p.nibble(i / p.k, i % p.k)).collect();
        let n_groups = p.n_groups();
        let at = |s: &Scales, i: usize| f16::from_f32(s.get(i / n_groups, i % n_groups));
        let scales = (0..p.n * n_groups).map(|i| at(&p.scales, i)).collect();
        let mins = (0..p.n * n_groups).map(|i| at(&p.mins, i)).collect();
        (nibbles, scales, mins)
    }

    #[test]
    fn from_rows_packs_what_quantize_packed() {
        // Padding along both axes, a shape without, and a tiny one.
        for (n, k) in [(37, 7 * GROUP + 5), (16, 2 * GROUP), (3, 10)] {
            let w: Vec<f32> = random(n * k, 13).iter().map(|v| v * 3.0).collect();
            let quantized = PackedI4::quantize(&w, n, k);
            let (nibbles, scales, mins) = unpacked(&quantized);
            let (scales, mins) = (
                Scales::per_block(n, k, &scales),
                Scales::per_block(n, k, &mins),
            );
            let packed = PackedI4::from_rows(n, k, scales, mins, rows_of(&nibbles, k));
            assert_eq!((packed.n, packed.k, packed.k_pad), (n, k, quantized.k_pad));
            assert_eq!(packed.data, quantized.data, "{n}×{k}");
            assert_eq!(packed.scales, quantized.scales, "{n}×{k}");
            assert_eq!(packed.mins, quantized.mins, "{n}×{k}");
        }
    }

    #[test]
    fn from_rows_dequantises_to_its_inputs_exactly() {
        let (n, k) = (21, 3 * GROUP + 7);
        let n_groups = k.div_ceil(GROUP);
        let nibbles: Vec<u8> = (0..n * k).map(|i| ((i * 7) % 16) as u8).collect();
        let scales: Vec<f16> = (0..n * n_groups)
            .map(|i| f16::from_f32((i as f32 - 30.0) * 0.0123))
            .collect();
        let mins: Vec<f16> = (0..n * n_groups)
            .map(|i| f16::from_f32((i as f32 - 40.0) * -0.071))
            .collect();
        let per_block = |v: &[f16]| Scales::per_block(n, k, v);
        let packed = PackedI4::from_rows(
            n,
            k,
            per_block(&scales),
            per_block(&mins),
            rows_of(&nibbles, k),
        );
        for row in 0..n {
            let want: Vec<f32> = (0..k)
                .map(|kk| {
                    let g = row * n_groups + kk / GROUP;
                    f32::from(nibbles[row * k + kk]) * scales[g].to_f32() + mins[g].to_f32()
                })
                .collect();
            assert_eq!(packed.dequantize_row(row), want, "row {row}");
        }
    }

    #[test]
    fn constant_group_and_empty_inner_dimension() {
        let pool = ThreadPool::new(2).unwrap();
        let w = PackedI4::quantize(&[0.5; 3 * 40], 3, 40);
        assert!((0..3).all(|row| w.scale(row, 0) == 0.0 && w.scale(row, 1) == 0.0));
        assert!(w.dequantize_row(2).iter().all(|&v| v == 0.5));
        let empty = PackedI4::quantize(&[], 5, 0);
        let mut a = QuantizedRows::default();
        a.quantize(&[], 3, 0, empty.k_pad);
        for isa in Isa::available() {
            let mut out = vec![f32::NAN; 15];
            gemm_i4_with(isa, &pool, &a.view(), &empty, &mut out);
            assert!(out.iter().all(|&v| v == 0.0), "{isa}");
        }
    }
}
