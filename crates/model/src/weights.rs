//! Typed layer weights, read from a checkpoint (GGUF, or a Hugging Face directory under
//! GGUF's names) and converted to the load precision one tensor at a time.
//!
//! Matrices keep GGUF's layout: `[n_out, n_in]` row-major (GGML dims `[n_in, n_out]`),
//! which is what [`pyramid_kernels::matmul`] consumes.
//!
//! Loading streams: each tensor is dequantised to f32, converted, and its mapped pages are
//! released before the next, so an INT8 model never holds its f32 weights (four times its
//! size) nor the file's pages at once. The output projection goes first, while nothing
//! else is resident: its f32 form is the largest transient of the load. At
//! [`Precision::File`] block types skip the f32 form ([`crate::file_weights`]).

use crate::checkpoint::TensorSource;
use crate::config::{Architecture, ModelConfig};
use crate::file_weights;
use crate::linear::{Calibration, Linear, QuantLinear, Site, WeightBits};
use crate::{ModelError, Precision, Result};

/// A row-major matrix `[n_rows, n_cols]`.
#[derive(Debug, Clone)]
pub struct Matrix {
    pub data: Vec<f32>,
    pub n_rows: usize,
    pub n_cols: usize,
}

impl Matrix {
    /// Consecutive blocks of rows, `rows[i]` each (a fused projection's parts).
    pub(crate) fn split_rows(self, rows: &[usize]) -> Vec<Matrix> {
        let mut at = 0;
        rows.iter()
            .map(|&n| {
                let data = self.data[at * self.n_cols..(at + n) * self.n_cols].to_vec();
                at += n;
                Matrix {
                    data,
                    n_rows: n,
                    n_cols: self.n_cols,
                }
            })
            .collect()
    }

    fn empty() -> Self {
        Self {
            data: Vec::new(),
            n_rows: 0,
            n_cols: 0,
        }
    }

    pub fn row(&self, idx: usize) -> &[f32] {
        &self.data[idx * self.n_cols..(idx + 1) * self.n_cols]
    }
}

#[derive(Debug, Clone)]
pub struct LayerWeights {
    pub attn_norm: Vec<f32>,  // [n_embd]
    pub wq: Linear,           // [q_dim, n_embd]
    pub wk: Linear,           // [kv_dim, n_embd]
    pub wv: Linear,           // [kv_dim, n_embd]
    pub bq: Option<Vec<f32>>, // [q_dim] (Qwen2)
    pub bk: Option<Vec<f32>>, // [kv_dim] (Qwen2)
    pub bv: Option<Vec<f32>>, // [kv_dim] (Qwen2)
    pub wo: Linear,           // [n_embd, q_dim]
    pub ffn_norm: Vec<f32>,   // [n_embd]
    pub ffn: Ffn,
    /// Gemma 3: RMS norms of each query and key head before RoPE, `[head_dim]`.
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    /// Gemma 3: RMS norms of the attention and FFN outputs before the residual add.
    pub post_attn_norm: Option<Vec<f32>>, // [n_embd]
    pub post_ffn_norm: Option<Vec<f32>>, // [n_embd]
}

impl LayerWeights {
    /// The dense feed-forward block, `None` for one of routed experts.
    pub fn dense_ffn(&self) -> Option<&GatedFfn> {
        match &self.ffn {
            Ffn::Dense(ffn) => Some(ffn),
            Ffn::Routed(_) => None,
        }
    }
}

/// A gated feed-forward network: `down(act(gate(x)) · up(x))`.
#[derive(Debug, Clone)]
pub struct GatedFfn {
    pub gate: Linear, // [n_ff, n_embd]
    pub up: Linear,   // [n_ff, n_embd]
    pub down: Linear, // [n_embd, n_ff]
}

/// A layer's feed-forward block.
// One per layer, built once: the dense variant's size is of no consequence.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum Ffn {
    Dense(GatedFfn),
    /// Routed experts ([`crate::Experts`]): the router in f32, so that quantising it can
    /// never change which experts a token goes to, and each expert a [`GatedFfn`] whose
    /// integer projections share their site's outlier channels, so one expert's rows
    /// are prepared like any other's.
    Routed(RoutedFfn),
}

#[derive(Debug, Clone)]
pub struct RoutedFfn {
    pub router: Linear, // [n_expert, n_embd], f32
    pub experts: Vec<GatedFfn>,
    /// Experts each token runs (top-k), at most `experts.len()`.
    pub n_used: usize,
    /// Whether the chosen experts' weights are renormalised to sum to 1.
    pub normalize: bool,
}

impl RoutedFfn {
    /// Each expert's hidden size.
    pub fn n_ff(&self) -> usize {
        self.experts.first().map_or(0, |x| x.gate.n_out())
    }
}

/// Where token embeddings are read from.
#[derive(Debug, Clone)]
pub enum Embedding {
    /// The GGUF's own table, `[n_vocab, n_embd]`, in the precision `embedding_table`
    /// picks: never an f32 copy beside an integer model.
    Table(Box<Linear>),
    /// The rows of the output projection, which a tied model shares with its embedding:
    /// one copy of the vocabulary in the load precision instead of an f32 table beside it.
    Output,
}

#[derive(Debug, Clone)]
pub struct ModelWeights {
    pub token_embd: Embedding,
    pub layers: Vec<LayerWeights>,
    pub output_norm: Vec<f32>, // [n_embd]
    /// The output projection; the embedding table itself when tied.
    pub output: Linear, // [n_vocab, n_embd]
}

impl ModelWeights {
    /// Loads every weight in f32 (the reference).
    pub fn load(file: &dyn TensorSource, cfg: &ModelConfig) -> Result<Self> {
        Self::load_as(file, cfg, Precision::F32, None)
    }

    /// Loads the weights straight into `precision`, tensor by tensor; with a calibration,
    /// integer projections keep their inputs' outlier channels in f32.
    pub fn load_as(
        file: &dyn TensorSource,
        cfg: &ModelConfig,
        precision: Precision,
        calibration: Option<&Calibration>,
    ) -> Result<Self> {
        let (token_embd, output) = load_vocabulary(file, cfg, precision, precision, calibration)?;
        let layers = (0..cfg.n_layer)
            .map(|i| load_layer(file, cfg, i, precision, calibration))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            token_embd,
            output,
            layers,
            output_norm: vector(file, "output_norm.weight", cfg.n_embd)?,
        })
    }

    /// Everything but the layers, for a pass that loads each layer when it reaches it
    /// ([`crate::Model::calibrate_streamed`]): the embedding exact in f32, and an untied
    /// output projection in INT8, since that pass records the projection's input and
    /// never uses its result.
    pub(crate) fn load_without_layers(file: &dyn TensorSource, cfg: &ModelConfig) -> Result<Self> {
        let output_precision = if is_tied(file) {
            Precision::F32
        } else {
            Precision::Int8
        };
        let (token_embd, output) =
            load_vocabulary(file, cfg, output_precision, Precision::F32, None)?;
        Ok(Self {
            token_embd,
            output,
            layers: Vec::new(),
            output_norm: vector(file, "output_norm.weight", cfg.n_embd)?,
        })
    }

    /// Converts the f32 projections to `precision`; with a calibration, integer projections
    /// keep their inputs' outlier channels in f32. [`Precision::File`] converts nothing:
    /// the file's own blocks are gone once loaded in f32.
    pub fn into_precision(
        mut self,
        precision: Precision,
        calibration: Option<&Calibration>,
    ) -> Self {
        if matches!(precision, Precision::F32 | Precision::File) {
            return self;
        }
        let to_precision = |lin: &mut Linear, layer: usize, site: Site| {
            if let Linear::F32(m) = lin {
                let m = std::mem::replace(m, Matrix::empty());
                *lin = convert(m, precision, calibration, layer, site);
            }
        };
        if let Embedding::Table(table) = &mut self.token_embd {
            if let Linear::F32(m) = table.as_mut() {
                let m = std::mem::replace(m, Matrix::empty());
                self.token_embd = embedding_table(m, precision);
            }
        }
        for (i, l) in self.layers.iter_mut().enumerate() {
            for w in [&mut l.wq, &mut l.wk, &mut l.wv] {
                to_precision(w, i, Site::AttnIn);
            }
            to_precision(&mut l.wo, i, Site::AttnOut);
            let ffns = match &mut l.ffn {
                Ffn::Dense(ffn) => std::slice::from_mut(ffn),
                Ffn::Routed(routed) => routed.experts.as_mut_slice(),
            };
            for ffn in ffns {
                for w in [&mut ffn.gate, &mut ffn.up] {
                    to_precision(w, i, Site::FfnIn);
                }
                to_precision(&mut ffn.down, i, Site::FfnDown);
            }
        }
        to_precision(&mut self.output, 0, Site::Head);
        self
    }

    /// Writes the embedding of `token` into `out` (`[n_embd]`).
    pub fn embed(&self, token: usize, out: &mut [f32]) {
        match &self.token_embd {
            Embedding::Table(table) => table.dequantize_row_into(token, out),
            Embedding::Output => self.output.dequantize_row_into(token, out),
        }
    }

    /// The f32 embedding table: the GGUF's own, or the output projection when tied.
    /// `None` once converted to another precision.
    pub fn embedding_table(&self) -> Option<&Matrix> {
        match (&self.token_embd, &self.output) {
            (Embedding::Table(table), _) => match table.as_ref() {
                Linear::F32(m) => Some(m),
                _ => None,
            },
            (Embedding::Output, Linear::F32(m)) => Some(m),
            _ => None,
        }
    }
}

/// Whether the model reads its embeddings from the output projection's rows.
fn is_tied(file: &dyn TensorSource) -> bool {
    !file.has_tensor("output.weight")
}

/// The embedding and the output projection (the output first, while nothing else is
/// resident: its f32 form is the largest transient of a load).
fn load_vocabulary(
    file: &dyn TensorSource,
    cfg: &ModelConfig,
    output_precision: Precision,
    embedding_precision: Precision,
    calibration: Option<&Calibration>,
) -> Result<(Embedding, Linear)> {
    let tied = is_tied(file);
    let output_name = if tied {
        "token_embd.weight"
    } else {
        "output.weight"
    };
    let output = projection(
        file,
        output_name,
        cfg.n_vocab,
        cfg.n_embd,
        output_precision,
        calibration,
        0,
        Site::Head,
    )?;
    let token_embd = if tied {
        Embedding::Output
    } else {
        match embedding_precision {
            // The file's table as it stores it, rows dequantised on lookup.
            Precision::File => Embedding::Table(Box::new(projection(
                file,
                "token_embd.weight",
                cfg.n_vocab,
                cfg.n_embd,
                Precision::File,
                None,
                0,
                Site::Head,
            )?)),
            other => embedding_table(
                streamed_matrix(file, "token_embd.weight", cfg.n_vocab, cfg.n_embd)?,
                other,
            ),
        }
    };
    Ok((token_embd, output))
}

/// Layer `i`'s weights in `precision`, integer projections split by `calibration`.
pub(crate) fn load_layer(
    file: &dyn TensorSource,
    cfg: &ModelConfig,
    i: usize,
    precision: Precision,
    calibration: Option<&Calibration>,
) -> Result<LayerWeights> {
    let (e, q, kv, ff) = (cfg.n_embd, cfg.q_dim(), cfg.kv_dim(), cfg.n_ff);
    let name = |t: &str| format!("blk.{i}.{t}");
    let has_bias = cfg.arch == Architecture::Qwen2;
    let bias = |t: &str, len: usize| -> Result<Option<Vec<f32>>> {
        let n = name(t);
        if has_bias || file.has_tensor(&n) {
            vector(file, &n, len).map(Some)
        } else {
            Ok(None)
        }
    };
    // Gemma 3's extra norms are required there and absent elsewhere; Qwen3 has the
    // per-head Q/K norms alone.
    let gemma = cfg.arch == Architecture::Gemma3;
    let gemma_norm = |t: &str, len: usize| -> Result<Option<Vec<f32>>> {
        gemma.then(|| vector(file, &name(t), len)).transpose()
    };
    let qk_norms = cfg.arch.has_qk_norms();
    let qk_norm = |t: &str| -> Result<Option<Vec<f32>>> {
        qk_norms
            .then(|| vector(file, &name(t), cfg.head_dim))
            .transpose()
    };
    let linear = |t: &str, n_rows, n_cols, site| -> Result<Linear> {
        projection(
            file,
            &name(t),
            n_rows,
            n_cols,
            precision,
            calibration,
            i,
            site,
        )
    };
    // Phi-3 fuses Q/K/V into one projection and gate/up into another: split by rows.
    let fused = |t: &str, parts: &[usize], site| -> Result<Vec<Linear>> {
        if precision == Precision::File {
            return file_weights::projections(file, &name(t), parts, e);
        }
        let m = streamed_matrix(file, &name(t), parts.iter().sum(), e)?;
        Ok(m.split_rows(parts)
            .into_iter()
            .map(|m| convert(m, precision, calibration, i, site))
            .collect())
    };
    let phi3 = cfg.arch == Architecture::Phi3;
    let [wq, wk, wv]: [Linear; 3] = if phi3 {
        fused("attn_qkv.weight", &[q, kv, kv], Site::AttnIn)?
            .try_into()
            .map_err(|_| ModelError::BadConfig("attn_qkv splits in three".to_string()))?
    } else {
        [
            linear("attn_q.weight", q, e, Site::AttnIn)?,
            linear("attn_k.weight", kv, e, Site::AttnIn)?,
            linear("attn_v.weight", kv, e, Site::AttnIn)?,
        ]
    };
    let ffn = match cfg.layer_experts(i) {
        Some(experts) => Ffn::Routed(RoutedFfn {
            // The router stays f32 (it is a few thousand values per expert).
            router: Linear::F32(streamed_matrix(
                file,
                &name("ffn_gate_inp.weight"),
                experts.n_expert,
                e,
            )?),
            experts: load_experts(file, cfg, experts, i, precision, calibration)?,
            n_used: experts.n_used,
            normalize: experts.normalize,
        }),
        None => {
            let [gate, up]: [Linear; 2] = if phi3 {
                fused("ffn_up.weight", &[ff, ff], Site::FfnIn)?
                    .try_into()
                    .map_err(|_| ModelError::BadConfig("ffn_up splits in two".to_string()))?
            } else {
                [
                    linear("ffn_gate.weight", ff, e, Site::FfnIn)?,
                    linear("ffn_up.weight", ff, e, Site::FfnIn)?,
                ]
            };
            let down = linear("ffn_down.weight", e, ff, Site::FfnDown)?;
            Ffn::Dense(GatedFfn { gate, up, down })
        }
    };
    if precision == Precision::File {
        check_sites(i, [&wq, &wk, &wv], &ffn)?;
    }
    Ok(LayerWeights {
        attn_norm: vector(file, &name("attn_norm.weight"), e)?,
        wq,
        wk,
        wv,
        bq: bias("attn_q.bias", q)?,
        bk: bias("attn_k.bias", kv)?,
        bv: bias("attn_v.bias", kv)?,
        wo: linear("attn_output.weight", e, q, Site::AttnOut)?,
        ffn_norm: vector(file, &name("ffn_norm.weight"), e)?,
        ffn,
        q_norm: qk_norm("attn_q_norm.weight")?,
        k_norm: qk_norm("attn_k_norm.weight")?,
        post_attn_norm: gemma_norm("post_attention_norm.weight", e)?,
        post_ffn_norm: gemma_norm("post_ffw_norm.weight", e)?,
    })
}

/// Layer `i`'s experts in `precision`, one expert's matrix dequantised at a time; the
/// stacked tensors' pages are given back once every expert has been read from them.
fn load_experts(
    file: &dyn TensorSource,
    cfg: &ModelConfig,
    experts: &crate::Experts,
    i: usize,
    precision: Precision,
    calibration: Option<&Calibration>,
) -> Result<Vec<GatedFfn>> {
    let (e, ff, n) = (cfg.n_embd, experts.n_ff, experts.n_expert);
    let stacked = |t: &str| format!("blk.{i}.{t}");
    let (gate, up, down) = (
        stacked("ffn_gate_exps.weight"),
        stacked("ffn_up_exps.weight"),
        stacked("ffn_down_exps.weight"),
    );
    let expert = |name: &str, x: usize, n_rows: usize, n_cols: usize, site| -> Result<Linear> {
        if precision == Precision::File {
            return file_weights::expert(file, name, x, [n_rows, n_cols, n]);
        }
        let m = Matrix {
            data: file.expert_f32(name, x, [n_rows, n_cols, n])?,
            n_rows,
            n_cols,
        };
        Ok(convert(m, precision, calibration, i, site))
    };
    let loaded = (0..n)
        .map(|x| {
            Ok(GatedFfn {
                gate: expert(&gate, x, ff, e, Site::FfnIn)?,
                up: expert(&up, x, ff, e, Site::FfnIn)?,
                down: expert(&down, x, e, ff, Site::FfnDown)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    for name in [gate, up, down] {
        file.release(&name);
    }
    Ok(loaded)
}

/// An untied embedding table for a model in `precision`: INT8 for both integer
/// precisions (a lookup reads one row, so the table's bytes cost memory, not speed).
fn embedding_table(m: Matrix, precision: Precision) -> Embedding {
    let table_precision = match precision {
        Precision::Int4 => Precision::Int8,
        other => other,
    };
    Embedding::Table(Box::new(convert(m, table_precision, None, 0, Site::Head)))
}

/// A projection in `precision`, integer ones with their calibrated outlier channels.
fn convert(
    m: Matrix,
    precision: Precision,
    calibration: Option<&Calibration>,
    layer: usize,
    site: Site,
) -> Linear {
    let outliers = || {
        calibration
            .map(|c| c.outliers(layer, site))
            .unwrap_or_default()
    };
    match precision {
        // `File`'s loader reads block types itself: what comes here is a matrix already
        // in f32, kept as it is.
        Precision::F32 | Precision::File => Linear::F32(m),
        Precision::Bf16 => Linear::to_bf16(&m),
        Precision::Int8 => Linear::Quant(Box::new(QuantLinear::quantize(
            m,
            WeightBits::Eight,
            outliers(),
        ))),
        Precision::Int4 => Linear::Quant(Box::new(QuantLinear::quantize(
            m,
            WeightBits::Four,
            outliers(),
        ))),
    }
}

/// Projection `name` (`[n_rows, n_cols]`) in `precision`: at [`Precision::File`] as the
/// file stores it, otherwise dequantised and converted.
#[allow(clippy::too_many_arguments)]
fn projection(
    file: &dyn TensorSource,
    name: &str,
    n_rows: usize,
    n_cols: usize,
    precision: Precision,
    calibration: Option<&Calibration>,
    layer: usize,
    site: Site,
) -> Result<Linear> {
    if precision == Precision::File {
        let mut parts = file_weights::projections(file, name, &[n_rows], n_cols)?;
        return parts
            .pop()
            .ok_or_else(|| ModelError::MissingTensor(name.to_string()));
    }
    let m = streamed_matrix(file, name, n_rows, n_cols)?;
    Ok(convert(m, precision, calibration, layer, site))
}

/// At [`Precision::File`], the projections of each input site of layer `i` are all float
/// or all blocks ([`file_weights::check_site`]).
fn check_sites(i: usize, [wq, wk, wv]: [&Linear; 3], ffn: &Ffn) -> Result<()> {
    file_weights::check_site(
        i,
        &[
            ("attn_q.weight", wq),
            ("attn_k.weight", wk),
            ("attn_v.weight", wv),
        ],
    )?;
    let ffns = match ffn {
        Ffn::Dense(ffn) => std::slice::from_ref(ffn),
        Ffn::Routed(routed) => routed.experts.as_slice(),
    };
    let ins: Vec<_> = ffns
        .iter()
        .flat_map(|f| [("ffn_gate.weight", &f.gate), ("ffn_up.weight", &f.up)])
        .collect();
    let downs: Vec<_> = ffns.iter().map(|f| ("ffn_down.weight", &f.down)).collect();
    file_weights::check_site(i, &ins)?;
    file_weights::check_site(i, &downs)
}

/// A matrix dequantised from the file, whose mapped pages are then given back.
pub(crate) fn streamed_matrix(
    file: &dyn TensorSource,
    name: &str,
    n_rows: usize,
    n_cols: usize,
) -> Result<Matrix> {
    let m = matrix(file, name, n_rows, n_cols)?;
    file.release(name);
    Ok(m)
}

pub(crate) fn check_dims(file: &dyn TensorSource, name: &str, expected: &[u64]) -> Result<()> {
    let found = file.tensor_dims(name)?;
    if found != expected {
        return Err(ModelError::TensorShape {
            name: name.to_string(),
            expected: expected.to_vec(),
            found,
        });
    }
    Ok(())
}

fn matrix(file: &dyn TensorSource, name: &str, n_rows: usize, n_cols: usize) -> Result<Matrix> {
    check_dims(file, name, &[n_cols as u64, n_rows as u64])?;
    Ok(Matrix {
        data: file.tensor_f32(name)?,
        n_rows,
        n_cols,
    })
}

fn vector(file: &dyn TensorSource, name: &str, len: usize) -> Result<Vec<f32>> {
    check_dims(file, name, &[len as u64])?;
    file.tensor_f32(name)
}
