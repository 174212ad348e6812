//! Projections in the precision chosen at load, and INT8 outlier channels.
//!
//! - f32: the reference. bf16: the same product with half the weight bytes.
//! - W8A8 (int8): INT8 weights with a scale per block of 32 along `k`; W4A8 (int4): 4-bit
//!   weights per group of 32. Both quantise activations per token and block of 32 at run
//!   time.
//!
//! Quantising activations has a catch. A few input channels of LLM activations are tens to
//! hundreds of times larger than the rest (the "outlier channels" of LLM.int8() and
//! llm.npu); with one in a block's scale, the block's other 31 channels are left with a
//! handful of levels. Those channels are found by a calibration pass ([`Calibration`]),
//! removed from the INT8 product, and computed in f32 against float weight columns (stored in
//! f16).

use std::ops::Range;

use pyramid_kernels::int4::{gemm_i4_cols, PackedI4};
use pyramid_kernels::int6::{gemm_i6_cols, PackedI6};
use pyramid_kernels::int8::{
    gemm_i8_cols, quantize_blocks_excluding, sum_blocks, PackedI8, QuantizedView, BLOCK_K,
};
use pyramid_kernels::matmul::{bf16, matmul_cols};
use pyramid_kernels::ops::{add_in_place, f16, outlier_product_cols};
use pyramid_kernels::{isa, SharedSlice, ThreadPool, COLUMN_ALIGN};

use crate::weights::Matrix;

/// A channel is an outlier when its calibration peak exceeds this multiple of the median
/// channel's peak.
pub const OUTLIER_RATIO: f32 = 4.0;
/// At most one channel in this many is kept in float, bounding the f32 side-product.
pub const MAX_OUTLIER_FRACTION: usize = 16;

/// A token's channel is an outlier when its magnitude exceeds this multiple of the row's
/// RMS: past the bulk of the row (a block of 32 Gaussian values peaks near 2.5 RMS),
/// far below the "massive activations" of LLMs (tens to hundreds of times the RMS). On
/// SmolLM2's Q4_1 file, 6 with up to 8 channels kept f32's greedy tokens on 6 of 6
/// prompts (8 with 8 or 16: 4; 5 with 16: 5, at a 10 % lower mean KL).
pub const TOKEN_OUTLIER_RATIO: f32 = 6.0;
/// At most this many of a token's channels per projection are computed in f32.
pub const MAX_TOKEN_OUTLIERS: usize = 8;
/// A free slot of a row's chosen channels.
const NO_CHANNEL: u32 = u32::MAX;

/// Integer weights in one of the packed layouts the kernels take.
#[derive(Debug, Clone)]
pub enum PackedWeights {
    I8(PackedI8),
    /// 5- and 6-bit codes with a zero point: a file's Q6_K, Q3_K and Q5_0 blocks.
    I6(PackedI6),
    I4(PackedI4),
}

/// Bits per integer weight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightBits {
    Eight,
    Four,
}

impl PackedWeights {
    fn n(&self) -> usize {
        match self {
            PackedWeights::I8(p) => p.n,
            PackedWeights::I6(p) => p.n,
            PackedWeights::I4(p) => p.n,
        }
    }

    fn k(&self) -> usize {
        match self {
            PackedWeights::I8(p) => p.k,
            PackedWeights::I6(p) => p.k,
            PackedWeights::I4(p) => p.k,
        }
    }

    fn k_pad(&self) -> usize {
        match self {
            PackedWeights::I8(p) => p.k_pad,
            PackedWeights::I6(p) => p.k_pad,
            PackedWeights::I4(p) => p.k_pad,
        }
    }

    fn bytes(&self) -> usize {
        match self {
            PackedWeights::I8(p) => p.bytes(),
            PackedWeights::I6(p) => p.bytes(),
            PackedWeights::I4(p) => p.bytes(),
        }
    }

    fn add_column(&self, kk: usize, v: f32, out: &mut [f32], cols: Range<usize>) {
        match self {
            PackedWeights::I8(p) => p.add_column(kk, v, out, cols),
            PackedWeights::I6(p) => p.add_column(kk, v, out, cols),
            PackedWeights::I4(p) => p.add_column(kk, v, out, cols),
        }
    }

    /// # Safety
    /// As [`gemm_i8_cols`].
    unsafe fn gemm_cols(
        &self,
        a: &QuantizedView<'_>,
        out: &SharedSlice<'_, f32>,
        cols: Range<usize>,
    ) {
        match self {
            PackedWeights::I8(p) => gemm_i8_cols(isa::active(), a, p, out, cols),
            PackedWeights::I6(p) => gemm_i6_cols(isa::active(), a, p, out, cols),
            PackedWeights::I4(p) => gemm_i4_cols(isa::active(), a, p, out, cols),
        }
    }
}

/// Integer weights with their outlier input channels split off in float.
#[derive(Debug, Clone)]
pub struct QuantLinear {
    /// Quantised with the outlier columns zeroed.
    pub packed: PackedWeights,
    /// Input channels computed in f32, ascending.
    pub outlier_channels: Vec<usize>,
    /// The outlier columns of the original weights, one channel's column per row:
    /// `[n_outliers, n_out]`, so the side product runs along outputs without a reduction.
    /// In f16 (within 0.05 % of each weight, far finer than the INT8 steps beside them),
    /// because decode reads these bytes every token.
    pub outlier_weights: Vec<f16>,
    /// Channels per token found from the token's own values and computed in f32 against
    /// the packed weights (no calibration; `--precision file`): at most this many (and at
    /// most [`MAX_TOKEN_OUTLIERS`]), 0 for none. Only without calibrated
    /// `outlier_channels`.
    pub token_outliers: usize,
}

impl QuantLinear {
    /// Consumes the f32 matrix: its buffer becomes the inliers' (a copy would double the
    /// load's largest transient).
    pub fn quantize(m: Matrix, bits: WeightBits, outlier_channels: Vec<usize>) -> Self {
        let (n, k) = (m.n_rows, m.n_cols);
        let n_o = outlier_channels.len();
        let mut inliers = m.data;
        let mut outlier_weights = vec![f16::ZERO; n * n_o];
        for row in 0..n {
            for (o, &c) in outlier_channels.iter().enumerate() {
                outlier_weights[o * n + row] = f16::from_f32(inliers[row * k + c]);
                inliers[row * k + c] = 0.0;
            }
        }
        let packed = match bits {
            WeightBits::Eight => PackedWeights::I8(PackedI8::quantize(&inliers, n, k)),
            WeightBits::Four => PackedWeights::I4(PackedI4::quantize(&inliers, n, k)),
        };
        Self {
            packed,
            outlier_channels,
            outlier_weights,
            token_outliers: 0,
        }
    }

    /// The file's own blocks, repacked exactly, with outliers found per token.
    pub fn from_file(packed: PackedWeights) -> Self {
        Self {
            packed,
            outlier_channels: Vec::new(),
            outlier_weights: Vec::new(),
            token_outliers: MAX_TOKEN_OUTLIERS,
        }
    }

    /// Values per row a prepared input keeps for the f32 side product.
    fn outlier_width(&self) -> usize {
        self.outlier_channels.len() + self.token_outliers.min(MAX_TOKEN_OUTLIERS)
    }

    /// Row `row` of the weights as the kernels see them, outlier columns restored.
    fn dequantize_row_into(&self, row: usize, out: &mut [f32]) {
        match &self.packed {
            PackedWeights::I8(p) => p.dequantize_row_into(row, out),
            PackedWeights::I6(p) => p.dequantize_row_into(row, out),
            PackedWeights::I4(p) => p.dequantize_row_into(row, out),
        }
        let n = self.packed.n();
        for (o, &c) in self.outlier_channels.iter().enumerate() {
            out[c] = self.outlier_weights[o * n + row].to_f32();
        }
    }
}

/// A projection's weights.
#[derive(Debug, Clone)]
pub enum Linear {
    F32(Matrix),
    /// `[n_out, n_in]` row-major, like [`Matrix`].
    Bf16 {
        data: Vec<bf16>,
        n_rows: usize,
        n_cols: usize,
    },
    Quant(Box<QuantLinear>),
}

impl Linear {
    pub fn to_bf16(m: &Matrix) -> Self {
        Linear::Bf16 {
            data: m.data.iter().map(|&v| bf16::from_f32(v)).collect(),
            n_rows: m.n_rows,
            n_cols: m.n_cols,
        }
    }

    pub fn n_out(&self) -> usize {
        match self {
            Linear::F32(m) => m.n_rows,
            Linear::Bf16 { n_rows, .. } => *n_rows,
            Linear::Quant(q) => q.packed.n(),
        }
    }

    pub fn n_in(&self) -> usize {
        match self {
            Linear::F32(m) => m.n_cols,
            Linear::Bf16 { n_cols, .. } => *n_cols,
            Linear::Quant(q) => q.packed.k(),
        }
    }

    /// Row `row` (`[n_in]`) in f32: how a tied model reads its embeddings.
    pub fn dequantize_row_into(&self, row: usize, out: &mut [f32]) {
        match self {
            Linear::F32(m) => out.copy_from_slice(m.row(row)),
            Linear::Bf16 { data, n_cols, .. } => {
                for (o, v) in out.iter_mut().zip(&data[row * n_cols..(row + 1) * n_cols]) {
                    *o = v.to_f32();
                }
            }
            Linear::Quant(q) => q.dequantize_row_into(row, out),
        }
    }

    pub fn bytes(&self) -> usize {
        match self {
            Linear::F32(m) => m.data.len() * 4,
            Linear::Bf16 { data, .. } => data.len() * 2,
            Linear::Quant(q) => q.packed.bytes() + q.outlier_weights.len() * 2,
        }
    }

    /// `out[n, n_out] = input[n, n_in] · wᵀ (+ bias)` as a region of its own; inside a
    /// forward pass the same two steps run as [`Linear::prepare_rows`] and
    /// [`Linear::forward_cols`] between the layer's barriers.
    pub fn forward(
        &self,
        pool: &ThreadPool,
        input: &[f32],
        bias: Option<&[f32]>,
        out: &mut [f32],
        n: usize,
        s: &mut LinearScratch,
    ) {
        let prepared = s.shared(n, self.n_in());
        let out = SharedSlice::new(out);
        pool.run_team(&|team| {
            // SAFETY: rows, then (after the barrier) columns, are split disjointly.
            unsafe {
                let rows = team.split(n, 1);
                let k = self.n_in();
                self.prepare_rows(&input[rows.start * k..rows.end * k], rows, &prepared);
                team.sync();
                self.forward_cols(
                    input,
                    &prepared,
                    bias,
                    &out,
                    n,
                    team.split(self.n_out(), COLUMN_ALIGN),
                );
            }
        });
    }

    /// Prepares rows `rows` of an `[n, n_in]` input for [`Linear::forward_cols`]: integer
    /// weights need each row quantised with the outlier channels split off; float weights
    /// read the input as it is. Projections of one [`Site`] share their preparation.
    /// `input` holds only those rows, so a thread never views rows others are writing.
    ///
    /// # Safety
    /// No other thread touches these rows of `prepared` until the next barrier.
    pub unsafe fn prepare_rows(
        &self,
        input: &[f32],
        rows: Range<usize>,
        prepared: &PreparedInput<'_>,
    ) {
        let Linear::Quant(q) = self else { return };
        let (k, k_pad) = (q.packed.k(), q.packed.k_pad());
        let (n_blocks, width) = (k_pad / BLOCK_K, q.outlier_width());
        assert!(input.len() == rows.len() * k && rows.end * k_pad <= prepared.data.len());
        assert!(
            q.token_outliers == 0 || q.outlier_channels.is_empty(),
            "per-token outliers replace calibrated ones"
        );
        let mut chosen = [0usize; MAX_TOKEN_OUTLIERS];
        for (i, r) in rows.enumerate() {
            let x = &input[i * k..(i + 1) * k];
            let excluded = if q.token_outliers > 0 {
                let count =
                    token_outliers(x, &mut chosen[..q.token_outliers.min(MAX_TOKEN_OUTLIERS)]);
                let slots = prepared.channels.range_mut(r * width..(r + 1) * width);
                slots.fill(NO_CHANNEL);
                for (slot, &c) in slots.iter_mut().zip(&chosen[..count]) {
                    *slot = c as u32;
                }
                &chosen[..count]
            } else {
                &q.outlier_channels[..]
            };
            let q_row = prepared.data.range_mut(r * k_pad..(r + 1) * k_pad);
            let blocks = r * n_blocks..(r + 1) * n_blocks;
            quantize_blocks_excluding(
                x,
                excluded,
                q_row,
                prepared.scales.range_mut(blocks.clone()),
            );
            sum_blocks(q_row, prepared.sums.range_mut(blocks));
            let outliers = prepared.outliers.range_mut(r * width..(r + 1) * width);
            outliers.fill(0.0);
            for (o, &c) in outliers.iter_mut().zip(excluded) {
                *o = x[c];
            }
        }
    }

    /// Computes columns `cols` (starting on a multiple of [`COLUMN_ALIGN`]) of
    /// `out = input · wᵀ (+ bias)`, from `input` or, for integer weights, from its rows as
    /// [`Linear::prepare_rows`] left them.
    ///
    /// # Safety
    /// All rows of `prepared` are complete and unwritten until the next barrier, and no
    /// other thread touches these columns of `out` until then.
    pub unsafe fn forward_cols(
        &self,
        input: &[f32],
        prepared: &PreparedInput<'_>,
        bias: Option<&[f32]>,
        out: &SharedSlice<'_, f32>,
        n: usize,
        cols: Range<usize>,
    ) {
        let n_out = self.n_out();
        match self {
            Linear::F32(m) => matmul_cols(
                isa::active(),
                &input[..n * m.n_cols],
                &m.data,
                out,
                n,
                m.n_cols,
                n_out,
                cols.clone(),
            ),
            Linear::Bf16 { data, n_cols, .. } => matmul_cols(
                isa::active(),
                &input[..n * n_cols],
                data,
                out,
                n,
                *n_cols,
                n_out,
                cols.clone(),
            ),
            Linear::Quant(q) => {
                let k_pad = q.packed.k_pad();
                let n_blocks = k_pad / BLOCK_K;
                let view = QuantizedView {
                    data: &prepared.data.as_slice()[..n * k_pad],
                    scales: &prepared.scales.as_slice()[..n * n_blocks],
                    block_sums: &prepared.sums.as_slice()[..n * n_blocks],
                    k_pad,
                    m: n,
                };
                q.packed.gemm_cols(&view, out, cols.clone());
                let width = q.outlier_width();
                let outliers = &prepared.outliers.as_slice()[..n * width];
                if q.token_outliers > 0 {
                    let channels = &prepared.channels.as_slice()[..n * width];
                    for r in 0..n {
                        let row = out.range_mut(r * n_out + cols.start..r * n_out + cols.end);
                        let at = r * width..(r + 1) * width;
                        for (&c, &v) in channels[at.clone()].iter().zip(&outliers[at]) {
                            if c != NO_CHANNEL {
                                q.packed.add_column(c as usize, v, row, cols.clone());
                            }
                        }
                    }
                } else {
                    outlier_product_cols(
                        outliers,
                        width,
                        &q.outlier_weights,
                        out,
                        n_out,
                        cols.clone(),
                    );
                }
            }
        }
        if let Some(b) = bias {
            for r in 0..n {
                add_in_place(
                    out.range_mut(r * n_out + cols.start..r * n_out + cols.end),
                    &b[cols.clone()],
                );
            }
        }
    }
}

/// Buffers the quantised activations of one projection site live in between
/// [`Linear::prepare_rows`] and [`Linear::forward_cols`]: sized once for the largest input
/// of a pass, reused by every site in turn.
#[derive(Debug, Default)]
pub struct LinearScratch {
    data: Vec<i8>,      // [n, k_pad]
    scales: Vec<f32>,   // [n, k_pad / BLOCK_K]
    sums: Vec<i32>,     // [n, k_pad / BLOCK_K]
    outliers: Vec<f32>, // [n, n_outliers]
    channels: Vec<u32>, // [n, MAX_TOKEN_OUTLIERS]
}

impl LinearScratch {
    /// Room for projections of up to `n` rows of at most `max_in` inputs.
    pub fn for_shape(n: usize, max_in: usize) -> Self {
        let k_pad = max_in.next_multiple_of(BLOCK_K);
        Self {
            data: Vec::with_capacity(n * k_pad),
            scales: Vec::with_capacity(n * k_pad / BLOCK_K),
            sums: Vec::with_capacity(n * k_pad / BLOCK_K),
            outliers: Vec::with_capacity(outlier_slots(n, max_in)),
            channels: Vec::with_capacity(n * MAX_TOKEN_OUTLIERS),
        }
    }

    /// Bytes the buffers hold reserved.
    pub fn reserved_bytes(&self) -> usize {
        self.data.capacity()
            + 4 * (self.scales.capacity()
                + self.sums.capacity()
                + self.outliers.capacity()
                + self.channels.capacity())
    }

    /// The buffers sized for `n` rows of at most `max_in` inputs, shared by a region.
    pub fn shared(&mut self, n: usize, max_in: usize) -> PreparedInput<'_> {
        let k_pad = max_in.next_multiple_of(BLOCK_K);
        self.data.resize(n * k_pad, 0);
        self.scales.resize(n * k_pad / BLOCK_K, 0.0);
        self.sums.resize(n * k_pad / BLOCK_K, 0);
        self.outliers.resize(outlier_slots(n, max_in), 0.0);
        self.channels.resize(n * MAX_TOKEN_OUTLIERS, NO_CHANNEL);
        PreparedInput {
            data: SharedSlice::new(&mut self.data),
            scales: SharedSlice::new(&mut self.scales),
            sums: SharedSlice::new(&mut self.sums),
            outliers: SharedSlice::new(&mut self.outliers),
            channels: SharedSlice::new(&mut self.channels),
        }
    }
}

/// Values the f32 side products of `n` rows of at most `max_in` inputs can need: the
/// calibrated channels' bound or the per-token one, whichever is larger.
fn outlier_slots(n: usize, max_in: usize) -> usize {
    n * (max_in / MAX_OUTLIER_FRACTION).max(MAX_TOKEN_OUTLIERS)
}

/// A projection input prepared for integer kernels, filled row by row by a region's threads.
pub struct PreparedInput<'a> {
    data: SharedSlice<'a, i8>,
    scales: SharedSlice<'a, f32>,
    sums: SharedSlice<'a, i32>,
    /// The f32 side product's input values per row: the calibrated channels', or the
    /// per-token outliers' (0 in free slots).
    outliers: SharedSlice<'a, f32>,
    /// The per-token outliers' channels per row ([`NO_CHANNEL`] in free slots).
    channels: SharedSlice<'a, u32>,
}

impl PreparedInput<'_> {
    /// Rows `rows` of an input prepared for `lin`, as an input of their own: one expert's
    /// group of rows. Experts of a layer share their sites' outlier channels, so rows
    /// prepared for any of them have one layout.
    pub fn rows(&self, lin: &Linear, rows: Range<usize>) -> PreparedInput<'_> {
        let (k_pad, n_blocks, n_o) = match lin {
            Linear::Quant(q) => (
                q.packed.k_pad(),
                q.packed.k_pad() / BLOCK_K,
                q.outlier_width(),
            ),
            // Float weights read their input as it is.
            Linear::F32(_) | Linear::Bf16 { .. } => (0, 0, 0),
        };
        let (start, end) = (rows.start, rows.end);
        PreparedInput {
            data: self.data.sub(start * k_pad..end * k_pad),
            scales: self.scales.sub(start * n_blocks..end * n_blocks),
            sums: self.sums.sub(start * n_blocks..end * n_blocks),
            outliers: self.outliers.sub(start * n_o..end * n_o),
            channels: self.channels.sub(start * n_o..end * n_o),
        }
    }
}

/// A token's outlier channels into `chosen` (at most its length), ascending: the largest
/// magnitudes among those above [`TOKEN_OUTLIER_RATIO`] times the row's RMS. Returns how
/// many. A row with a non-finite value has none (its RMS is not finite).
fn token_outliers(x: &[f32], chosen: &mut [usize]) -> usize {
    if x.is_empty() || chosen.is_empty() {
        return 0;
    }
    let mean_square = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let threshold = TOKEN_OUTLIER_RATIO * mean_square.sqrt();
    if !threshold.is_finite() {
        return 0;
    }
    let mut count = 0;
    for (c, &v) in x.iter().enumerate() {
        if v.abs() <= threshold {
            continue;
        }
        if count < chosen.len() {
            chosen[count] = c;
            count += 1;
            continue;
        }
        // Full: replace the smallest kept, if this one is larger (the first of equals stays).
        let (weakest, &w) = chosen
            .iter()
            .enumerate()
            .min_by(|a, b| x[*a.1].abs().total_cmp(&x[*b.1].abs()))
            .expect("chosen is not empty");
        if v.abs() > x[w].abs() {
            chosen[weakest] = c;
        }
    }
    chosen[..count].sort_unstable();
    count
}

/// Where a projection's input comes from; projections sharing an input share outliers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Site {
    /// Normed residual entering Q, K, V.
    AttnIn,
    /// Attention output entering the output projection.
    AttnOut,
    /// Normed residual entering gate and up.
    FfnIn,
    /// SwiGLU output entering down.
    FfnDown,
    /// Final normed residual entering the output head.
    Head,
}

const N_SITES: usize = 4;

impl Site {
    fn index(self) -> usize {
        match self {
            Site::AttnIn => 0,
            Site::AttnOut => 1,
            Site::FfnIn => 2,
            Site::FfnDown => 3,
            Site::Head => unreachable!("the head site is stored apart"),
        }
    }
}

/// Per-channel peak |activation| seen at every projection input during a calibration run.
/// Serialisable, so a loader can keep it beside the model and skip the f32 pass next time.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Calibration {
    layers: Vec<[Vec<f32>; N_SITES]>,
    head: Vec<f32>,
}

impl Calibration {
    pub fn new(n_layer: usize) -> Self {
        Self {
            layers: (0..n_layer).map(|_| Default::default()).collect(),
            head: Vec::new(),
        }
    }

    /// Folds a batch of activations `[n, width]` into the peaks of `site` in `layer`.
    pub fn record(&mut self, layer: usize, site: Site, x: &[f32], width: usize) {
        let peaks = match site {
            Site::Head => &mut self.head,
            s => &mut self.layers[layer][s.index()],
        };
        peaks.resize(width, 0.0);
        for row in x.chunks_exact(width) {
            for (p, v) in peaks.iter_mut().zip(row) {
                *p = p.max(v.abs());
            }
        }
    }

    /// The outlier channels of `site` in `layer` (empty if never recorded).
    pub fn outliers(&self, layer: usize, site: Site) -> Vec<usize> {
        let peaks = match site {
            Site::Head => &self.head,
            s => &self.layers[layer][s.index()],
        };
        select_outliers(peaks)
    }
}

/// Channels whose peak exceeds [`OUTLIER_RATIO`] × the median peak, largest first, at most
/// one in [`MAX_OUTLIER_FRACTION`]; returned in ascending channel order.
pub fn select_outliers(peaks: &[f32]) -> Vec<usize> {
    if peaks.is_empty() {
        return Vec::new();
    }
    let mut sorted = peaks.to_vec();
    sorted.sort_by(f32::total_cmp);
    let threshold = sorted[sorted.len() / 2] * OUTLIER_RATIO;
    let mut candidates: Vec<usize> = (0..peaks.len()).filter(|&c| peaks[c] > threshold).collect();
    candidates.sort_by(|&a, &b| peaks[b].total_cmp(&peaks[a]));
    candidates.truncate(peaks.len() / MAX_OUTLIER_FRACTION);
    candidates.sort_unstable();
    candidates
}

/// Text whose activations choose the outlier channels: prose, code, numbers and markup,
/// because outlier channels are a property of the model far more than of the input.
pub const CALIBRATION_TEXT: &str = "The river town woke slowly. By seven the ferry had made its first crossing, \
carrying two delivery vans, a cyclist and a crate of oranges labelled 14 kg. \
Mrs. Okafor counted the change twice — 3.50, 4.75, 12.00 — before opening the café.\n\n\
def merge_sorted(a, b):\n    out, i, j = [], 0, 0\n    while i < len(a) and j < len(b):\n        \
if a[i] <= b[j]:\n            out.append(a[i]); i += 1\n        else:\n            out.append(b[j]); j += 1\n    \
return out + a[i:] + b[j:]\n\n\
Q: Why does ice float on water?\nA: Because water expands when it freezes, so ice is less dense than liquid water.\n\
<html><body><p class=\"note\">Total: $1,299.99 (incl. 20% VAT)</p></body></html>\n\
SELECT name, COUNT(*) FROM orders WHERE created_at > '2024-01-01' GROUP BY name;\n\
In 1687 Newton published the Principia; its third law states that every action has an equal and opposite reaction. \
Über den Wolken ist die Freiheit grenzenlos. 東京は日本の首都です。 🚀✓";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tokens_outliers_are_its_largest_channels_far_above_its_rms() {
        let mut x = vec![0.5f32; 512];
        x[7] = -40.0;
        x[300] = 25.0;
        x[100] = 5.0; // 5 times the RMS of about 1: not an outlier
        let mut chosen = [0; MAX_TOKEN_OUTLIERS];
        let count = token_outliers(&x, &mut chosen);
        assert_eq!(&chosen[..count], &[7, 300]);
        // Over the cap the largest are kept, in ascending order (25 is now under 6 RMS).
        for (i, c) in [11, 90, 200, 201, 400, 450, 500, 510, 511]
            .iter()
            .enumerate()
        {
            x[*c] = 30.0 + i as f32;
        }
        x[511] = 30.0;
        let count = token_outliers(&x, &mut chosen);
        assert_eq!(&chosen[..count], &[7, 90, 200, 201, 400, 450, 500, 510]);
        // A row with a non-finite value, or nothing standing out, has none.
        x[3] = f32::INFINITY;
        assert_eq!(token_outliers(&x, &mut chosen), 0);
        assert_eq!(token_outliers(&[1.0; 64], &mut chosen), 0);
        assert_eq!(token_outliers(&[], &mut chosen), 0);
    }

    #[test]
    fn outliers_are_the_few_channels_far_above_the_median() {
        let n = 16 * MAX_OUTLIER_FRACTION; // room for 16 outliers
        let mut peaks = vec![1.0; n];
        peaks[3] = 50.0;
        peaks[40] = OUTLIER_RATIO + 1.0;
        peaks[10] = OUTLIER_RATIO - 1.0; // not far enough above the median
        assert_eq!(select_outliers(&peaks), vec![3, 40]);
        // Over the cap, the largest win.
        let mut few = vec![1.0; MAX_OUTLIER_FRACTION];
        few[5] = 10.0;
        few[9] = 100.0;
        assert_eq!(select_outliers(&few), vec![9]);
    }

    #[test]
    fn outlier_split_equals_plain_product_up_to_quantisation() {
        let (n, k, rows) = (24, 64, 3);
        let w = Matrix {
            data: (0..n * k)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0)
                .collect(),
            n_rows: n,
            n_cols: k,
        };
        let mut x: Vec<f32> = (0..rows * k)
            .map(|i| ((i * 13 % 29) as f32 - 14.0) / 14.0)
            .collect();
        for r in 0..rows {
            x[r * k + 5] = 300.0 * (r as f32 + 1.0); // a massive channel
        }
        let pool = ThreadPool::new(1).unwrap();
        let mut want = vec![0.0; rows * n];
        pyramid_kernels::matmul::matmul(&pool, &x, &w.data, &mut want, rows, k, n);
        let mut s = LinearScratch::default();
        let err = |lin: &Linear, s: &mut LinearScratch| {
            let mut got = vec![0.0; rows * n];
            lin.forward(&pool, &x, None, &mut got, rows, s);
            got.iter()
                .zip(&want)
                .map(|(g, w)| (g - w).abs())
                .fold(0.0, f32::max)
        };
        let quant = |bits, outliers| {
            Linear::Quant(Box::new(QuantLinear::quantize(w.clone(), bits, outliers)))
        };
        for bits in [WeightBits::Eight, WeightBits::Four] {
            let plain = err(&quant(bits, vec![]), &mut s);
            let split = err(&quant(bits, vec![5]), &mut s);
            assert!(
                split * 5.0 < plain,
                "{bits:?}: outlier split error {split} vs plain {plain}"
            );
        }
        // bf16 keeps 8 significant bits: each product is off by at most 2^-8 of itself.
        let bound = (0..rows)
            .flat_map(|r| (0..n).map(move |j| (r, j)))
            .map(|(r, j)| {
                (0..k)
                    .map(|c| (x[r * k + c] * w.data[j * k + c]).abs())
                    .sum::<f32>()
            })
            .fold(0.0, f32::max)
            / 256.0;
        let bf16_err = err(&Linear::to_bf16(&w), &mut s);
        assert!(bf16_err <= bound, "bf16 error {bf16_err} beyond {bound}");
    }
}
