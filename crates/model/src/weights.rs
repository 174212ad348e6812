//! Typed layer weights, dequantised to f32 at load.
//!
//! Matrices keep GGUF's layout: `[n_out, n_in]` row-major (GGML dims `[n_in, n_out]`),
//! which is what [`pyramid_kernels::matmul`] consumes.

use pyramid_gguf::GgufFile;

use crate::config::{Architecture, ModelConfig};
use crate::{ModelError, Result};

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
    pub wq: Matrix,           // [q_dim, n_embd]
    pub wk: Matrix,           // [kv_dim, n_embd]
    pub wv: Matrix,           // [kv_dim, n_embd]
    pub bq: Option<Vec<f32>>, // [q_dim] (Qwen2)
    pub bk: Option<Vec<f32>>, // [kv_dim] (Qwen2)
    pub bv: Option<Vec<f32>>, // [kv_dim] (Qwen2)
    pub wo: Matrix,           // [n_embd, q_dim]
    pub ffn_norm: Vec<f32>,   // [n_embd]
    pub w_gate: Matrix,       // [n_ff, n_embd]
    pub w_up: Matrix,         // [n_ff, n_embd]
    pub w_down: Matrix,       // [n_embd, n_ff]
}

#[derive(Debug, Clone)]
pub struct ModelWeights {
    pub token_embd: Matrix, // [n_vocab, n_embd]
    pub layers: Vec<LayerWeights>,
    pub output_norm: Vec<f32>, // [n_embd]
    /// `None` when the output head is tied to `token_embd`.
    pub output: Option<Matrix>, // [n_vocab, n_embd]
}

impl ModelWeights {
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
                Ok(LayerWeights {
                    attn_norm: vector(file, &name("attn_norm.weight"), e)?,
                    wq: matrix(file, &name("attn_q.weight"), q, e)?,
                    wk: matrix(file, &name("attn_k.weight"), kv, e)?,
                    wv: matrix(file, &name("attn_v.weight"), kv, e)?,
                    bq: bias("attn_q.bias", q)?,
                    bk: bias("attn_k.bias", kv)?,
                    bv: bias("attn_v.bias", kv)?,
                    wo: matrix(file, &name("attn_output.weight"), e, q)?,
                    ffn_norm: vector(file, &name("ffn_norm.weight"), e)?,
                    w_gate: matrix(file, &name("ffn_gate.weight"), ff, e)?,
                    w_up: matrix(file, &name("ffn_up.weight"), ff, e)?,
                    w_down: matrix(file, &name("ffn_down.weight"), e, ff)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let output = if file.has_tensor("output.weight") {
            Some(matrix(file, "output.weight", cfg.n_vocab, e)?)
        } else {
            None
        };
        Ok(Self {
            token_embd: matrix(file, "token_embd.weight", cfg.n_vocab, e)?,
            layers,
            output_norm: vector(file, "output_norm.weight", e)?,
            output,
        })
    }

    pub fn output_head(&self) -> &Matrix {
        self.output.as_ref().unwrap_or(&self.token_embd)
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
