//! `config.json` of a Hugging Face checkpoint as a [`ModelConfig`].
//!
//! Reads both spellings transformers has written: `rope_theta` and `rope_scaling` (up to
//! 4.x) and `rope_parameters` (5.x, per layer type for Gemma 3). A key that changes what
//! the model computes and that pyramid does not implement (softcapping, partial rotary,
//! Qwen2's sliding window, YaRN) is refused, never ignored.

use serde_json::{Map, Value};

use crate::config::{Activation, Architecture, Experts, SlidingWindow};
use crate::rope_scaling::{RopeScaling, Yarn};
use crate::{ModelConfig, ModelError, Result};

/// The parsed `config.json`, with errors naming the key.
struct Json<'a>(&'a Map<String, Value>);

impl<'a> Json<'a> {
    fn get(&self, key: &str) -> Option<&'a Value> {
        self.0.get(key).filter(|v| !v.is_null())
    }

    fn usize(&self, key: &str) -> Result<usize> {
        self.opt_usize(key)?
            .ok_or_else(|| bad(format!("config.json has no '{key}'")))
    }

    fn opt_usize(&self, key: &str) -> Result<Option<usize>> {
        self.get(key)
            .map(|v| {
                v.as_u64()
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or_else(|| bad(format!("config.json '{key}' is {v}, not a count")))
            })
            .transpose()
    }

    fn opt_f32(&self, key: &str) -> Result<Option<f32>> {
        self.get(key)
            .map(|v| {
                v.as_f64()
                    .map(|x| x as f32)
                    .ok_or_else(|| bad(format!("config.json '{key}' is {v}, not a number")))
            })
            .transpose()
    }

    fn opt_str(&self, key: &str) -> Result<Option<&'a str>> {
        self.get(key)
            .map(|v| {
                v.as_str()
                    .ok_or_else(|| bad(format!("config.json '{key}' is {v}, not a string")))
            })
            .transpose()
    }

    fn flag(&self, key: &str) -> bool {
        self.get(key).and_then(Value::as_bool).unwrap_or(false)
    }
}

fn bad(message: String) -> ModelError {
    ModelError::BadConfig(message)
}

/// A RoPE setting: its base, the part of each head it rotates, and the scaling it was
/// trained with, if any.
struct Rope {
    theta: f32,
    rotary_fraction: f32,
    scaling: Option<RopeScaling>,
}

/// The architecture `config.json` names, from `model_type`.
fn architecture(json: &Json) -> Result<Architecture> {
    match json.opt_str("model_type")? {
        Some("llama") => Ok(Architecture::Llama),
        Some("qwen2") => Ok(Architecture::Qwen2),
        Some("gemma3_text") => Ok(Architecture::Gemma3),
        Some("qwen3") => Ok(Architecture::Qwen3),
        Some("smollm3") => Ok(Architecture::SmolLM3),
        Some("phi3") => Ok(Architecture::Phi3),
        Some("qwen3_moe") => Ok(Architecture::Qwen3Moe),
        Some("gemma3") => Err(bad(
            "config.json is a multimodal Gemma 3 (model_type 'gemma3'); only the text model \
             (Gemma3ForCausalLM, model_type 'gemma3_text') loads from a directory"
                .to_string(),
        )),
        Some(other) => Err(bad(format!(
            "model_type '{other}' is not supported (supported: llama, qwen2, qwen3, qwen3_moe, smollm3, phi3, gemma3_text)"
        ))),
        None => Err(bad("config.json has no 'model_type'".to_string())),
    }
}

/// Reads `config.json` (already parsed) into a checked [`ModelConfig`]; `name` names the
/// model when the file does not.
pub(crate) fn model_config(root: &Value, name: &str) -> Result<ModelConfig> {
    let map = root
        .as_object()
        .ok_or_else(|| bad("config.json is not a JSON object".to_string()))?;
    let json = Json(map);
    let arch = architecture(&json)?;
    let n_embd = json.usize("hidden_size")?;
    let n_head = json.usize("num_attention_heads")?;
    let n_head_kv = json.opt_usize("num_key_value_heads")?.unwrap_or(n_head);
    if n_head == 0 || n_head_kv == 0 || n_head % n_head_kv != 0 {
        return Err(bad(format!(
            "num_attention_heads {n_head} is not a positive multiple of num_key_value_heads \
             {n_head_kv}"
        )));
    }
    let head_dim = match json.opt_usize("head_dim")? {
        Some(d) => d,
        None if n_embd % n_head == 0 => n_embd / n_head,
        None => {
            return Err(bad(format!(
                "hidden_size {n_embd} is not divisible by num_attention_heads {n_head}"
            )))
        }
    };
    refuse_unimplemented(&json, arch)?;
    let n_layer = json.usize("num_hidden_layers")?;
    let activation = match json
        .opt_str("hidden_activation")?
        .or(json.opt_str("hidden_act")?)
    {
        Some("silu") if arch != Architecture::Gemma3 => Activation::Silu,
        Some("gelu_pytorch_tanh") if arch == Architecture::Gemma3 => Activation::GeluTanh,
        other => {
            return Err(bad(format!(
                "activation {other:?} is not implemented for {}",
                arch.name()
            )))
        }
    };
    let (global_rope, local_rope) = rope_settings(&json, arch)?;
    let sliding_window = match arch {
        Architecture::Gemma3 => Some(SlidingWindow {
            size: json.usize("sliding_window")?,
            global_every: gemma_global_every(&json, n_layer)?,
            rope_base: local_rope.map_or(10_000.0, |r| r.theta),
        }),
        _ => None,
    };
    let (embedding_scale, attention_scale) = match arch {
        Architecture::Gemma3 => {
            // transformers' default for Gemma3TextConfig.
            let scalar = json.opt_f32("query_pre_attn_scalar")?.unwrap_or(256.0);
            if !(scalar.is_finite() && scalar > 0.0) {
                return Err(bad(format!(
                    "query_pre_attn_scalar {scalar} must be a positive number"
                )));
            }
            ((n_embd as f32).sqrt(), 1.0 / scalar.sqrt())
        }
        _ => (1.0, 1.0 / (head_dim as f32).sqrt()),
    };
    let mut cfg = ModelConfig {
        arch,
        name: name.to_string(),
        n_vocab: json.usize("vocab_size")?,
        n_embd,
        n_layer,
        n_head,
        n_head_kv,
        head_dim,
        n_ff: json.usize("intermediate_size")?,
        n_ctx_train: json.usize("max_position_embeddings")?,
        // transformers rotates `int(head_dim * partial_rotary_factor)` dims.
        n_rot: (head_dim as f32 * global_rope.rotary_fraction) as usize,
        rope_base: global_rope.theta,
        rms_eps: json
            .opt_f32("rms_norm_eps")?
            .ok_or_else(|| bad("config.json has no 'rms_norm_eps'".to_string()))?,
        embedding_scale,
        attention_scale,
        activation,
        sliding_window,
        rope_factors: None,
        rope_scale: 1.0,
        pooling: None,
        no_rope_layers: no_rope_layers(&json, arch, n_layer)?,
        experts: experts(&json, arch, n_layer)?,
    };
    // Checked before the factors are sized from head_dim.
    cfg.validate()?;
    if let Some(scaling) = &global_rope.scaling {
        cfg.apply_rope_scaling(scaling)?;
    }
    Ok(cfg)
}

/// Qwen3-MoE's routed experts, as transformers reads them: layer `l` is dense when listed in
/// `mlp_only_layers` or when `(l + 1)` is not a multiple of `decoder_sparse_step`.
fn experts(json: &Json, arch: Architecture, n_layer: usize) -> Result<Option<Experts>> {
    if arch != Architecture::Qwen3Moe {
        return Ok(None);
    }
    let n_expert = match json.opt_usize("num_experts")? {
        Some(n) => n,
        None => json.usize("num_local_experts")?,
    };
    let step = json.opt_usize("decoder_sparse_step")?.unwrap_or(1);
    if step == 0 {
        return Err(bad("decoder_sparse_step must be at least 1".to_string()));
    }
    let only_mlp: Vec<usize> = match json.get("mlp_only_layers").filter(|v| !v.is_null()) {
        None => Vec::new(),
        Some(Value::Array(layers)) => layers
            .iter()
            .map(|l| {
                l.as_u64()
                    .map(|l| l as usize)
                    .filter(|&l| l < n_layer)
                    .ok_or_else(|| bad(format!("mlp_only_layers holds {l}, not a layer index")))
            })
            .collect::<Result<_>>()?,
        Some(other) => return Err(bad(format!("mlp_only_layers is {other}, not a list"))),
    };
    Ok(Some(Experts {
        n_expert,
        n_used: json.usize("num_experts_per_tok")?,
        n_ff: json.usize("moe_intermediate_size")?,
        // Qwen3MoeConfig's default.
        normalize: json.flag("norm_topk_prob"),
        dense_layers: (0..n_layer)
            .filter(|l| only_mlp.contains(l) || !(l + 1).is_multiple_of(step))
            .collect(),
    }))
}

/// SmolLM3's layers without RoPE: `no_rope_layers` (1 rotates, 0 does not, one per layer)
/// or, without it, every `no_rope_layer_interval`-th (4 by default), as transformers
/// reads them. Other families rotate every layer; a list on one of them is refused.
fn no_rope_layers(json: &Json, arch: Architecture, n_layer: usize) -> Result<Vec<usize>> {
    let listed = json.get("no_rope_layers").filter(|v| !v.is_null());
    if arch != Architecture::SmolLM3 {
        return match listed {
            Some(_) => Err(bad(format!(
                "no_rope_layers on a {} model is not implemented",
                arch.name()
            ))),
            None => Ok(Vec::new()),
        };
    }
    match listed {
        Some(Value::Array(flags)) => {
            if flags.len() != n_layer {
                return Err(bad(format!(
                    "no_rope_layers has {} entries for {n_layer} layers",
                    flags.len()
                )));
            }
            flags
                .iter()
                .enumerate()
                .filter_map(|(layer, flag)| match flag.as_u64() {
                    Some(1) => None,
                    Some(0) => Some(Ok(layer)),
                    _ => Some(Err(bad(format!(
                        "no_rope_layers[{layer}] is {flag}, not 0 or 1"
                    )))),
                })
                .collect()
        }
        Some(other) => Err(bad(format!("no_rope_layers is {other}, not a list"))),
        None => {
            let every = json.opt_usize("no_rope_layer_interval")?.unwrap_or(4);
            if every == 0 {
                return Err(bad("no_rope_layer_interval must be at least 1".to_string()));
            }
            Ok((0..n_layer).filter(|l| (l + 1) % every == 0).collect())
        }
    }
}

/// Keys whose non-default values change the computation in ways pyramid lacks.
fn refuse_unimplemented(json: &Json, arch: Architecture) -> Result<()> {
    for key in ["attn_logit_softcapping", "final_logit_softcapping"] {
        if json.get(key).is_some() {
            return Err(bad(format!("{key} is not implemented")));
        }
    }
    if json.flag("use_bidirectional_attention") {
        return Err(bad(
            "use_bidirectional_attention (an embedding model) is not implemented: pyramid \
             runs causal language models"
                .to_string(),
        ));
    }
    if json.flag("mlp_bias") {
        return Err(bad("mlp_bias is not implemented".to_string()));
    }
    if arch == Architecture::Phi3 {
        let window = json.opt_usize("sliding_window")?;
        let max_positions = json.usize("max_position_embeddings")?;
        if let Some(w) = window.filter(|&w| w < max_positions) {
            return Err(bad(format!(
                "Phi-3's sliding_window {w} (below max_position_embeddings {max_positions}) \
                 is not implemented"
            )));
        }
    }
    if matches!(
        arch,
        Architecture::Qwen2 | Architecture::Qwen3 | Architecture::Qwen3Moe
    ) && json.flag("use_sliding_window")
    {
        return Err(bad(format!(
            "{}'s use_sliding_window is not implemented",
            arch.name()
        )));
    }
    Ok(())
}

/// The global (and, for Gemma 3, the sliding-window layers') RoPE settings.
fn rope_settings(json: &Json, arch: Architecture) -> Result<(Rope, Option<Rope>)> {
    let legacy_theta = json.opt_f32("rope_theta")?;
    let local_theta = json.opt_f32("rope_local_base_freq")?.unwrap_or(10_000.0);
    let per_layer_type = json
        .get("rope_parameters")
        .and_then(Value::as_object)
        .and_then(|p| Some((p.get("full_attention")?, p.get("sliding_attention"))));
    let (global, local) = if let Some((full, sliding)) = per_layer_type {
        let key = "rope_parameters.sliding_attention";
        let local = sliding
            .map(|v| rope(v, key, Some(local_theta), json))
            .transpose()?;
        (
            rope(full, "rope_parameters.full_attention", legacy_theta, json)?,
            local,
        )
    } else if let Some(p) = json.get("rope_parameters") {
        (rope(p, "rope_parameters", legacy_theta, json)?, None)
    } else {
        // `rope_scaling` (transformers 4.x) or nothing: the base is `rope_theta`.
        let empty = Value::Object(Map::new());
        let scaling = json.get("rope_scaling").unwrap_or(&empty);
        let mut global = rope(scaling, "rope_scaling", legacy_theta, json)?;
        global.theta = legacy_theta.unwrap_or(10_000.0);
        (global, None)
    };
    if global.rotary_fraction != 1.0 && arch != Architecture::Phi3 {
        return Err(bad(format!(
            "partial_rotary_factor on a {} model is not implemented: RoPE would rotate the \
             wrong dims",
            arch.name()
        )));
    }
    if matches!(global.scaling, Some(RopeScaling::Llama3 { .. })) && arch != Architecture::Llama {
        return Err(bad(format!(
            "llama3 RoPE scaling on a {} model is not implemented",
            arch.name()
        )));
    }
    let local = match (arch, local) {
        (_, Some(l)) if l.scaling.is_some() => {
            return Err(bad(
                "RoPE scaling of sliding-window layers is not implemented".to_string(),
            ))
        }
        (Architecture::Gemma3, local) => Some(local.unwrap_or(Rope {
            theta: local_theta,
            rotary_fraction: 1.0,
            scaling: None,
        })),
        (_, Some(_)) => {
            return Err(bad(format!(
                "sliding-window RoPE settings on a {} model are not implemented",
                arch.name()
            )))
        }
        (_, None) => None,
    };
    if !(global.theta.is_finite() && global.theta > 0.0) {
        return Err(bad(format!(
            "rope_theta {} must be a positive number",
            global.theta
        )));
    }
    Ok((global, local))
}

/// One RoPE parameter object: `{"rope_type": …, "rope_theta": …, …}`. The default, linear,
/// YaRN, LongRoPE and Llama 3's scaling are implemented; anything else is refused. `top`
/// is the whole `config.json`, for the settings older files keep there
/// (`partial_rotary_factor`, `original_max_position_embeddings`).
fn rope(value: &Value, key: &str, legacy_theta: Option<f32>, top: &Json) -> Result<Rope> {
    let map = value
        .as_object()
        .ok_or_else(|| bad(format!("config.json '{key}' is not an object")))?;
    let params = Json(map);
    let rotary_fraction = params
        .opt_f32("partial_rotary_factor")?
        .or(top.opt_f32("partial_rotary_factor")?)
        .unwrap_or(1.0);
    if !(rotary_fraction > 0.0 && rotary_fraction <= 1.0) {
        return Err(bad(format!(
            "partial_rotary_factor {rotary_fraction} must be in (0, 1]"
        )));
    }
    let max_positions = top.usize("max_position_embeddings")?;
    let original = params
        .opt_usize("original_max_position_embeddings")?
        .or(top.opt_usize("original_max_position_embeddings")?);
    let kind = params
        .opt_str("rope_type")?
        .or(params.opt_str("type")?)
        .unwrap_or("default");
    let theta = params
        .opt_f32("rope_theta")?
        .or(legacy_theta)
        .unwrap_or(10_000.0);
    let need = |name: &str| {
        params
            .opt_f32(name)?
            .ok_or_else(|| bad(format!("{kind} RoPE scaling ({key}) needs '{name}'")))
    };
    let scaling = match kind {
        "default" => None,
        "linear" => Some(RopeScaling::Linear {
            factor: need("factor")?,
        }),
        "yarn" => {
            if params
                .opt_f32("extrapolation_factor")?
                .is_some_and(|f| f != 1.0)
            {
                return Err(bad(format!(
                    "{key}.extrapolation_factor other than 1 is not implemented"
                )));
            }
            Some(RopeScaling::Yarn(Yarn {
                factor: need("factor")?,
                original_context: original.unwrap_or(max_positions) as f32,
                beta_fast: params.opt_f32("beta_fast")?.unwrap_or(32.0),
                beta_slow: params.opt_f32("beta_slow")?.unwrap_or(1.0),
                attention_factor: params.opt_f32("attention_factor")?,
            }))
        }
        "longrope" | "su" => {
            let factors = |name: &str| {
                params
                    .get(name)
                    .and_then(Value::as_array)
                    .and_then(|a| {
                        a.iter()
                            .map(|v| v.as_f64().map(|x| x as f32))
                            .collect::<Option<Vec<f32>>>()
                    })
                    .ok_or_else(|| {
                        bad(format!(
                            "LongRoPE ({key}) needs '{name}', a list of numbers"
                        ))
                    })
            };
            let original = original.ok_or_else(|| {
                bad("LongRoPE needs original_max_position_embeddings".to_string())
            })?;
            // transformers takes the attention factor from `factor` when one is given.
            let factor = params.opt_f32("factor")?;
            let attention_factor = match (params.opt_f32("attention_factor")?, factor) {
                (Some(a), _) => Some(a),
                (None, Some(f)) if f > 1.0 => Some((1.0 + f.ln() / (original as f32).ln()).sqrt()),
                (None, Some(_)) => Some(1.0),
                (None, None) => None,
            };
            Some(RopeScaling::LongRope {
                short: factors("short_factor")?,
                long: factors("long_factor")?,
                original_context: original as f32,
                context: max_positions as f32,
                attention_factor,
            })
        }
        "llama3" => Some(RopeScaling::Llama3 {
            factor: need("factor")?,
            low_freq_factor: need("low_freq_factor")?,
            high_freq_factor: need("high_freq_factor")?,
            original_context: need("original_max_position_embeddings")?,
        }),
        other => {
            return Err(bad(format!(
                "RoPE scaling '{other}' ({key}) is not implemented: this model's output would \
                 be wrong"
            )))
        }
    };
    Ok(Rope {
        theta,
        rotary_fraction,
        scaling: scaling.map(RopeScaling::checked).transpose()?,
    })
}

/// Gemma 3's period of global layers: from `layer_types` (transformers 5) or
/// `sliding_window_pattern` (4.x); pyramid runs only the periodic layout.
fn gemma_global_every(json: &Json, n_layer: usize) -> Result<usize> {
    if let Some(types) = json.get("layer_types") {
        let types: Vec<&str> = types
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let every = types
            .iter()
            .position(|t| *t == "full_attention")
            .map_or(n_layer.saturating_add(1), |i| i + 1);
        let periodic = types.len() == n_layer
            && types.iter().enumerate().all(|(i, t)| {
                let global = (i + 1) % every == 0;
                *t == if global {
                    "full_attention"
                } else {
                    "sliding_attention"
                }
            });
        if !periodic {
            return Err(bad(format!(
                "layer_types {types:?} is not one full-attention layer every k layers, the \
                 only Gemma 3 layout implemented"
            )));
        }
        return Ok(every);
    }
    match json.opt_usize("sliding_window_pattern")? {
        Some(0) => Err(bad("sliding_window_pattern is 0".to_string())),
        Some(every) => Ok(every),
        None => Ok(6),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn fixture_config(name: &str) -> Value {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../testdata/hf")
            .join(name)
            .join("config.json");
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    /// Qwen3-MoE's experts as transformers reads them: `num_experts` (or transformers 5's
    /// `num_local_experts`), and layers left dense by `mlp_only_layers` or off
    /// `decoder_sparse_step`.
    #[test]
    fn qwen3_moe_experts_and_dense_layers() {
        let mut json = fixture_config("tiny-qwen3moe");
        let experts = model_config(&json, "m").unwrap().experts.unwrap();
        assert_eq!((experts.n_expert, experts.n_used, experts.n_ff), (8, 3, 48));
        assert!(experts.normalize && experts.dense_layers.is_empty());
        let count = json.as_object_mut().unwrap().remove("num_local_experts");
        json["num_experts"] = count.unwrap_or(json!(8));
        json["num_hidden_layers"] = json!(4);
        json["decoder_sparse_step"] = json!(2);
        json["mlp_only_layers"] = json!([3]);
        let experts = model_config(&json, "m").unwrap().experts.unwrap();
        assert_eq!((experts.n_expert, experts.dense_layers), (8, vec![0, 2, 3]));
        json["num_experts_per_tok"] = json!(9);
        let error = model_config(&json, "m").unwrap_err().to_string();
        assert!(
            error.contains("8 experts of 48 routed 9 per token"),
            "{error}"
        );
        json["mlp_only_layers"] = json!([7]);
        let error = model_config(&json, "m").unwrap_err().to_string();
        assert!(error.contains("mlp_only_layers holds 7"), "{error}");
    }

    /// transformers 4 wrote `rope_theta`, `rope_scaling`, `rope_local_base_freq` and
    /// `sliding_window_pattern` where 5 writes `rope_parameters` and `layer_types`; most
    /// checkpoints on the Hub are in the older form. Both read the same.
    #[test]
    fn transformers_4_spellings_read_as_transformers_5_ones() {
        let modern = fixture_config("tiny-llama");
        let mut legacy = modern.clone();
        let rope = legacy
            .as_object_mut()
            .unwrap()
            .remove("rope_parameters")
            .unwrap();
        legacy["rope_theta"] = rope["rope_theta"].clone();
        legacy["rope_scaling"] = rope;
        assert_eq!(
            model_config(&legacy, "m").unwrap(),
            model_config(&modern, "m").unwrap()
        );

        let modern = fixture_config("tiny-gemma3");
        let mut legacy = modern.clone();
        let map = legacy.as_object_mut().unwrap();
        map.remove("rope_parameters");
        map.remove("layer_types");
        map.insert("rope_theta".into(), json!(1_000_000.0));
        map.insert("rope_local_base_freq".into(), json!(10_000.0));
        map.insert("sliding_window_pattern".into(), json!(6));
        assert_eq!(
            model_config(&legacy, "m").unwrap(),
            model_config(&modern, "m").unwrap()
        );
        // A sliding-layer entry without its own base takes the local base, not the global.
        let mut partial = modern.clone();
        partial["rope_parameters"]["sliding_attention"] = json!({"rope_type": "default"});
        partial["rope_theta"] = json!(1_000_000.0);
        let window = model_config(&partial, "m").unwrap().sliding_window.unwrap();
        assert_eq!(window.rope_base, 10_000.0);
    }

    #[test]
    fn unimplemented_settings_are_refused() {
        let mut c = fixture_config("tiny-llama");
        c["partial_rotary_factor"] = json!(0.5);
        let err = model_config(&c, "m").unwrap_err().to_string();
        assert!(err.contains("partial_rotary_factor"), "{err}");

        let mut c = fixture_config("tiny-llama");
        c["hidden_act"] = json!("gelu");
        let err = model_config(&c, "m").unwrap_err().to_string();
        assert!(err.contains("activation"), "{err}");

        let mut c = fixture_config("tiny-gemma3");
        c["model_type"] = json!("gemma3");
        let err = model_config(&c, "m").unwrap_err().to_string();
        assert!(err.contains("multimodal"), "{err}");

        let mut c = fixture_config("tiny-gemma3");
        c["query_pre_attn_scalar"] = json!(0);
        let err = model_config(&c, "m").unwrap_err().to_string();
        assert!(err.contains("query_pre_attn_scalar"), "{err}");

        // Sized from head_dim only after head_dim is checked: an error, not an abort.
        let mut c = fixture_config("tiny-llama");
        c["head_dim"] = json!(1_000_000_000_000_000u64);
        let err = model_config(&c, "m").unwrap_err().to_string();
        assert!(err.contains("head_dim"), "{err}");

        let mut c = fixture_config("tiny-qwen2");
        c["rope_parameters"] = fixture_config("tiny-llama")["rope_parameters"].clone();
        let err = model_config(&c, "m").unwrap_err().to_string();
        assert!(err.contains("llama3 RoPE scaling on a qwen2"), "{err}");

        let mut c = fixture_config("tiny-gemma3");
        c["rope_parameters"]["full_attention"] = json!({"rope_type": "dynamic", "factor": 8.0});
        let err = model_config(&c, "m").unwrap_err().to_string();
        assert!(err.contains("'dynamic'"), "{err}");

        let mut c = fixture_config("tiny-qwen3");
        c["rope_parameters"]["factor"] = json!(0.0);
        let err = model_config(&c, "m").unwrap_err().to_string();
        assert!(err.contains("factor"), "{err}");
        c["rope_parameters"]["factor"] = json!(4.0);
        c["rope_parameters"]["extrapolation_factor"] = json!(0.5);
        let err = model_config(&c, "m").unwrap_err().to_string();
        assert!(err.contains("extrapolation_factor"), "{err}");
    }
}
