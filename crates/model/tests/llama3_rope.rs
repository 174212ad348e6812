//! Llama 3 RoPE scaling (`rope_freqs.weight`) against Hugging Face transformers.
//!
//! `testdata/llama3-rope/` holds a tiny random-weight Llama that transformers made with
//! `rope_scaling = llama3` (original context 64, so the scaling acts within a few dozen
//! positions), written as GGUF the way llama.cpp's converter writes Llama 3, and
//! transformers' f32 logits at each of 48 positions. `make.py` there remakes both; it
//! checks that dropping the scaling moves the logits by more than 0.05 (by 4.97), so a
//! loader ignoring the factors fails here.

use std::path::PathBuf;

use pyramid_kernels::ThreadPool;
use pyramid_model::{LogitsFor, Model, Scratch};
use serde_json::Value;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/llama3-rope")
        .join(name)
}

#[test]
fn llama3_rope_scaling_matches_transformers() {
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("reference.json")).unwrap()).unwrap();
    let model = Model::load(fixture("tiny-llama3.gguf")).expect("a Llama 3 file loads");
    let factors: Vec<f32> = reference["rope_factors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap() as f32)
        .collect();
    assert_eq!(model.config.rope_factors.as_deref(), Some(&factors[..]));
    let tokens: Vec<u32> = reference["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    let pool = ThreadPool::new(2).unwrap();
    let mut kv = model.new_kv_cache(tokens.len());
    let logits = model
        .forward(
            &pool,
            &tokens,
            &mut kv,
            &mut Scratch::default(),
            LogitsFor::All,
        )
        .unwrap();
    let worst = pyramid_testdata::worst_logit_gap(&logits, &reference["logits"]);
    // Both sides are f32 with different summation orders; the fixture's logits are rounded
    // to 1e-6.
    assert!(
        worst < 1e-4,
        "logits differ from transformers' by up to {worst}"
    );
}
