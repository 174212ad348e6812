//! Hugging Face directories (and, for the newer families, the GGUF files llama.cpp's
//! converter makes of them) against transformers, and every way such a directory can be
//! wrong.
//!
//! `testdata/hf/` holds tiny random-weight models transformers saved (`make.py` remakes
//! them): a Llama in F32 with Llama 3 RoPE scaling and an untied head, a Qwen2 in BF16
//! in three shards with a tied head, a Gemma 3 in F16 with sliding windows of 8 and an
//! attention scalar unlike its head size. `reference.json` has transformers' f32 logits
//! at every position of three prompts (the longest crosses the Gemma windows several
//! times; the generator checks that a wrong window, scale or layer layout moves them by
//! more than 1). `families.py` adds Qwen3 (YaRN), SmolLM3, Phi-3 (LongRoPE, partial
//! rotary) and Qwen3-MoE (8 experts, 3 per token), each also as a GGUF file.

use std::path::Path;

use pyramid_kernels::ThreadPool;
use pyramid_model::{
    Architecture, Checkpoint, LogitsFor, Model, ModelError, Pooling, Precision, Scratch, Segment,
};
use pyramid_testdata::{
    hf_fixture, hf_reference, ids, worst_logit_gap, FAMILY_FIXTURES, HF_FIXTURES,
};
use serde_json::Value;

/// Logits at every position of `tokens`.
fn all_logits(model: &Model, pool: &ThreadPool, tokens: &[u32]) -> Vec<f32> {
    let mut kv = model.new_kv_cache(tokens.len());
    model
        .forward(
            pool,
            tokens,
            &mut kv,
            &mut Scratch::default(),
            LogitsFor::All,
        )
        .unwrap()
}

#[test]
fn directories_give_transformers_logits() {
    let pool = ThreadPool::new(2).unwrap();
    for name in HF_FIXTURES {
        let reference = hf_reference(name);
        let model = Model::load(hf_fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        let n_vocab = model.config.n_vocab;
        assert_eq!(
            n_vocab as u64,
            reference["config"]["vocab_size"].as_u64().unwrap()
        );
        let mut worst = 0.0f64;
        for prompt in reference["prompts"].as_array().unwrap() {
            let logits = all_logits(&model, &pool, &ids(&prompt["ids"]));
            worst = worst.max(worst_logit_gap(&logits, &prompt["logits"]));
        }
        // f32 on both sides, summed in different orders; the reference is rounded to 1e-6.
        assert!(
            worst < 1e-4,
            "{name}: logits differ from transformers' by {worst}"
        );
    }
}

/// The pooled, normalised final hidden states of `tokens`.
fn embedding(model: &Model, pool: &ThreadPool, tokens: &[u32], pooling: Pooling) -> Vec<f32> {
    let mut kv = model.new_kv_cache(tokens.len());
    let mut sum = vec![0.0; model.config.n_embd];
    let rows = pooling.rows(0, tokens.len(), tokens.len());
    let mut segment = [Segment::pooled(tokens, &mut kv, rows, &mut sum)];
    model
        .forward_batch(pool, &mut segment, &mut Scratch::default(), LogitsFor::Last)
        .unwrap();
    pooling.finish(sum, tokens.len())
}

#[test]
fn directories_give_transformers_embeddings() {
    let pool = ThreadPool::new(2).unwrap();
    for name in HF_FIXTURES {
        let path = hf_fixture(name).join("embeddings.json");
        let reference: Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let model = Model::load(hf_fixture(name)).unwrap();
        for prompt in reference["prompts"].as_array().unwrap() {
            let tokens = ids(&prompt["ids"]);
            for pooling in Pooling::ALL {
                let got = embedding(&model, &pool, &tokens, pooling);
                let want: Vec<f64> = prompt[pooling.name()]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_f64().unwrap())
                    .collect();
                assert_eq!(got.len(), want.len());
                let worst = got
                    .iter()
                    .zip(&want)
                    .map(|(g, w)| (f64::from(*g) - w).abs())
                    .fold(0.0, f64::max);
                let cosine: f64 = got.iter().zip(&want).map(|(g, w)| f64::from(*g) * w).sum();
                assert!(
                    worst < 1e-4 && cosine >= 0.9999,
                    "{name} {pooling:?}: off by {worst}, cosine {cosine}"
                );
            }
        }
    }
}

#[test]
fn sentence_transformers_pooling_is_read_or_refused_by_name() {
    let dir = broken_copy("tiny-llama");
    assert_eq!(Checkpoint::open(dir.path()).unwrap().config().pooling, None);
    std::fs::create_dir(dir.path().join("1_Pooling")).unwrap();
    let pooling = dir.path().join("1_Pooling").join("config.json");
    let write = |json: Value| std::fs::write(&pooling, json.to_string()).unwrap();
    write(serde_json::json!({"word_embedding_dimension": 64, "pooling_mode_lasttoken": true}));
    let config = Checkpoint::open(dir.path()).unwrap().config().clone();
    assert_eq!(config.pooling, Some(Pooling::Last));
    write(serde_json::json!({"pooling_mode_max_tokens": true}));
    let err = open_error(dir.path());
    assert!(err.contains("pooling_mode_max_tokens"), "{err}");
    write(serde_json::json!({"pooling_mode_mean_tokens": true, "pooling_mode_cls_token": true}));
    assert!(open_error(dir.path()).contains("more than one"));
}

/// `n` greedy tokens after `prompt`.
fn greedy(model: &Model, pool: &ThreadPool, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut kv = model.new_kv_cache(prompt.len() + n);
    let mut scratch = Scratch::default();
    let mut next = prompt.to_vec();
    let mut out = Vec::new();
    for _ in 0..n {
        let logits = model
            .forward(pool, &next, &mut kv, &mut scratch, LogitsFor::Last)
            .unwrap();
        let best = (0..logits.len())
            .max_by(|&a, &b| logits[a].total_cmp(&logits[b]).then(b.cmp(&a)))
            .unwrap() as u32;
        out.push(best);
        next = vec![best];
    }
    out
}

/// The newer families (`families.py`) from a directory and from the GGUF file llama.cpp's
/// converter made of it: f32 logits at every position within 1e-4, and transformers'
/// greedy tokens from both.
#[test]
fn directories_and_converted_files_give_transformers_logits_and_tokens() {
    let pool = ThreadPool::new(2).unwrap();
    for name in FAMILY_FIXTURES {
        let reference = hf_reference(name);
        let dir = hf_fixture(name);
        let file = dir.join(format!("{name}.gguf"));
        for (form, path) in [("directory", &dir), ("gguf", &file)] {
            let model = Model::load(path).unwrap_or_else(|e| panic!("{name} {form}: {e}"));
            let mut worst = 0.0f64;
            for prompt in reference["prompts"].as_array().unwrap() {
                let tokens = ids(&prompt["ids"]);
                let logits = all_logits(&model, &pool, &tokens);
                worst = worst.max(worst_logit_gap(&logits, &prompt["logits"]));
                let want = ids(&prompt["greedy"]);
                assert_eq!(
                    greedy(&model, &pool, &tokens, want.len()),
                    want,
                    "{name} {form}: greedy tokens"
                );
            }
            eprintln!("{name} {form}: logits within {worst:.1e} of transformers");
            assert!(worst < 1e-4, "{name} {form}: logits off by {worst}");
        }
    }
}

#[test]
fn qwen3_reads_its_head_size_and_norms() {
    let model = Model::load(hf_fixture("tiny-qwen3")).unwrap();
    let c = &model.config;
    assert_eq!(c.arch, Architecture::Qwen3);
    assert_eq!((c.n_embd, c.n_head, c.head_dim), (64, 4, 32));
    // YaRN (factor 4): cos and sin times its attention factor, frequencies divided.
    assert_eq!(c.attention_scale, 1.0 / 32f32.sqrt());
    assert!((c.rope_scale - (0.1 * 4f32.ln() + 1.0)).abs() < 1e-6);
    let divisors = c
        .rope_factors
        .as_ref()
        .expect("YaRN divides the frequencies");
    assert_eq!((divisors[0], divisors[15]), (1.0, 4.0));
    let file = Model::load(hf_fixture("tiny-qwen3").join("tiny-qwen3.gguf")).unwrap();
    assert_eq!(file.config.rope_factors.as_ref(), Some(divisors));
}

#[test]
fn smollm3_skips_rope_in_every_fourth_layer_in_both_forms() {
    let dir = hf_fixture("tiny-smollm3");
    for path in [dir.clone(), dir.join("tiny-smollm3.gguf")] {
        let model = Model::load(&path).unwrap();
        assert_eq!(model.config.arch, Architecture::SmolLM3);
        assert_eq!(model.config.no_rope_layers, [3], "{}", path.display());
        assert!(model.config.layer_rotates(2) && !model.config.layer_rotates(3));
    }
}

#[test]
fn phi3_rotates_half_of_each_head_with_long_factors_in_both_forms() {
    let dir = hf_fixture("tiny-phi3");
    for path in [dir.clone(), dir.join("tiny-phi3.gguf")] {
        let c = Model::load(&path).unwrap().config;
        assert_eq!(c.arch, Architecture::Phi3);
        assert_eq!((c.n_rot, c.head_dim), (8, 16), "{}", path.display());
        // A context (256) beyond the original (8): the long factors.
        assert_eq!(c.rope_factors.as_deref(), Some(&[1.1, 2.5, 6.0, 12.0][..]));
        let factor = (1.0 + 32f32.ln() / 8f32.ln()).sqrt();
        assert!((c.rope_scale - factor).abs() < 1e-5, "{}", c.rope_scale);
    }
}

#[test]
fn qwen3_moe_reads_its_experts_in_both_forms() {
    let dir = hf_fixture("tiny-qwen3moe");
    for path in [dir.clone(), dir.join("tiny-qwen3moe.gguf")] {
        let c = Model::load(&path).unwrap().config;
        assert_eq!(c.arch, Architecture::Qwen3Moe);
        let x = c.experts.as_ref().expect("routed experts");
        let shape = (x.n_expert, x.n_used, x.n_ff, x.normalize);
        assert_eq!(shape, (8, 3, 48, true), "{}", path.display());
        assert!(c.layer_experts(0).is_some() && c.layer_experts(1).is_some());
    }
}

/// A mixture-of-experts pass, whose rows are regrouped by expert, is the same bit for
/// bit on any number of threads and whether its tokens come at once or one by one; every
/// precision loads and stays near f32.
#[test]
fn qwen3_moe_passes_are_the_same_however_run_at_every_precision() {
    let checkpoint = Checkpoint::open(hf_fixture("tiny-qwen3moe")).unwrap();
    let tokens = ids(&hf_reference("tiny-qwen3moe")["prompts"][2]["ids"]);
    let (one, three) = (ThreadPool::new(1).unwrap(), ThreadPool::new(3).unwrap());
    let f32_model = Model::from_checkpoint(&checkpoint, Precision::F32, None).unwrap();
    let reference = all_logits(&f32_model, &three, &tokens);
    let mut kv = f32_model.new_kv_cache(tokens.len());
    let mut scratch = Scratch::default();
    let stepped: Vec<f32> = tokens
        .iter()
        .flat_map(|&t| {
            f32_model
                .forward(&one, &[t], &mut kv, &mut scratch, LogitsFor::All)
                .unwrap()
        })
        .collect();
    assert_eq!(stepped, reference, "token by token");
    let calibration = Model::calibrate_streamed(&checkpoint, &three, &tokens).unwrap();
    for (precision, min_cosine) in [
        (Precision::Bf16, 0.9995),
        (Precision::Int8, 0.998),
        (Precision::Int4, 0.85),
    ] {
        let model = Model::from_checkpoint(&checkpoint, precision, Some(&calibration)).unwrap();
        let logits = all_logits(&model, &three, &tokens);
        assert_eq!(logits, all_logits(&model, &one, &tokens), "{precision}");
        let cosine = cosine(&logits, &reference);
        assert!(cosine > min_cosine, "{precision}: cosine {cosine} to f32");
    }
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| f64::from(x * y)).sum();
    let norm = |v: &[f32]| v.iter().map(|x| f64::from(x * x)).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b))
}

#[test]
fn configurations_read_as_transformers_means_them() {
    let llama = Checkpoint::open(hf_fixture("tiny-llama")).unwrap();
    let factors = llama
        .config()
        .rope_factors
        .as_ref()
        .expect("llama3 scaling");
    assert_eq!(factors.len(), 8);
    assert_eq!(factors[0], 1.0);
    assert_eq!(factors[7], 8.0);
    let gemma = Checkpoint::open(hf_fixture("tiny-gemma3")).unwrap();
    let c = gemma.config();
    let window = c.sliding_window.expect("Gemma 3 has local layers");
    assert_eq!((window.size, window.global_every), (8, 6));
    assert_eq!((window.rope_base, c.rope_base), (10_000.0, 1_000_000.0));
    assert_eq!(c.attention_scale, 1.0 / 24f32.sqrt());
    assert_eq!(c.embedding_scale, 8.0);
    let qwen = Checkpoint::open(hf_fixture("tiny-qwen2")).unwrap();
    assert!(!qwen.tensors().has_tensor("output.weight"), "tied head");
    assert!(qwen.tensors().has_tensor("blk.1.attn_q.bias"));
}

/// Every precision loads from a directory as from GGUF: BF16 close to f32, the integer
/// ones near it (the same quantisers, tested on real models in `precision.rs`; random
/// 64-wide weights are their worst case: measured cosines 0.9993–0.9998 for INT8 and
/// 0.92–0.98 for INT4).
#[test]
fn every_precision_loads_from_a_directory() {
    let pool = ThreadPool::new(2).unwrap();
    for name in HF_FIXTURES {
        let checkpoint = Checkpoint::open(hf_fixture(name)).unwrap();
        let tokens = ids(&hf_reference(name)["prompts"][1]["ids"]);
        let reference = all_logits(
            &Model::from_checkpoint(&checkpoint, Precision::F32, None).unwrap(),
            &pool,
            &tokens,
        );
        let calibration = Model::calibrate_streamed(&checkpoint, &pool, &tokens).unwrap();
        for (precision, min_cosine) in [
            (Precision::Bf16, 0.9995),
            (Precision::Int8, 0.998),
            (Precision::Int4, 0.85),
        ] {
            let model = Model::from_checkpoint(&checkpoint, precision, Some(&calibration)).unwrap();
            let logits = all_logits(&model, &pool, &tokens);
            let cosine = cosine(&logits, &reference);
            assert!(
                cosine > min_cosine,
                "{name} {precision}: cosine {cosine} to the f32 logits"
            );
        }
    }
}

/// Copies a fixture into a temporary directory to break it.
fn broken_copy(name: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(hf_fixture(name)).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
    }
    dir
}

fn edit_config(dir: &Path, edit: impl FnOnce(&mut serde_json::Map<String, Value>)) {
    let path = dir.join("config.json");
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(config.as_object_mut().unwrap());
    std::fs::write(&path, config.to_string()).unwrap();
}

fn open_error(dir: &Path) -> String {
    match Checkpoint::open(dir) {
        Ok(_) => panic!("{} opened", dir.display()),
        Err(e) => e.to_string(),
    }
}

/// A safetensors file with one tensor, written by the `safetensors` crate.
fn write_safetensors(path: &Path, name: &str, dtype: safetensors::Dtype, shape: &[usize]) {
    let n: usize = shape.iter().product();
    let data = vec![0u8; n * dtype.bitsize() / 8];
    let view = safetensors::tensor::TensorView::new(dtype, shape.to_vec(), &data).unwrap();
    safetensors::serialize_to_file([(name, view)], None, path).unwrap();
}

/// What a case does to its copy of a fixture.
type Breakage = Box<dyn Fn(&Path)>;

#[test]
fn a_broken_directory_is_an_error_naming_the_problem() {
    let missing = tempfile::tempdir().unwrap();
    assert!(open_error(missing.path()).contains("no config.json"));

    let cases: Vec<(&str, Breakage, &str)> = vec![
        (
            "tiny-llama",
            Box::new(|d| {
                edit_config(d, |c| {
                    c.insert("model_type".into(), "mistral".into());
                })
            }),
            "model_type 'mistral' is not supported",
        ),
        (
            "tiny-llama",
            Box::new(|d| {
                edit_config(d, |c| {
                    c["rope_parameters"]["rope_type"] = "dynamic".into();
                })
            }),
            "RoPE scaling 'dynamic'",
        ),
        (
            "tiny-gemma3",
            Box::new(|d| {
                edit_config(d, |c| {
                    c.insert("final_logit_softcapping".into(), 30.0.into());
                })
            }),
            "final_logit_softcapping",
        ),
        (
            "tiny-gemma3",
            Box::new(|d| {
                edit_config(d, |c| {
                    c["layer_types"][0] = "full_attention".into();
                })
            }),
            "layer_types",
        ),
        (
            "tiny-gemma3",
            Box::new(|d| {
                edit_config(d, |c| {
                    c.insert("use_bidirectional_attention".into(), true.into());
                })
            }),
            "use_bidirectional_attention",
        ),
        (
            "tiny-qwen2",
            Box::new(|d| {
                edit_config(d, |c| {
                    c.insert("use_sliding_window".into(), true.into());
                })
            }),
            "use_sliding_window",
        ),
        (
            "tiny-llama",
            Box::new(|d| {
                edit_config(d, |c| {
                    c.remove("hidden_size");
                })
            }),
            "no 'hidden_size'",
        ),
        (
            "tiny-llama",
            Box::new(|d| {
                write_safetensors(
                    &d.join("extra.safetensors"),
                    "model.layers.0.mlp.gate_proj.bias",
                    safetensors::Dtype::F32,
                    &[96],
                )
            }),
            "tensor 'model.layers.0.mlp.gate_proj.bias' is not part of a llama model",
        ),
        (
            "tiny-llama",
            Box::new(|d| {
                std::fs::remove_file(d.join("model.safetensors")).unwrap();
                write_safetensors(
                    &d.join("model.safetensors"),
                    "model.norm.weight",
                    safetensors::Dtype::I8,
                    &[64],
                )
            }),
            "is I8; weights load from F32, F16 or BF16",
        ),
        (
            "tiny-llama",
            Box::new(|d| {
                let path = d.join("model.safetensors");
                let bytes = std::fs::read(&path).unwrap();
                std::fs::write(&path, &bytes[..bytes.len() - 7]).unwrap();
            }),
            "not a valid safetensors file",
        ),
        (
            "tiny-llama",
            Box::new(|d| {
                // Untied, but the head is gone.
                let path = d.join("model.safetensors");
                let bytes = std::fs::read(&path).unwrap();
                let tensors = safetensors::SafeTensors::deserialize(&bytes).unwrap();
                let kept: Vec<_> = tensors
                    .tensors()
                    .into_iter()
                    .filter(|(n, _)| n != "lm_head.weight")
                    .collect();
                safetensors::serialize_to_file(kept, None, &d.join("model.tmp")).unwrap();
                std::fs::rename(d.join("model.tmp"), &path).unwrap();
            }),
            "no lm_head.weight",
        ),
        (
            "tiny-qwen2",
            Box::new(|d| std::fs::remove_file(d.join("model-00002-of-00003.safetensors")).unwrap()),
            "model-00002-of-00003.safetensors', which is not a file here",
        ),
    ];
    for (name, breaks, expected) in cases {
        let dir = broken_copy(name);
        breaks(dir.path());
        let err = open_error(dir.path());
        assert!(
            err.contains(expected),
            "{name}: {err:?} does not say {expected:?}"
        );
    }
}

/// A shape that disagrees with `config.json` fails the load with the tensor's name.
#[test]
fn a_tensor_of_the_wrong_shape_fails_the_load() {
    let dir = broken_copy("tiny-llama");
    edit_config(dir.path(), |c| {
        c.insert("intermediate_size".into(), 128.into());
    });
    let checkpoint = Checkpoint::open(dir.path()).unwrap();
    match Model::from_checkpoint(&checkpoint, Precision::F32, None) {
        Err(ModelError::TensorShape { name, .. }) => assert_eq!(name, "blk.0.ffn_gate.weight"),
        other => panic!("{:?}", other.map(|_| ())),
    }
}
