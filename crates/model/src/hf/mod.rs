//! Hugging Face checkpoints: a directory with `config.json` and one or more
//! `*.safetensors` files (with `model.safetensors.index.json` when sharded), for the
//! architectures [`Architecture`] names.
//!
//! Tensors are offered under GGUF's names and in GGUF's conventions, as llama.cpp's
//! converter would write them, so everything past loading knows one format: Llama's Q/K
//! rows are permuted to interleaved RoPE pairs, and Gemma's norm weights `w` (applied as
//! `1 + w`) become `1 + w`. Every tensor in the files must be one pyramid maps: a tensor it
//! does not know would otherwise be silently left out of the computation.

mod config;
mod safetensors;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use ::safetensors::Dtype;
use pyramid_gguf::GgmlType;
use pyramid_kernels::ops::RopeStyle;
use serde_json::Value;

use self::safetensors::{Shard, TensorEntry};
use crate::checkpoint::TensorSource;
use crate::config::Architecture;
use crate::{ModelConfig, ModelError, Pooling, Result};

const CONFIG_FILE: &str = "config.json";
const INDEX_FILE: &str = "model.safetensors.index.json";

/// What loading does to a tensor after widening it to f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transform {
    None,
    /// Rows of `heads` heads from rotate-half order to interleaved pairs.
    InterleaveRope {
        heads: usize,
    },
    /// Gemma's norms scale by `1 + w`; GGUF stores that sum.
    AddOne,
}

/// A tensor under its GGUF name: where its bytes are and how they become GGUF's tensor.
#[derive(Debug, Clone)]
struct Mapped {
    shard: usize,
    entry: TensorEntry,
    transform: Transform,
}

/// An opened Hugging Face directory.
pub struct HfCheckpoint {
    dir: PathBuf,
    config: ModelConfig,
    shards: Vec<Shard>,
    tensors: HashMap<String, Mapped>,
}

impl std::fmt::Debug for HfCheckpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HfCheckpoint")
            .field("dir", &self.dir)
            .field("shards", &self.shards.len())
            .field("tensors", &self.tensors.len())
            .finish_non_exhaustive()
    }
}

fn problem(path: &Path, reason: impl Into<String>) -> ModelError {
    ModelError::Checkpoint {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

fn read_json(path: &Path) -> Result<Value> {
    let bytes = std::fs::read(path).map_err(|e| problem(path, e.to_string()))?;
    serde_json::from_slice(&bytes).map_err(|e| problem(path, format!("not valid JSON: {e}")))
}

impl HfCheckpoint {
    /// Reads `config.json`, maps the weight files and checks every tensor's name and type
    /// (shapes are checked against the configuration as the weights load).
    pub fn open(dir: &Path) -> Result<HfCheckpoint> {
        let config_path = dir.join(CONFIG_FILE);
        if !config_path.is_file() {
            return Err(problem(
                dir,
                "not a model directory: it has no config.json (a Hugging Face checkpoint has \
                 config.json, *.safetensors and tokenizer.json)",
            ));
        }
        let json = read_json(&config_path)?;
        let name = model_name(dir);
        let mut config =
            config::model_config(&json, &name).map_err(|e| problem(&config_path, e.to_string()))?;
        let pooling_path = dir.join("1_Pooling").join("config.json");
        if pooling_path.is_file() {
            config.pooling = Some(
                sentence_transformers_pooling(&read_json(&pooling_path)?)
                    .map_err(|reason| problem(&pooling_path, reason))?,
            );
        }
        // transformers' per-class defaults: Gemma and SmolLM3 tie, Llama and Qwen do not.
        let tied = match json.get("tie_word_embeddings") {
            None | Some(Value::Null) => {
                matches!(config.arch, Architecture::Gemma3 | Architecture::SmolLM3)
            }
            Some(Value::Bool(tied)) => *tied,
            Some(other) => {
                return Err(problem(
                    &config_path,
                    format!("'tie_word_embeddings' is {other}, not true or false"),
                ))
            }
        };

        let shards = shard_paths(dir)?
            .iter()
            .map(|path| Shard::open(path))
            .collect::<Result<Vec<_>>>()?;
        let mut tensors = HashMap::new();
        for (i, shard) in shards.iter().enumerate() {
            for (hf_name, entry) in shard.entries() {
                let Some((name, transform)) = gguf_name(hf_name, &config, tied) else {
                    if ignored(hf_name, tied) {
                        continue;
                    }
                    return Err(problem(
                        shard.path(),
                        format!(
                            "tensor '{hf_name}' is not part of a {} model pyramid can run",
                            config.arch.name()
                        ),
                    ));
                };
                if !Shard::readable(entry.dtype) {
                    return Err(problem(
                        shard.path(),
                        format!(
                            "tensor '{hf_name}' is {:?}; weights load from F32, F16 or BF16",
                            entry.dtype
                        ),
                    ));
                }
                let mapped = Mapped {
                    shard: i,
                    entry: entry.clone(),
                    transform,
                };
                if tensors.insert(name, mapped).is_some() {
                    return Err(problem(
                        shard.path(),
                        format!("tensor '{hf_name}' appears twice"),
                    ));
                }
            }
        }
        let checkpoint = HfCheckpoint {
            dir: dir.to_path_buf(),
            config,
            shards,
            tensors,
        };
        if !tied && !checkpoint.tensors.contains_key("output.weight") {
            return Err(problem(
                dir,
                "the output projection is not tied to the embeddings (tie_word_embeddings, \
                 false by default for llama and qwen2), but there is no lm_head.weight",
            ));
        }
        Ok(checkpoint)
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `config.json` and the weight files, in a stable order.
    pub fn files(&self) -> Vec<PathBuf> {
        std::iter::once(self.dir.join(CONFIG_FILE))
            .chain(self.shards.iter().map(|s| s.path().to_path_buf()))
            .collect()
    }

    fn mapped(&self, name: &str) -> Result<&Mapped> {
        self.tensors
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor(name.to_string()))
    }
}

impl TensorSource for HfCheckpoint {
    fn tensor_dims(&self, name: &str) -> Result<Vec<u64>> {
        Ok(self.mapped(name)?.entry.ggml_dims())
    }

    fn has_tensor(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    fn tensor_f32(&self, name: &str) -> Result<Vec<f32>> {
        let mapped = self.mapped(name)?;
        let mut data = self.shards[mapped.shard].read_f32(&mapped.entry)?;
        match mapped.transform {
            Transform::None => {}
            Transform::AddOne => data.iter_mut().for_each(|w| *w += 1.0),
            Transform::InterleaveRope { heads } => {
                data = interleave_rope_rows(&data, heads, &mapped.entry.shape)
                    .map_err(|reason| problem(self.shards[mapped.shard].path(), reason))?;
            }
        }
        Ok(data)
    }

    fn tensor_type(&self, name: &str) -> Result<GgmlType> {
        let mapped = match self.tensors.get(name) {
            Some(mapped) => mapped,
            // A stacked experts' name: the first expert's own tensor.
            None => self.mapped(&expert_key(name, 0))?,
        };
        Ok(match mapped.entry.dtype {
            Dtype::BF16 => GgmlType::BF16,
            Dtype::F16 => GgmlType::F16,
            // `open` admitted nothing else.
            _ => GgmlType::F32,
        })
    }

    /// A directory stores floats, which are read through `tensor_f32`: no tensor of one is
    /// ever asked for as blocks.
    fn tensor_bytes(&self, name: &str) -> Result<&[u8]> {
        Err(problem(
            &self.dir,
            format!("tensor '{name}' is float; a Hugging Face directory stores no blocks"),
        ))
    }

    fn expert_f32(
        &self,
        name: &str,
        expert: usize,
        [n_rows, n_cols, n_expert]: [usize; 3],
    ) -> Result<Vec<f32>> {
        let key = expert_key(name, expert);
        let mapped = self.tensors.get(&key).ok_or_else(|| {
            ModelError::MissingTensor(format!(
                "{name}, expert {expert} of {n_expert} (mlp.experts.{expert}.*)"
            ))
        })?;
        let found = mapped.entry.ggml_dims();
        if found != [n_cols as u64, n_rows as u64] || expert >= n_expert {
            return Err(ModelError::TensorShape {
                name: key,
                expected: vec![n_cols as u64, n_rows as u64],
                found,
            });
        }
        self.tensor_f32(&key)
    }

    fn release(&self, name: &str) {
        if let Some(mapped) = self.tensors.get(name) {
            self.shards[mapped.shard].release(&mapped.entry);
            return;
        }
        // A stacked experts' name: each expert's own tensor.
        for expert in 0.. {
            let Some(mapped) = self.tensors.get(&expert_key(name, expert)) else {
                break;
            };
            self.shards[mapped.shard].release(&mapped.entry);
        }
    }
}

/// The pooling a sentence-transformers directory names in `1_Pooling/config.json`:
/// exactly one mode pyramid implements.
fn sentence_transformers_pooling(json: &Value) -> std::result::Result<Pooling, String> {
    let on = |key: &str| json.get(key).and_then(Value::as_bool) == Some(true);
    let modes = [
        ("pooling_mode_mean_tokens", Some(Pooling::Mean)),
        ("pooling_mode_cls_token", Some(Pooling::Cls)),
        ("pooling_mode_lasttoken", Some(Pooling::Last)),
        ("pooling_mode_max_tokens", None),
        ("pooling_mode_mean_sqrt_len_tokens", None),
        ("pooling_mode_weightedmean_tokens", None),
    ];
    let chosen: Vec<_> = modes.iter().filter(|(key, _)| on(key)).collect();
    match chosen.as_slice() {
        [(_, Some(pooling))] => Ok(*pooling),
        [(key, None)] => Err(format!(
            "{key} is not implemented (mean, cls or last token)"
        )),
        [] => Err("no pooling mode is set".to_string()),
        _ => Err("more than one pooling mode is set".to_string()),
    }
}

/// What a directory's model is called: its name, or for a snapshot in the Hugging Face
/// cache (`models--ORG--REPO/snapshots/<commit>`) the repository's `ORG/REPO`.
fn model_name(dir: &Path) -> String {
    fn name(p: Option<&Path>) -> Option<String> {
        Some(p?.file_name()?.to_string_lossy().into_owned())
    }
    let parent = dir.parent();
    if name(parent).as_deref() == Some("snapshots") {
        if let Some(repo) = name(parent.and_then(Path::parent))
            .as_deref()
            .and_then(|n| n.strip_prefix("models--"))
        {
            return repo.replace("--", "/");
        }
    }
    name(Some(dir)).unwrap_or_else(|| "model".to_string())
}

/// The weight files: those the index names, else every `*.safetensors` in the directory.
fn shard_paths(dir: &Path) -> Result<Vec<PathBuf>> {
    let index = dir.join(INDEX_FILE);
    if index.is_file() {
        let json = read_json(&index)?;
        let map = json
            .get("weight_map")
            .and_then(Value::as_object)
            .ok_or_else(|| problem(&index, "has no 'weight_map' object"))?;
        let mut files: Vec<&str> = map
            .values()
            .map(|v| {
                v.as_str()
                    .ok_or_else(|| problem(&index, "a weight_map entry is not a file name"))
            })
            .collect::<Result<_>>()?;
        files.sort_unstable();
        files.dedup();
        return files
            .into_iter()
            .map(|f| {
                let path = dir.join(f);
                if Path::new(f).components().count() != 1 || !path.is_file() {
                    return Err(problem(
                        &index,
                        format!("names '{f}', which is not a file here"),
                    ));
                }
                Ok(path)
            })
            .collect();
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| problem(dir, e.to_string()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors") && p.is_file())
        .collect();
    if files.is_empty() {
        return Err(problem(dir, "has no *.safetensors weight files"));
    }
    files.sort();
    Ok(files)
}

/// Tensors a checkpoint may carry that the model does not read.
fn ignored(hf_name: &str, tied: bool) -> bool {
    hf_name.ends_with("rotary_emb.inv_freq") || (tied && hf_name == "lm_head.weight")
}

/// The GGUF name of a Hugging Face tensor and what turns it into that tensor; `None` for a
/// tensor this architecture does not have.
fn gguf_name(hf_name: &str, cfg: &ModelConfig, tied: bool) -> Option<(String, Transform)> {
    let gemma = cfg.arch == Architecture::Gemma3;
    let qk_norms = cfg.arch.has_qk_norms();
    let phi3 = cfg.arch == Architecture::Phi3;
    let moe = cfg.layer_experts(layer_of(hf_name)?).is_some();
    let norm = if gemma {
        Transform::AddOne
    } else {
        Transform::None
    };
    if hf_name == "lm_head.weight" {
        return (!tied).then(|| ("output.weight".to_string(), Transform::None));
    }
    let rest = hf_name.strip_prefix("model.")?;
    match rest {
        "embed_tokens.weight" => return Some(("token_embd.weight".to_string(), Transform::None)),
        "norm.weight" => return Some(("output_norm.weight".to_string(), norm)),
        _ => {}
    }
    let rest = rest.strip_prefix("layers.")?;
    let (index, tensor) = rest.split_once('.')?;
    let layer: usize = index.parse().ok()?;
    if layer >= cfg.n_layer || index != layer.to_string() {
        return None;
    }
    let rope = |heads| {
        if cfg.arch.rope_style() == RopeStyle::Interleaved {
            Transform::InterleaveRope { heads }
        } else {
            Transform::None
        }
    };
    let (gguf, transform) = match tensor {
        "self_attn.q_proj.weight" => ("attn_q.weight", rope(cfg.n_head)),
        "self_attn.k_proj.weight" => ("attn_k.weight", rope(cfg.n_head_kv)),
        "self_attn.v_proj.weight" => ("attn_v.weight", Transform::None),
        // Phi-3's fused projections keep their GGUF names (split when the layer loads).
        "self_attn.qkv_proj.weight" if phi3 => ("attn_qkv.weight", Transform::None),
        "mlp.gate_up_proj.weight" if phi3 => ("ffn_up.weight", Transform::None),
        "self_attn.o_proj.weight" => ("attn_output.weight", Transform::None),
        "self_attn.q_proj.bias" => ("attn_q.bias", rope(cfg.n_head)),
        "self_attn.k_proj.bias" => ("attn_k.bias", rope(cfg.n_head_kv)),
        "self_attn.v_proj.bias" => ("attn_v.bias", Transform::None),
        "mlp.gate_proj.weight" => ("ffn_gate.weight", Transform::None),
        "mlp.up_proj.weight" => ("ffn_up.weight", Transform::None),
        "mlp.down_proj.weight" => ("ffn_down.weight", Transform::None),
        "input_layernorm.weight" => ("attn_norm.weight", norm),
        // Llama and Qwen2 name the pre-FFN norm after attention; Gemma has both.
        "post_attention_layernorm.weight" if gemma => ("post_attention_norm.weight", norm),
        "post_attention_layernorm.weight" => ("ffn_norm.weight", norm),
        "pre_feedforward_layernorm.weight" if gemma => ("ffn_norm.weight", norm),
        "post_feedforward_layernorm.weight" if gemma => ("post_ffw_norm.weight", norm),
        "self_attn.q_norm.weight" if qk_norms => ("attn_q_norm.weight", norm),
        "self_attn.k_norm.weight" if qk_norms => ("attn_k_norm.weight", norm),
        "mlp.gate.weight" if moe => ("ffn_gate_inp.weight", Transform::None),
        _ if moe => return expert_name(layer, tensor),
        _ => return None,
    };
    Some((format!("blk.{layer}.{gguf}"), transform))
}

/// The layer index of a `model.layers.N.…` tensor (0 for others, whose layer is never
/// asked).
fn layer_of(hf_name: &str) -> Option<usize> {
    match hf_name.strip_prefix("model.layers.") {
        Some(rest) => rest.split('.').next()?.parse().ok(),
        None => Some(0),
    }
}

/// One expert's projection (`mlp.experts.E.gate_proj.weight`) under the name of llama.cpp's
/// stacked tensor and the expert's index: `blk.N.ffn_gate_exps.weight#E`, which
/// [`TensorSource::expert_f32`] reads.
fn expert_name(layer: usize, tensor: &str) -> Option<(String, Transform)> {
    let rest = tensor.strip_prefix("mlp.experts.")?;
    let (index, projection) = rest.split_once('.')?;
    let expert: usize = index.parse().ok()?;
    if index != expert.to_string() {
        return None;
    }
    let stacked = match projection {
        "gate_proj.weight" => "ffn_gate_exps.weight",
        "up_proj.weight" => "ffn_up_exps.weight",
        "down_proj.weight" => "ffn_down_exps.weight",
        _ => return None,
    };
    Some((
        expert_key(&format!("blk.{layer}.{stacked}"), expert),
        Transform::None,
    ))
}

fn expert_key(stacked: &str, expert: usize) -> String {
    format!("{stacked}#{expert}")
}

/// llama.cpp's Q/K permutation: within each head, row `half * d/2 + i` (rotate-half
/// order) moves to `2 * i + half` (interleaved pairs). `shape` is Hugging Face's
/// (`[rows]` for a bias, `[rows, cols]` for a weight).
fn interleave_rope_rows(
    data: &[f32],
    heads: usize,
    shape: &[usize],
) -> std::result::Result<Vec<f32>, String> {
    let rows = shape.first().copied().unwrap_or(0);
    let cols = shape.get(1).copied().unwrap_or(1);
    if heads == 0
        || rows % heads != 0
        || !(rows / heads).is_multiple_of(2)
        || rows * cols != data.len()
    {
        return Err(format!(
            "a Q/K projection of shape {shape:?} does not split into {heads} heads of pairs"
        ));
    }
    let d = rows / heads;
    let mut out = vec![0.0; data.len()];
    for h in 0..heads {
        for half in 0..2 {
            for i in 0..d / 2 {
                let from = h * d + half * (d / 2) + i;
                let to = h * d + 2 * i + half;
                out[to * cols..(to + 1) * cols]
                    .copy_from_slice(&data[from * cols..(from + 1) * cols]);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hugging_face_cache_snapshot_is_named_for_its_repository() {
        let snapshot = Path::new("/c/hub/models--Qwen--Qwen3-0.6B/snapshots/0123abc");
        assert_eq!(model_name(snapshot), "Qwen/Qwen3-0.6B");
        assert_eq!(model_name(Path::new("/m/tiny-qwen3")), "tiny-qwen3");
        assert_eq!(model_name(Path::new("/x/snapshots/abc")), "abc");
    }

    #[test]
    fn rope_rows_interleave_within_each_head() {
        // Two heads of four rows, one column: [a0 a1 b0 b1] per head -> [a0 b0 a1 b1].
        let data: Vec<f32> = (0..8).map(|x| x as f32).collect();
        let out = interleave_rope_rows(&data, 2, &[8]).unwrap();
        assert_eq!(out, [0.0, 2.0, 1.0, 3.0, 4.0, 6.0, 5.0, 7.0]);
        let wide: Vec<f32> = (0..8).map(|x| x as f32).collect();
        let out = interleave_rope_rows(&wide, 1, &[4, 2]).unwrap();
        assert_eq!(out, [0.0, 1.0, 4.0, 5.0, 2.0, 3.0, 6.0, 7.0]);
        assert!(interleave_rope_rows(&data, 3, &[8]).is_err());
    }
}
