//! Hyper-parameters read from GGUF metadata.

use pyramid_gguf::{GgufFile, Metadata};
use pyramid_kernels::ops::{rope_inv_freq, RopeStyle};

use crate::rope_scaling::{RopeScaling, Yarn};
use crate::{ModelError, Pooling, Result};

/// The tensor of per-frequency RoPE factors Llama 3.x GGUF files carry.
const LLAMA3_ROPE_FACTORS: &str = "rope_freqs.weight";
/// LongRoPE's factors, as llama.cpp's converter stores them (Phi-3.5, Phi-4-mini).
const LONGROPE_LONG: &str = "rope_factors_long.weight";
const LONGROPE_SHORT: &str = "rope_factors_short.weight";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    Llama,
    Qwen2,
    /// Gemma 3 (text): scaled embeddings, QK-norm, norms after attention and FFN as well as
    /// before, GeGLU, and sliding-window attention on five of every six layers.
    Gemma3,
    /// Qwen3 (dense): Qwen2 without Q/K/V biases, with each query and key head RMS-normed
    /// before RoPE, and a head size set apart from the hidden size.
    Qwen3,
    /// SmolLM3: Llama's layout, with no RoPE in every fourth layer (NoPE).
    SmolLM3,
    /// Phi-3.5 and Phi-4-mini: fused Q/K/V and gate/up projections, RoPE on part of each
    /// head, LongRoPE.
    Phi3,
    /// Qwen3-MoE: Qwen3's attention, and a feed-forward block of routed experts
    /// ([`Experts`]).
    Qwen3Moe,
}

/// llama.cpp's SmolLM3: the layers `l` with `(l + 1) % 4 == 0` apply no RoPE.
const SMOLLM3_NO_ROPE_EVERY: usize = 4;

impl Architecture {
    pub fn from_name(name: &str) -> Result<Self> {
        match name {
            "llama" => Ok(Self::Llama),
            "qwen2" => Ok(Self::Qwen2),
            "gemma3" => Ok(Self::Gemma3),
            "qwen3" => Ok(Self::Qwen3),
            "smollm3" => Ok(Self::SmolLM3),
            "phi3" => Ok(Self::Phi3),
            "qwen3moe" => Ok(Self::Qwen3Moe),
            other => Err(ModelError::UnsupportedArchitecture(other.to_string())),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Qwen2 => "qwen2",
            Self::Gemma3 => "gemma3",
            Self::Qwen3 => "qwen3",
            Self::SmolLM3 => "smollm3",
            Self::Phi3 => "phi3",
            Self::Qwen3Moe => "qwen3moe",
        }
    }

    /// Llama GGUFs store Q/K rows permuted for interleaved pairs; Qwen and Gemma keep NeoX
    /// halves.
    pub fn rope_style(self) -> RopeStyle {
        match self {
            Self::Llama | Self::SmolLM3 => RopeStyle::Interleaved,
            Self::Qwen2 | Self::Gemma3 | Self::Qwen3 | Self::Phi3 | Self::Qwen3Moe => {
                RopeStyle::Neox
            }
        }
    }

    /// Whether each query and key head is RMS-normed before RoPE.
    pub fn has_qk_norms(self) -> bool {
        matches!(self, Self::Gemma3 | Self::Qwen3 | Self::Qwen3Moe)
    }
}

/// A feed-forward block of routed experts, as transformers' `Qwen3MoeSparseMoeBlock`: a
/// router scores every expert per token, the `n_used` best (by softmax probability) run
/// as gated FFNs of `n_ff` each, and their outputs are summed weighted by those
/// probabilities, renormalised to sum to 1 when `normalize` (`norm_topk_prob`).
#[derive(Debug, Clone, PartialEq)]
pub struct Experts {
    pub n_expert: usize,
    pub n_used: usize,
    pub n_ff: usize,
    pub normalize: bool,
    /// Layers with a dense FFN of [`ModelConfig::n_ff`] instead (transformers'
    /// `mlp_only_layers` and `decoder_sparse_step`), ascending.
    pub dense_layers: Vec<usize>,
}

impl Experts {
    fn validate(&self) -> Result<()> {
        if self.n_ff == 0 || self.n_used == 0 || self.n_used > self.n_expert {
            return Err(ModelError::BadConfig(format!(
                "{} experts of {} routed {} per token: each must be positive, and no more \
                 used than there are",
                self.n_expert, self.n_ff, self.n_used
            )));
        }
        Ok(())
    }
}

/// The feed-forward block's gated activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// SwiGLU: `silu(gate) * up` (Llama, Qwen2).
    Silu,
    /// GeGLU: `gelu_tanh(gate) * up` (Gemma).
    GeluTanh,
}

/// Local attention: most layers see only the last `size` positions (their own included).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SlidingWindow {
    pub size: usize,
    /// Every `global_every`-th layer (counting from 1) attends to all positions instead.
    pub global_every: usize,
    /// The RoPE base of the local layers; global layers keep [`ModelConfig::rope_base`].
    pub rope_base: f32,
}

/// Gemma 3's fixed layout, which its GGUF metadata does not spell out (llama.cpp hard-codes
/// the same): one global layer in six, local layers on RoPE base 10,000.
const GEMMA3_GLOBAL_EVERY: usize = 6;
const GEMMA3_LOCAL_ROPE_BASE: f32 = 10_000.0;
/// Gemma 3 27B scales attention by `n_embd / n_head` rather than the head size.
const GEMMA3_27B_LAYERS: usize = 62;

#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub arch: Architecture,
    pub name: String,
    pub n_vocab: usize,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_ff: usize,
    /// Context length the model was trained for: the hard limit on positions.
    pub n_ctx_train: usize,
    pub n_rot: usize,
    pub rope_base: f32,
    pub rms_eps: f32,
    /// Token embeddings are multiplied by this (Gemma: `√n_embd`; 1 elsewhere).
    pub embedding_scale: f32,
    /// Attention scores are multiplied by this (`1/√head_dim` unless a family differs).
    pub attention_scale: f32,
    pub activation: Activation,
    pub sliding_window: Option<SlidingWindow>,
    /// Llama 3 RoPE scaling: each frequency is divided by its factor (`rope_freqs.weight`,
    /// one per rotated pair).
    pub rope_factors: Option<Vec<f32>>,
    /// What cos and sin are multiplied by (YaRN's and LongRoPE's attention factor): the
    /// rotated dims of queries and keys grow by it. 1 without such scaling.
    pub rope_scale: f32,
    /// How an embedding model pools its hidden states (GGUF's `pooling_type`,
    /// sentence-transformers' `1_Pooling`); `None` for a generative model.
    pub pooling: Option<Pooling>,
    /// Layers whose queries and keys are not rotated (SmolLM3's NoPE layers), ascending.
    pub no_rope_layers: Vec<usize>,
    /// The routed experts of a mixture-of-experts model's feed-forward blocks.
    pub experts: Option<Experts>,
}

/// The RoPE scaling a GGUF file names (`{arch}.rope.scaling.*`, as llama.cpp's converter
/// writes them): none, linear or YaRN (LongRoPE comes with its factor tensors); any other
/// is refused, never run wrong.
fn rope_scaling(md: &Metadata, key: &dyn Fn(&str) -> String) -> Result<Option<RopeScaling>> {
    let f32_key = |name: &str| md.opt(&key(name), |m, k| m.get_f32(k));
    let Some(kind) = md.opt(&key("rope.scaling.type"), |m, k| {
        m.get_str(k).map(str::to_owned)
    })?
    else {
        return Ok(None);
    };
    let factor = || {
        f32_key("rope.scaling.factor")?.ok_or_else(|| {
            ModelError::BadConfig(format!("RoPE scaling '{kind}' needs rope.scaling.factor"))
        })
    };
    let scaling = match kind.as_str() {
        // LongRoPE's factors are tensors, read with the file's (`ModelConfig::from_gguf`).
        "none" | "longrope" => return Ok(None),
        "linear" => RopeScaling::Linear { factor: factor()? },
        "yarn" => {
            if f32_key("rope.scaling.yarn_ext_factor")?.is_some_and(|f| f != 1.0) {
                return Err(ModelError::BadConfig(
                    "YaRN's yarn_ext_factor other than 1 is not implemented".to_string(),
                ));
            }
            // The original context is asked for first, as before the factor.
            let original_context = original_context(md, key, "YaRN")?;
            RopeScaling::Yarn(Yarn {
                factor: factor()?,
                original_context,
                beta_fast: f32_key("rope.scaling.yarn_beta_fast")?.unwrap_or(32.0),
                beta_slow: f32_key("rope.scaling.yarn_beta_slow")?.unwrap_or(1.0),
                attention_factor: f32_key("rope.scaling.yarn_attn_factor")?,
            })
        }
        other => {
            return Err(ModelError::BadConfig(format!(
                "RoPE scaling '{other}' (rope.scaling.type) is not implemented: this model's \
                 output would be wrong"
            )))
        }
    };
    scaling.checked().map(Some)
}

/// A mixture-of-experts file's routing (`{arch}.expert_*`, as llama.cpp's converter writes
/// it). llama.cpp runs every Qwen3-MoE layer sparse and renormalises the chosen experts'
/// weights unless `expert_weights_norm` says otherwise; experts in a family pyramid does
/// not know the routing of are refused.
fn gguf_experts(
    md: &Metadata,
    arch: Architecture,
    key: &dyn Fn(&str) -> String,
) -> Result<Option<Experts>> {
    let count = md.opt(&key("expert_count"), |m, k| m.get_usize(k))?;
    match (arch, count) {
        (Architecture::Qwen3Moe, Some(n_expert)) => Ok(Some(Experts {
            n_expert,
            n_used: md.get_usize(&key("expert_used_count"))?,
            n_ff: md.get_usize(&key("expert_feed_forward_length"))?,
            normalize: md
                .opt(&key("expert_weights_norm"), |m, k| m.get_bool(k))?
                .unwrap_or(true),
            dense_layers: Vec::new(),
        })),
        (Architecture::Qwen3Moe, None) => Err(ModelError::BadConfig(format!(
            "a qwen3moe file without {}",
            key("expert_count")
        ))),
        (_, Some(n)) if n > 0 => Err(ModelError::BadConfig(format!(
            "routed experts in a {} model are not implemented (Qwen3-MoE's are)",
            arch.name()
        ))),
        _ => Ok(None),
    }
}

/// The context a scaled RoPE was trained for (`rope.scaling.original_context_length`),
/// which `what` needs.
fn original_context(md: &Metadata, key: &dyn Fn(&str) -> String, what: &str) -> Result<f32> {
    let original = md.opt(&key("rope.scaling.original_context_length"), |m, k| {
        m.get_usize(k)
    })?;
    original.map(|n| n as f32).ok_or_else(|| {
        ModelError::BadConfig(format!("{what} needs rope.scaling.original_context_length"))
    })
}

impl ModelConfig {
    /// Takes on `scaling`: RoPE's frequencies divided as it says (over `n_rot` and
    /// `rope_base`, set before) and cos and sin multiplied by its attention factor.
    pub(crate) fn apply_rope_scaling(&mut self, scaling: &RopeScaling) -> Result<()> {
        self.rope_factors = Some(scaling.divisors(self.n_rot, self.rope_base)?);
        self.rope_scale = scaling.attention_factor();
        Ok(())
    }

    /// Reads the hyper-parameters; `n_vocab` comes from the token list (or embedding
    /// rows, checked against it when weights load).
    pub fn from_metadata(md: &Metadata) -> Result<Self> {
        let arch_name = md.get_str("general.architecture")?;
        let arch = Architecture::from_name(arch_name)?;
        let key = |k: &str| format!("{arch_name}.{k}");
        let n_embd = md.get_usize(&key("embedding_length"))?;
        let n_head = md.get_usize(&key("attention.head_count"))?;
        let n_head_kv = md
            .opt(&key("attention.head_count_kv"), |m, k| m.get_usize(k))?
            .unwrap_or(n_head);
        if n_head == 0 || n_head_kv == 0 || n_head % n_head_kv != 0 {
            return Err(ModelError::BadConfig(format!(
                "head_count {n_head} is not a positive multiple of head_count_kv {n_head_kv}"
            )));
        }
        if n_embd % n_head != 0 {
            return Err(ModelError::BadConfig(format!(
                "embedding_length {n_embd} is not divisible by head_count {n_head}"
            )));
        }
        let head_dim = md
            .opt(&key("attention.key_length"), |m, k| m.get_usize(k))?
            .unwrap_or(n_embd / n_head);
        let n_rot = md
            .opt(&key("rope.dimension_count"), |m, k| m.get_usize(k))?
            .unwrap_or(head_dim);
        let scaling = rope_scaling(md, &key)?;
        if let Some(w) = md
            .opt(&key("attention.sliding_window"), |m, k| m.get_usize(k))?
            .filter(|&w| w > 0 && arch != Architecture::Gemma3)
        {
            if w < md.get_usize(&key("context_length"))? {
                return Err(ModelError::BadConfig(format!(
                    "a sliding window of {w} on a {arch_name} model is not implemented"
                )));
            }
        }
        let sliding_window = match arch {
            Architecture::Gemma3 => Some(SlidingWindow {
                size: md.get_usize(&key("attention.sliding_window"))?,
                global_every: GEMMA3_GLOBAL_EVERY,
                rope_base: GEMMA3_LOCAL_ROPE_BASE,
            }),
            _ => None,
        };
        let n_layer = md.get_usize(&key("block_count"))?;
        let (embedding_scale, attention_scale, activation) = match arch {
            Architecture::Gemma3 => {
                let attention_dim = if n_layer == GEMMA3_27B_LAYERS {
                    n_embd / n_head
                } else {
                    head_dim
                };
                (
                    (n_embd as f32).sqrt(),
                    1.0 / (attention_dim as f32).sqrt(),
                    Activation::GeluTanh,
                )
            }
            _ => (1.0, 1.0 / (head_dim as f32).sqrt(), Activation::Silu),
        };
        let n_vocab = match md.get_array("tokenizer.ggml.tokens") {
            Ok(tokens) => tokens.len(),
            Err(_) => md.get_usize(&key("vocab_size"))?,
        };
        let mut cfg = Self {
            arch,
            name: md
                .opt("general.name", |m, k| m.get_str(k).map(str::to_owned))?
                .unwrap_or_else(|| arch_name.to_string()),
            n_vocab,
            n_embd,
            n_layer,
            n_head,
            n_head_kv,
            head_dim,
            n_ff: md.get_usize(&key("feed_forward_length"))?,
            n_ctx_train: md.get_usize(&key("context_length"))?,
            n_rot,
            rope_base: md
                .opt(&key("rope.freq_base"), |m, k| m.get_f32(k))?
                .unwrap_or(10_000.0),
            rms_eps: md.get_f32(&key("attention.layer_norm_rms_epsilon"))?,
            embedding_scale,
            attention_scale,
            activation,
            sliding_window,
            rope_factors: None,
            rope_scale: 1.0,
            pooling: md
                .opt(&key("pooling_type"), |m, k| m.get_usize(k))?
                .map(|v| Pooling::from_gguf(u32::try_from(v).unwrap_or(u32::MAX)))
                .transpose()?
                .flatten(),
            no_rope_layers: match arch {
                Architecture::SmolLM3 => (0..n_layer)
                    .filter(|l| (l + 1) % SMOLLM3_NO_ROPE_EVERY == 0)
                    .collect(),
                _ => Vec::new(),
            },
            experts: gguf_experts(md, arch, &key)?,
        };
        cfg.validate()?;
        if let Some(scaling) = scaling {
            cfg.apply_rope_scaling(&scaling)?;
        }
        Ok(cfg)
    }

    /// [`ModelConfig::from_metadata`] checked against the tensors `file` holds, before
    /// anything is sized from it: a header claiming more blocks than the file has would
    /// otherwise size per-layer state (calibration, caches) from a corrupt number. A file
    /// asking for a RoPE variant pyramid does not implement is refused, never run wrong;
    /// Llama 3's frequency factors are read from their tensor.
    pub fn from_gguf(file: &GgufFile) -> Result<Self> {
        let mut cfg = Self::from_metadata(file.metadata())?;
        let n_blocks = file
            .tensors()
            .iter()
            .filter_map(|t| {
                t.name
                    .strip_prefix("blk.")?
                    .split('.')
                    .next()?
                    .parse::<usize>()
                    .ok()
            })
            .map(|i| i + 1)
            .max()
            .unwrap_or(0);
        if file.tensor_info(LLAMA3_ROPE_FACTORS).is_ok() {
            // Llama 3.x files carry per-frequency RoPE factors instead of a scaling type.
            let n_pairs = cfg.n_rot / 2;
            let info = file.tensor_info(LLAMA3_ROPE_FACTORS)?;
            if info.dims != [n_pairs as u64] {
                return Err(ModelError::TensorShape {
                    name: LLAMA3_ROPE_FACTORS.to_string(),
                    expected: vec![n_pairs as u64],
                    found: info.dims.clone(),
                });
            }
            let factors = file.tensor_f32(LLAMA3_ROPE_FACTORS)?;
            if let Some(bad) = factors.iter().find(|f| !(f.is_finite() && **f > 0.0)) {
                return Err(ModelError::BadConfig(format!(
                    "{LLAMA3_ROPE_FACTORS} holds {bad}: RoPE factors must be positive numbers"
                )));
            }
            cfg.rope_factors = Some(factors);
        }
        if file.tensor_info(LONGROPE_LONG).is_ok() || file.tensor_info(LONGROPE_SHORT).is_ok() {
            let md = file.metadata();
            let key = |k: &str| format!("{}.{k}", cfg.arch.name());
            let scaling = RopeScaling::LongRope {
                short: file.tensor_f32(LONGROPE_SHORT)?,
                long: file.tensor_f32(LONGROPE_LONG)?,
                original_context: original_context(md, &key, "LongRoPE")?,
                context: cfg.n_ctx_train as f32,
                attention_factor: md.opt(&key("rope.scaling.attn_factor"), |m, k| m.get_f32(k))?,
            }
            .checked()?;
            cfg.apply_rope_scaling(&scaling)?;
        } else if file
            .metadata()
            .opt(&format!("{}.rope.scaling.type", cfg.arch.name()), |m, k| {
                m.get_str(k).map(|t| t == "longrope")
            })?
            == Some(true)
        {
            return Err(ModelError::BadConfig(format!(
                "LongRoPE without its factors ({LONGROPE_LONG}, {LONGROPE_SHORT})"
            )));
        }
        if n_blocks != cfg.n_layer {
            return Err(ModelError::BadConfig(format!(
                "block_count is {} but the file holds tensors for {n_blocks} blocks",
                cfg.n_layer
            )));
        }
        Ok(cfg)
    }

    /// Checks what every source of a configuration must satisfy before anything is sized
    /// from it.
    pub(crate) fn validate(&self) -> Result<()> {
        let max_head_dim = pyramid_kernels::ops::MAX_F16_HEAD_DIM;
        if self.head_dim > max_head_dim {
            return Err(ModelError::BadConfig(format!(
                "head_dim {} is beyond the supported {max_head_dim}",
                self.head_dim
            )));
        }
        if self.n_rot > self.head_dim || !self.n_rot.is_multiple_of(2) {
            return Err(ModelError::BadConfig(format!(
                "rope.dimension_count {} must be even and at most head_dim {}",
                self.n_rot, self.head_dim
            )));
        }
        if let Some(experts) = &self.experts {
            experts.validate()?;
        }
        if let Some(w) = self.sliding_window {
            if w.size == 0 || w.global_every == 0 || !(w.rope_base.is_finite() && w.rope_base > 0.0)
            {
                return Err(ModelError::BadConfig(format!(
                    "sliding window of {} positions, a global layer every {}, RoPE base {}: \
                     each must be positive",
                    w.size, w.global_every, w.rope_base
                )));
            }
        }
        for (what, v) in [
            ("the attention scale", self.attention_scale),
            ("the embedding scale", self.embedding_scale),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(ModelError::BadConfig(format!(
                    "{what} {v} must be a positive number"
                )));
            }
        }
        if !(self.rope_base.is_finite() && self.rope_base > 0.0) {
            return Err(ModelError::BadConfig(format!(
                "rope.freq_base {} must be a positive number",
                self.rope_base
            )));
        }
        if !(self.rms_eps.is_finite() && self.rms_eps > 0.0) {
            return Err(ModelError::BadConfig(format!(
                "attention.layer_norm_rms_epsilon {} must be a positive number",
                self.rms_eps
            )));
        }
        for (what, v) in [
            ("rope.dimension_count", self.n_rot),
            ("n_embd", self.n_embd),
            ("n_vocab", self.n_vocab),
            ("n_layer", self.n_layer),
            ("n_ff", self.n_ff),
            ("n_ctx_train", self.n_ctx_train),
            ("head_dim", self.head_dim),
        ] {
            if v == 0 {
                return Err(ModelError::BadConfig(format!("{what} is 0")));
            }
        }
        // The largest buffers (a full-context KV cache, the embedding table) must be
        // addressable; a file claiming more is corrupt, not merely large.
        let kv_elems = [
            self.n_layer,
            self.n_head_kv,
            self.head_dim,
            self.n_ctx_train,
            2,
        ]
        .into_iter()
        .try_fold(1usize, usize::checked_mul);
        let q_elems = self.n_head.checked_mul(self.head_dim);
        let embd_elems = self.n_vocab.checked_mul(self.n_embd);
        if kv_elems.is_none() || q_elems.is_none() || embd_elems.is_none() {
            return Err(ModelError::BadConfig(format!(
                "shapes overflow: {} layers, {} heads of {}, context {}, vocabulary {}",
                self.n_layer, self.n_head, self.head_dim, self.n_ctx_train, self.n_vocab
            )));
        }
        Ok(())
    }

    /// Whether layer `layer` rotates its queries and keys.
    pub fn layer_rotates(&self, layer: usize) -> bool {
        self.no_rope_layers.binary_search(&layer).is_err()
    }

    /// The routed experts of layer `layer`, `None` for a dense feed-forward block.
    pub fn layer_experts(&self, layer: usize) -> Option<&Experts> {
        self.experts
            .as_ref()
            .filter(|e| e.dense_layers.binary_search(&layer).is_err())
    }

    /// How many positions layer `layer` attends to, back from each query's own: `None`
    /// for all of them.
    pub fn layer_window(&self, layer: usize) -> Option<usize> {
        let w = self.sliding_window?;
        (!(layer + 1).is_multiple_of(w.global_every)).then_some(w.size)
    }

    /// RoPE inverse frequencies `base^(-2i/n_rot)` of the layers attending to every
    /// position, or with `local` of the sliding-window ones (empty if there are none),
    /// divided by Llama 3's factors where the file has them. Every backend rotates by these.
    pub fn rope_frequencies(&self, local: bool) -> Vec<f32> {
        let base = match (local, self.sliding_window) {
            (false, _) => self.rope_base,
            (true, Some(w)) => w.rope_base,
            (true, None) => return Vec::new(),
        };
        let mut inv_freq = rope_inv_freq(self.n_rot, base);
        if let Some(factors) = &self.rope_factors {
            for (f, d) in inv_freq.iter_mut().zip(factors) {
                *f /= d;
            }
        }
        inv_freq
    }

    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }
}
