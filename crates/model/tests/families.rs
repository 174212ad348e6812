//! The newer families against transformers, from a Hugging Face directory and from the
//! GGUF file llama.cpp's converter made of it (`testdata/hf/families.py`): f32 logits
//! at every position within 1e-4, and transformers' greedy tokens from both.

use pyramid_kernels::ThreadPool;
use pyramid_model::{Architecture, LogitsFor, Model, Scratch};
use pyramid_testdata::{hf_fixture, hf_reference, ids, FAMILY_FIXTURES};

/// Logits at every position of `tokens`.
fn all_logits(model: &Model, pool: &ThreadPool, tokens: &[u32]) -> Vec<f32> {
    let mut kv = model.new_kv_cache(tokens.len());
    let mut scratch = Scratch::default();
    model
        .forward(pool, tokens, &mut kv, &mut scratch, LogitsFor::All)
        .unwrap()
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

#[test]
fn directories_and_converted_files_give_transformers_logits_and_tokens() {
    let pool = ThreadPool::new(2).unwrap();
    for name in FAMILY_FIXTURES {
        let reference = hf_reference(name);
        let dir = hf_fixture(name);
        let file = dir.join(format!("{name}.gguf"));
        for (form, path) in [("directory", &dir), ("gguf", &file)] {
            let model = Model::load(path).unwrap_or_else(|e| panic!("{name} {form}: {e}"));
            let n_vocab = model.config.n_vocab;
            let mut worst = 0.0f64;
            for prompt in reference["prompts"].as_array().unwrap() {
                let tokens = ids(&prompt["ids"]);
                let logits = all_logits(&model, &pool, &tokens);
                for (pos, want) in prompt["logits"].as_array().unwrap().iter().enumerate() {
                    for (i, w) in want.as_array().unwrap().iter().enumerate() {
                        let got = f64::from(logits[pos * n_vocab + i]);
                        worst = worst.max((got - w.as_f64().unwrap()).abs());
                    }
                }
                let want = ids(&prompt["greedy"]);
                assert_eq!(
                    greedy(&model, &pool, &tokens, want.len()),
                    want,
                    "{name} {form}: greedy tokens"
                );
            }
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
