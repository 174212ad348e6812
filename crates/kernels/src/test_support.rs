//! Inputs the kernel tests share.

use half::f16;
use rand::{Rng, SeedableRng};

use crate::int4::{gemm_i4_cols, gemm_i4_with, PackedI4};
use crate::int6::{gemm_i6_cols, gemm_i6_with, PackedI6};
use crate::int8::{gemm_i8_cols, gemm_i8_with, PackedI8, QuantizedRows, QuantizedView};
use crate::scales::Scales;
use crate::{Isa, SharedSlice, ThreadPool};

/// `len` seeded values in `[-1, 1)`.
pub fn random(len: usize, seed: u64) -> Vec<f32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..len).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

/// Row `row` of the row-major `[_, k]` `matrix` into `out`: how the `from_rows` packers
/// take a matrix already in memory.
pub fn rows_of<T: Copy + Sync>(matrix: &[T], k: usize) -> impl Fn(usize, &mut [T]) + Sync + '_ {
    move |row, out| out.copy_from_slice(&matrix[row * k..(row + 1) * k])
}

/// `(m, k, n)` of integer GEMM parity tests: none a multiple of every block size, so
/// the packed layouts' padding and the kernels' tails are all exercised.
pub const RAGGED_GEMM_SHAPES: [(usize, usize, usize); 12] = [
    (1, 1, 1),
    (1, 5, 17),
    (3, 33, 7),
    (5, 64, 40),
    (4, 130, 33),
    (9, 576, 67),
    (1, 1000, 16),
    (7, 63, 129),
    (14, 96, 65),
    (10, 72, 48),
    (6, 96, 48),
    (8, 160, 33),
];

/// `(m, k, n)` whose packed weights span more than one of the integer kernels' L2 chunks
/// on one thread (4864 columns of a k ≤ 208 block walk past 512 KiB), so chunk seams are
/// checked bit-exactly too.
pub const L2_CROSSING_GEMM_SHAPES: [(usize, usize, usize); 3] =
    [(5, 112, 4864), (3, 208, 4864), (1, 896, 4864)];

/// `(m, k, n)` of batches from 8 rows: whole and partial 16-row AMX tiles, one and two
/// tiles per pass, an odd last weight block, and (the last) weights crossing an L2 chunk.
pub const PREFILL_GEMM_SHAPES: [(usize, usize, usize); 6] = [
    (8, 64, 40),
    (16, 32, 16),
    (17, 96, 33),
    (32, 64, 48),
    (45, 576, 67),
    (40, 112, 4864),
];

/// A packed integer weight format, as the GEMM tests drive it: the same checks hold for
/// INT8 and INT4.
pub trait PackedGemm: Sized {
    fn pack(w: &[f32], n: usize, k: usize) -> Self;
    fn k_pad(&self) -> usize;
    fn gemm_with(isa: Isa, pool: &ThreadPool, a: &QuantizedView<'_>, w: &Self, out: &mut [f32]);
    /// # Safety
    /// As the format's `*_cols` function.
    unsafe fn gemm_cols(
        isa: Isa,
        a: &QuantizedView<'_>,
        w: &Self,
        out: &SharedSlice<'_, f32>,
        cols: std::ops::Range<usize>,
    );
}

impl PackedGemm for PackedI8 {
    fn pack(w: &[f32], n: usize, k: usize) -> Self {
        PackedI8::quantize(w, n, k)
    }
    fn k_pad(&self) -> usize {
        self.k_pad
    }
    fn gemm_with(isa: Isa, pool: &ThreadPool, a: &QuantizedView<'_>, w: &Self, out: &mut [f32]) {
        gemm_i8_with(isa, pool, a, w, out)
    }
    unsafe fn gemm_cols(
        isa: Isa,
        a: &QuantizedView<'_>,
        w: &Self,
        out: &SharedSlice<'_, f32>,
        cols: std::ops::Range<usize>,
    ) {
        gemm_i8_cols(isa, a, w, out, cols)
    }
}

impl PackedGemm for PackedI4 {
    fn pack(w: &[f32], n: usize, k: usize) -> Self {
        PackedI4::quantize(w, n, k)
    }
    fn k_pad(&self) -> usize {
        self.k_pad
    }
    fn gemm_with(isa: Isa, pool: &ThreadPool, a: &QuantizedView<'_>, w: &Self, out: &mut [f32]) {
        gemm_i4_with(isa, pool, a, w, out)
    }
    unsafe fn gemm_cols(
        isa: Isa,
        a: &QuantizedView<'_>,
        w: &Self,
        out: &SharedSlice<'_, f32>,
        cols: std::ops::Range<usize>,
    ) {
        gemm_i4_cols(isa, a, w, out, cols)
    }
}

/// INT8 weights in a K-quant's form (Q6_K's): codes in -32..=31 from the seeded weights,
/// a signed 8-bit scale per 16 and an f16 factor per 256 that vary by row and group.
pub struct SubBlockI8(pub PackedI8);

impl PackedGemm for SubBlockI8 {
    fn pack(w: &[f32], n: usize, k: usize) -> Self {
        let q: Vec<i8> = w
            .iter()
            .map(|v| (v * 31.5).round().clamp(-32.0, 31.0) as i8)
            .collect();
        let (d, _) = super_factors(n, k);
        let sub: Vec<i8> = (0..n * k.div_ceil(16))
            .map(|i| (((i * 53 + 11) % 255) as i32 - 127) as i8)
            .collect();
        let scales = Scales::super_block(n, k, 16, &d, &sub);
        Self(PackedI8::from_rows(n, k, scales, None, rows_of(&q, k)).expect("no -128"))
    }
    fn k_pad(&self) -> usize {
        self.0.k_pad
    }
    fn gemm_with(isa: Isa, pool: &ThreadPool, a: &QuantizedView<'_>, w: &Self, out: &mut [f32]) {
        gemm_i8_with(isa, pool, a, &w.0, out)
    }
    unsafe fn gemm_cols(
        isa: Isa,
        a: &QuantizedView<'_>,
        w: &Self,
        out: &SharedSlice<'_, f32>,
        cols: std::ops::Range<usize>,
    ) {
        gemm_i8_cols(isa, a, &w.0, out, cols)
    }
}

/// 6-bit codes in Q6_K's form: codes 0..=63 from the seeded weights, zero point 32, a
/// signed 8-bit scale per 16 and an f16 factor per 256 that vary by row and group.
impl PackedGemm for PackedI6 {
    fn pack(w: &[f32], n: usize, k: usize) -> Self {
        let codes: Vec<u8> = w.iter().map(|v| ((v + 1.0) * 31.5).round() as u8).collect();
        let (d, _) = super_factors(n, k);
        let sub: Vec<i8> = (0..n * k.div_ceil(16))
            .map(|i| (((i * 53 + 11) % 255) as i32 - 127) as i8)
            .collect();
        PackedI6::from_rows(
            n,
            k,
            32,
            Scales::super_block(n, k, 16, &d, &sub),
            rows_of(&codes, k),
        )
    }
    fn k_pad(&self) -> usize {
        self.k_pad
    }
    fn gemm_with(isa: Isa, pool: &ThreadPool, a: &QuantizedView<'_>, w: &Self, out: &mut [f32]) {
        gemm_i6_with(isa, pool, a, w, out)
    }
    unsafe fn gemm_cols(
        isa: Isa,
        a: &QuantizedView<'_>,
        w: &Self,
        out: &SharedSlice<'_, f32>,
        cols: std::ops::Range<usize>,
    ) {
        gemm_i6_cols(isa, a, w, out, cols)
    }
}

/// INT8 weights in Q5_K's form: codes in 0..=31 from the seeded weights, 6-bit scales and
/// minimums per 32 and f16 `d` and `-dmin` per 256 that vary by row and group.
pub struct MinimumI8(pub PackedI8);

impl PackedGemm for MinimumI8 {
    fn pack(w: &[f32], n: usize, k: usize) -> Self {
        let q: Vec<i8> = w.iter().map(|v| ((v + 1.0) * 15.5).round() as i8).collect();
        let (scales, mins) = k_quant_scales(n, k);
        Self(PackedI8::from_rows(n, k, scales, Some(mins), rows_of(&q, k)).expect("no -128"))
    }
    fn k_pad(&self) -> usize {
        self.0.k_pad
    }
    fn gemm_with(isa: Isa, pool: &ThreadPool, a: &QuantizedView<'_>, w: &Self, out: &mut [f32]) {
        gemm_i8_with(isa, pool, a, &w.0, out)
    }
    unsafe fn gemm_cols(
        isa: Isa,
        a: &QuantizedView<'_>,
        w: &Self,
        out: &SharedSlice<'_, f32>,
        cols: std::ops::Range<usize>,
    ) {
        gemm_i8_cols(isa, a, &w.0, out, cols)
    }
}

/// INT4 weights in Q4_K's form: nibbles from the seeded weights, 6-bit scales and
/// minimums per 32 and f16 `d` and `dmin` per 256 that vary by row and group.
pub struct SuperGroupI4(pub PackedI4);

impl PackedGemm for SuperGroupI4 {
    fn pack(w: &[f32], n: usize, k: usize) -> Self {
        let nibbles: Vec<u8> = w.iter().map(|v| ((v + 1.0) * 7.5).round() as u8).collect();
        let (scales, mins) = k_quant_scales(n, k);
        Self(PackedI4::from_rows(
            n,
            k,
            scales,
            mins,
            rows_of(&nibbles, k),
        ))
    }
    fn k_pad(&self) -> usize {
        self.0.k_pad
    }
    fn gemm_with(isa: Isa, pool: &ThreadPool, a: &QuantizedView<'_>, w: &Self, out: &mut [f32]) {
        gemm_i4_with(isa, pool, a, &w.0, out)
    }
    unsafe fn gemm_cols(
        isa: Isa,
        a: &QuantizedView<'_>,
        w: &Self,
        out: &SharedSlice<'_, f32>,
        cols: std::ops::Range<usize>,
    ) {
        gemm_i4_cols(isa, a, &w.0, out, cols)
    }
}

/// Q4_K/Q5_K-style scales and minimums for `[n, k]`: 6-bit factors per 32 that vary by
/// row and group, times f16 `d` and `-dmin` per 256.
fn k_quant_scales(n: usize, k: usize) -> (Scales, Scales) {
    let (d, dmin) = super_factors(n, k);
    let minus_dmin: Vec<f16> = dmin.iter().map(|&x| -x).collect();
    let six_bits = |mul: usize| -> Vec<i8> {
        (0..n * k.div_ceil(32))
            .map(|i| ((i * mul + 5) % 64) as i8)
            .collect()
    };
    (
        Scales::super_block(n, k, 32, &d, &six_bits(29)),
        Scales::super_block(n, k, 32, &minus_dmin, &six_bits(41)),
    )
}

/// Per-256 f16 factors `[n, k.div_ceil(256)]` (a `d` and a `dmin`) whose products with
/// 6- and 8-bit sub-scales need more bits than f16 has.
fn super_factors(n: usize, k: usize) -> (Vec<f16>, Vec<f16>) {
    let supers = n * k.div_ceil(256);
    let factor = |mul: f32| -> Vec<f16> {
        (0..supers)
            .map(|i| f16::from_f32(mul * (1.0 + (i % 7) as f32 * 0.1377)))
            .collect()
    };
    (factor(0.000_713), factor(0.000_391))
}

/// Seeded `[n, k]` weights packed as `W` and `[m, k]` activations quantised to match.
fn operands<W: PackedGemm>(m: usize, k: usize, n: usize, seeds: (u64, u64)) -> (W, QuantizedRows) {
    let w = W::pack(&random(n * k, seeds.0), n, k);
    let mut a = QuantizedRows::default();
    a.quantize(&random(m * k, seeds.1), m, k, w.k_pad());
    (w, a)
}

/// Every ISA's product equals the scalar oracle's bit for bit, on each of `shapes` and
/// pools of each of `threads`; `seeds` are the weights' and the activations'.
pub fn assert_every_isa_matches_scalar<W: PackedGemm>(
    shapes: &[(usize, usize, usize)],
    threads: &[usize],
    seeds: (u64, u64),
) {
    for &n_threads in threads {
        let pool = ThreadPool::new(n_threads).unwrap();
        for &(m, k, n) in shapes {
            let (w, a) = operands::<W>(m, k, n, seeds);
            let mut expected = vec![0.0; m * n];
            W::gemm_with(Isa::Scalar, &pool, &a.view(), &w, &mut expected);
            for isa in Isa::available() {
                let mut got = vec![f32::NAN; m * n];
                W::gemm_with(isa, &pool, &a.view(), &w, &mut got);
                assert_eq!(got, expected, "{isa} threads={n_threads} m={m} k={k} n={n}");
            }
        }
    }
}

/// A trailing thread's share of n = 7 on two threads is `7..7`: it owns no block, and
/// must write nothing.
pub fn assert_an_empty_column_range_writes_nothing<W: PackedGemm>() {
    let (m, k, n) = (2, 40, 7);
    let (w, a) = operands::<W>(m, k, n, (2, 1));
    for isa in Isa::available() {
        let mut out = vec![f32::NAN; m * n];
        let shared = SharedSlice::new(&mut out);
        // SAFETY: no other thread touches `out`.
        unsafe { W::gemm_cols(isa, &a.view(), &w, &shared, 7..7) };
        assert!(
            out.iter().all(|v| v.is_nan()),
            "{isa} wrote outside its columns"
        );
    }
}

/// Columns `0..7` of 40 end inside a block, which another thread would share: refused.
pub fn refuse_a_range_ending_inside_a_block<W: PackedGemm>() {
    let (m, k, n) = (1, 32, 40);
    let (w, a) = operands::<W>(m, k, n, (2, 1));
    let mut out = vec![0.0; m * n];
    let shared = SharedSlice::new(&mut out);
    // SAFETY: no other thread touches `out`.
    unsafe { W::gemm_cols(Isa::Scalar, &a.view(), &w, &shared, 0..7) };
}
