//! Greedy decode from the reference prompt ids must reproduce Hugging Face transformers'
//! fp32 output (testdata/refs, see its README for provenance).

use pyramid_kernels::{ops::argmax, ThreadPool};
use pyramid_model::{LogitsFor, Model, Scratch};
use pyramid_testdata::{ids, model_path, refs as golden};

fn load_model(file: &str) -> Model {
    Model::load(model_path(file)).expect("model loads")
}

/// A reference step whose top-1/top-2 gap is below this may legitimately flip under a
/// different (equally valid) fp32 summation order; from such a step on we stop comparing.
const TIE_GAP: f64 = 0.01;
/// Logit tolerance: both sides are fp32 over 30/24 layers with different summation
/// orders. Observed differences are at most 3e-5 on every reference prompt (AVX2 kernels);
/// 1e-3 leaves room for other ISAs' orders, while a wrong kernel, norm or RoPE gives
/// differences of tenths to whole units.
const LOGIT_TOL: f64 = 1e-3;

fn check_model(file: &str, golden_name: &str) {
    let model = load_model(file);
    let g = golden(golden_name);
    let mut max_logit_diff = 0.0f64;
    let pool = ThreadPool::with_available_parallelism();
    for prompt in g["prompts"].as_array().expect("prompts") {
        let id = prompt["id"].as_str().expect("id");
        let prompt_ids = ids(&prompt["prompt_token_ids"]);
        let expected = ids(&prompt["generated_token_ids"]);
        let gaps: Vec<f64> = prompt["top1_top2_gap"]
            .as_array()
            .expect("gaps")
            .iter()
            .map(|v| v.as_f64().expect("gap"))
            .collect();
        let tops = prompt["top_logits"].as_array().expect("top_logits");

        let mut kv = model.new_kv_cache(prompt_ids.len() + expected.len());
        let mut scratch = Scratch::default();
        let mut logits = model
            .forward(&pool, &prompt_ids, &mut kv, &mut scratch, LogitsFor::Last)
            .expect("prefill");
        let mut generated = Vec::new();
        for step in 0..expected.len() {
            if let Some(top) = tops
                .iter()
                .find(|t| t["chooses_generated_index"].as_u64() == Some(step as u64))
            {
                for pair in top["top"].as_array().expect("top") {
                    let tok = pair[0].as_u64().expect("tok") as usize;
                    let want = pair[1].as_f64().expect("logit");
                    let got = logits[tok] as f64;
                    max_logit_diff = max_logit_diff.max((got - want).abs());
                    assert!(
                        (got - want).abs() < LOGIT_TOL,
                        "{golden_name} {id} step {step}: logit of {tok} is {got}, reference {want}"
                    );
                }
            }
            let next = argmax(&logits);
            generated.push(next);
            if next != expected[step] {
                assert!(gaps[step] < TIE_GAP, "{golden_name} {id}: step {step} chose {next}, reference {} (gap {})\n got {generated:?}\nwant {expected:?}", expected[step], gaps[step]);
                eprintln!(
                    "{golden_name} {id}: near-tie at step {step} (gap {}), stopping comparison",
                    gaps[step]
                );
                break;
            }
            logits = model
                .forward(&pool, &[next], &mut kv, &mut scratch, LogitsFor::Last)
                .expect("decode");
        }
    }
    eprintln!("{golden_name}: largest top-5 logit difference to the reference {max_logit_diff:.5}");
}

const SMOLLM2: &str = "smollm2-135m-instruct-q4_1.gguf";
const QWEN25: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";
const GEMMA3: &str = "gemma-3-270m-q4_k_m.gguf";

#[test]
fn smollm2_greedy_matches_reference() {
    check_model(SMOLLM2, "golden-smollm2-135m-public.json");
}

#[test]
fn qwen2_greedy_matches_reference() {
    check_model(QWEN25, "golden-qwen2.5-coder-0.5b-public.json");
}

/// Prompts of ~1,300 tokens, and of ~1,000 tokens whose decode crosses position 1,024
/// (testdata/prompts-long.json; references made the same way, see testdata/README.md).
#[test]
fn smollm2_long_prompts_match_reference() {
    check_model(SMOLLM2, "golden-smollm2-135m-long.json");
}

#[test]
fn qwen2_long_prompts_match_reference() {
    check_model(QWEN25, "golden-qwen2.5-coder-0.5b-long.json");
}

/// Gemma 3 270M on the public text prompts (it has no chat template, so the chat prompt is
/// left out: testdata/prompts-public-text.json).
#[test]
fn gemma3_greedy_matches_reference() {
    check_model(GEMMA3, "golden-gemma3-270m-public.json");
}

/// Prompts of ~1,000 and ~1,300 tokens: past the 512-position sliding window of Gemma 3's
/// local layers, so their windows and the global layers' full attention are both checked.
#[test]
fn gemma3_long_prompts_match_reference() {
    check_model(GEMMA3, "golden-gemma3-270m-long.json");
}
