//! Typed layer weights, dequantised to f32 at load.
//!
//! Matrices keep GGUF's layout: `[n_out, n_in]` row-major (GGML dims `[n_in, n_out]`),
//! which is what [`pyramid_kernels::matmul`] consumes.

use pyramid_gguf::GgufFile;

use crate::config::{Architecture, ModelConfig};
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
    pub w_gate: Linear,       // [n_ff, n_embd]
    pub w_up: Linear,         // [n_ff, n_embd]
    pub w_down: Linear,       // [n_embd, n_ff]
}

#[derive(Debug, Clone)]
pub struct ModelWeights {
    pub token_embd: Matrix, // [n_vocab, n_embd]
    pub layers: Vec<LayerWeights>,
    pub output_norm: Vec<f32>, // [n_embd]
    /// The output projection; a copy of `token_embd` (in the load precision) when tied.
    pub output: Linear, // [n_vocab, n_embd]
}

impl ModelWeights {
    /// Loads every weight in f32 (the reference); see [`ModelWeights::into_precision`].
    pub fn load(file: &GgufFile, cfg: &ModelConfig) -> Result<Self> {
        let (e, q, kv, ff) = (cfg.n_embd, cfg.q_dim(), cfg.kv_dim(), cfg.n_ff);
        let layers = (0..cfg.n_layer)
            .map(|i| {
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
                let linear = |t: &str, n_rows, n_cols| -> Result<Linear> {
                    Ok(Linear::F32(matrix(file, &name(t), n_rows, n_cols)?))
                };
                Ok(LayerWeights {
                    attn_norm: vector(file, &name("attn_norm.weight"), e)?,
                    wq: linear("attn_q.weight", q, e)?,
                    wk: linear("attn_k.weight", kv, e)?,
                    wv: linear("attn_v.weight", kv, e)?,
                    bq: bias("attn_q.bias", q)?,
                    bk: bias("attn_k.bias", kv)?,
                    bv: bias("attn_v.bias", kv)?,
                    wo: linear("attn_output.weight", e, q)?,
                    ffn_norm: vector(file, &name("ffn_norm.weight"), e)?,
                    w_gate: linear("ffn_gate.weight", ff, e)?,
                    w_up: linear("ffn_up.weight", ff, e)?,
                    w_down: linear("ffn_down.weight", e, ff)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let token_embd = matrix(file, "token_embd.weight", cfg.n_vocab, e)?;
        let output = if file.has_tensor("output.weight") {
            matrix(file, "output.weight", cfg.n_vocab, e)?
        } else {
            token_embd.clone()
        };
        Ok(Self {
            token_embd,
            output: Linear::F32(output),
            layers,
            output_norm: vector(file, "output_norm.weight", e)?,
        })
    }
}

impl ModelWeights {
    /// Converts the f32 projections to `precision`; with a calibration, integer projections
    /// keep their inputs' outlier channels in f32.
    pub fn into_precision(
        mut self,
        precision: Precision,
        calibration: Option<&Calibration>,
    ) -> Self {
        if precision == Precision::F32 {
            return self;
        }
        let convert = |lin: &mut Linear, layer: usize, site: Site| {
            if let Linear::F32(m) = lin {
                let outliers = || {
                    calibration
                        .map(|c| c.outliers(layer, site))
                        .unwrap_or_default()
                };
                *lin = match precision {
                    Precision::F32 => unreachable!("returned above"),
                    Precision::Bf16 => Linear::to_bf16(m),
                    Precision::Int8 => {
                        Linear::Quant(QuantLinear::quantize(m, WeightBits::Eight, outliers()))
                    }
                    Precision::Int4 => {
                        Linear::Quant(QuantLinear::quantize(m, WeightBits::Four, outliers()))
                    }
                };
            }
        };
        for (i, l) in self.layers.iter_mut().enumerate() {
            for w in [&mut l.wq, &mut l.wk, &mut l.wv] {
                convert(w, i, Site::AttnIn);
            }
            convert(&mut l.wo, i, Site::AttnOut);
            for w in [&mut l.w_gate, &mut l.w_up] {
                convert(w, i, Site::FfnIn);
            }
            convert(&mut l.w_down, i, Site::FfnDown);
        }
        convert(&mut self.output, 0, Site::Head);
        self
    }
}

fn check_dims(file: &GgufFile, name: &str, expected: &[u64]) -> Result<()> {
    let info = file.tensor_info(name)?;
    if info.dims != expected {
        return Err(ModelError::TensorShape {
            name: name.to_string(),
            expected: expected.to_vec(),
            found: info.dims.clone(),
        });
    }
    Ok(())
}

fn matrix(file: &GgufFile, name: &str, n_rows: usize, n_cols: usize) -> Result<Matrix> {
    check_dims(file, name, &[n_cols as u64, n_rows as u64])?;
    Ok(Matrix {
        data: file.tensor_f32(name)?,
        n_rows,
        n_cols,
    })
}

fn vector(file: &GgufFile, name: &str, len: usize) -> Result<Vec<f32>> {
    check_dims(file, name, &[len as u64])?;
    Ok(file.tensor_f32(name)?)
}
