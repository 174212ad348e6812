//! Model architectures read from GGUF or a Hugging Face directory, and the f32 reference
//! forward pass.
//!
//! - [`Checkpoint`]: a GGUF file or a Hugging Face directory (`config.json`,
//!   `*.safetensors`), both offering GGUF's tensors ([`TensorSource`]).
//! - [`ModelConfig`]: hyper-parameters (Llama, Qwen2, Qwen3, SmolLM3, Phi-3 and Gemma 3 families).
//! - [`ModelWeights`]: typed per-layer weights, dequantised to f32 at load.
//! - [`Model::forward`]: prefill (many tokens in matrix form) and decode (one token) share
//!   one readable code path; every fast path will be checked against it.
//! - [`KvCache`]: `[n_layer][n_head_kv][pos][head_dim]` keys and values.
//!
//! Invariant: a forward pass of tokens at positions `p..p+n` appends exactly `n`
//! positions to the cache, and its result depends only on the tokens at `0..p+n`.

mod attention;
mod block;
mod checkpoint;
mod config;
mod error;
mod file_weights;
mod forward;
mod hf;
mod kv_cache;
pub mod linear;
mod pooling;
mod rope_scaling;
pub mod synthetic;
mod weights;

use std::path::Path;

use pyramid_gguf::GgufFile;

pub use attention::Attention;
pub use block::{BlockPart, Projection};
pub use checkpoint::{Checkpoint, TensorSource};
pub use config::{Activation, Architecture, Experts, ModelConfig, SlidingWindow};
pub use error::{ModelError, Result};
use forward::Layers;
pub use forward::{LogitsFor, Pooled, Scratch, Segment, MAX_PASS_TOKENS};
pub use hf::HfCheckpoint;
pub use kv_cache::{KvCache, KvFootprint, KvType};
pub use linear::{Calibration, Linear, QuantLinear, WeightBits};
pub use pooling::Pooling;
pub use weights::{Embedding, Ffn, GatedFfn, LayerWeights, Matrix, ModelWeights, RoutedFfn};

/// How projection weights are stored and multiplied, chosen at load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Precision {
    /// The reference: every weight dequantised to f32.
    F32,
    /// bf16 weights widened to f32 in the kernel: half the bytes, f32 arithmetic.
    Bf16,
    /// W8A8: INT8 weights and activations (quantised per token at run time), one scale per
    /// block of 32 along `k`.
    Int8,
    /// W4A8: 4-bit weights per group of 32, activations INT8 per token and block of 32.
    Int4,
    /// The weights exactly as a GGUF file stores them: Q8_0 blocks as W8A8, Q4_0 and Q4_1
    /// as W4A8, float tensors in their float form; other block types are refused. A
    /// Hugging Face directory's tensors are floats, so `file` is their dtype there.
    File,
}

impl Precision {
    pub const ALL: [Precision; 5] = [
        Precision::F32,
        Precision::Bf16,
        Precision::Int8,
        Precision::Int4,
        Precision::File,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
            Precision::Int8 => "int8",
            Precision::Int4 => "int4",
            Precision::File => "file",
        }
    }

    /// Whether a load calibrates outlier channels: the precisions that quantise weights
    /// and activations. Not `File`, whose weights are the file's own.
    pub fn calibrates(self) -> bool {
        matches!(self, Precision::Int8 | Precision::Int4)
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.name() == s)
    }
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, Clone)]
pub struct Model {
    pub config: ModelConfig,
    pub weights: ModelWeights,
    pub precision: Precision,
    /// The products attention runs in; [`Attention::Exact`] unless set after load.
    pub attention: Attention,
    rope_inv_freq: Vec<f32>,
    /// Sliding-window layers' frequencies (empty without such layers).
    rope_inv_freq_local: Vec<f32>,
}

impl Model {
    /// The f32 reference model.
    pub fn from_gguf(file: &GgufFile) -> Result<Self> {
        Self::from_gguf_as(file, Precision::F32, None)
    }

    /// The model in `precision`, without calibration (INT8 without outlier channels).
    pub fn from_gguf_with(file: &GgufFile, precision: Precision) -> Result<Self> {
        Self::from_gguf_as(file, precision, None)
    }

    /// The model loaded straight into `precision` tensor by tensor, never whole in f32;
    /// integer projections split off the outlier channels `calibration` found.
    pub fn from_gguf_as(
        file: &GgufFile,
        precision: Precision,
        calibration: Option<&Calibration>,
    ) -> Result<Self> {
        Self::from_tensors(ModelConfig::from_gguf(file)?, file, precision, calibration)
    }

    /// [`Model::from_gguf_as`] of any checkpoint.
    pub fn from_checkpoint(
        checkpoint: &Checkpoint,
        precision: Precision,
        calibration: Option<&Calibration>,
    ) -> Result<Self> {
        let config = checkpoint.config().clone();
        Self::from_tensors(config, checkpoint.tensors(), precision, calibration)
    }

    fn from_tensors(
        config: ModelConfig,
        tensors: &dyn TensorSource,
        precision: Precision,
        calibration: Option<&Calibration>,
    ) -> Result<Self> {
        let weights = ModelWeights::load_as(tensors, &config, precision, calibration)?;
        Ok(Self::assemble(config, weights, precision))
    }

    fn assemble(config: ModelConfig, weights: ModelWeights, precision: Precision) -> Self {
        Self {
            rope_inv_freq: config.rope_frequencies(false),
            rope_inv_freq_local: config.rope_frequencies(true),
            config,
            weights,
            precision,
            attention: Attention::Exact,
        }
    }

    /// Runs `tokens` through the model and records every projection input's per-channel
    /// peaks, which choose the INT8 outlier channels. Tokens beyond the model's context
    /// are ignored.
    pub fn calibrate(
        &self,
        pool: &pyramid_kernels::ThreadPool,
        tokens: &[u32],
    ) -> Result<Calibration> {
        self.calibrate_with(pool, tokens, Layers::Resident)
    }

    /// [`Model::calibrate`] of the f32 model in `file` without loading it: each layer's
    /// f32 weights are read when the pass reaches the layer and dropped after it, so a
    /// first INT8 load peaks near the INT8 model's own size rather than at the f32
    /// model's, four times that. The peaks are those of the resident f32 model exactly.
    pub fn calibrate_streamed(
        checkpoint: &Checkpoint,
        pool: &pyramid_kernels::ThreadPool,
        tokens: &[u32],
    ) -> Result<Calibration> {
        let file = checkpoint.tensors();
        let weights = ModelWeights::load_without_layers(file, checkpoint.config())?;
        let model = Self::assemble(checkpoint.config().clone(), weights, Precision::F32);
        let load = |li| weights::load_layer(file, &model.config, li, Precision::F32, None);
        model.calibrate_with(pool, tokens, Layers::Loaded(&load))
    }

    fn calibrate_with(
        &self,
        pool: &pyramid_kernels::ThreadPool,
        tokens: &[u32],
        layers: Layers<'_>,
    ) -> Result<Calibration> {
        let tokens = &tokens[..tokens.len().min(self.config.n_ctx_train)];
        let mut kv = self.new_kv_cache(tokens.len());
        let mut scratch = Scratch::default();
        scratch.calibration = Some(Calibration::new(self.config.n_layer));
        self.run_pass(
            pool,
            &mut [Segment::new(tokens, &mut kv)],
            &mut scratch,
            LogitsFor::Last,
            layers,
        )?;
        Ok(scratch.calibration.take().expect("set above"))
    }

    /// Converts an f32 model's projections to `precision`.
    pub fn into_precision(self, precision: Precision, calibration: Option<&Calibration>) -> Self {
        Self {
            weights: self.weights.into_precision(precision, calibration),
            precision,
            ..self
        }
    }

    /// The f32 model of a GGUF file or a Hugging Face directory.
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        Self::from_checkpoint(&Checkpoint::open(path)?, Precision::F32, None)
    }

    /// A cache able to hold `capacity` positions (clamped to the model's context).
    pub fn new_kv_cache(&self, capacity: usize) -> KvCache {
        self.new_kv_cache_of(capacity, KvType::F32)
    }

    /// As [`Model::new_kv_cache`], storing keys and values as `kind`.
    pub fn new_kv_cache_of(&self, capacity: usize, kind: KvType) -> KvCache {
        KvCache::new(&self.config, capacity.min(self.config.n_ctx_train), kind)
    }
}
