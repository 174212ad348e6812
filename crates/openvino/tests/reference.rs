//! Real models on `ov:CPU` (f32 weights, f32 inference): greedy tokens on the public
//! reference prompts must equal the native f32 path's, for Llama (SmolLM2), Qwen2 and
//! Gemma 3.
//!
//! Needs OpenVINO (`scripts/setup-openvino.sh`) and the cached models (`pyramid fetch`);
//! `scripts/test.sh` provides both.

use std::sync::Arc;

use pyramid_kernels::ThreadPool;
use pyramid_model::{KvCache, KvType, Model, Segment};
use pyramid_openvino::{OvBackend, OvOptions, WeightFormat};
use pyramid_runtime::{argmax, prefill_chunked, ArtifactShape, Backend, CpuBackend, Executable};
use pyramid_testdata::{ids, model_path, refs as golden};

/// A reference step whose top-1/top-2 gap is below this may flip under another (equally
/// valid) f32 summation order; comparison stops there, as in the model crate's golden test.
const TIE_GAP: f64 = 0.01;
const CHUNK: usize = 128;

fn load(file: &str) -> Arc<Model> {
    Arc::new(Model::load(model_path(file)).expect("model loads"))
}

fn greedy(
    prefill: &dyn Executable,
    decode: &dyn Executable,
    pool: &ThreadPool,
    kv: &mut KvCache,
    prompt: &[u32],
    n: usize,
) -> Vec<u32> {
    let mut logits = Vec::new();
    prefill_chunked(prefill, pool, prompt, kv, &mut logits).expect("prefill");
    let mut out = vec![argmax(&logits)];
    while out.len() < n {
        let t = [*out.last().unwrap()];
        decode
            .run(pool, &mut [Segment::new(&t, kv)], &mut logits)
            .expect("decode");
        out.push(argmax(&logits));
    }
    out
}

/// Greedy tokens on `ov:CPU` against the native f32 path, caches of `window` positions.
fn check(file: &str, golden_name: &str, window: usize) {
    let model = load(file);
    let pool = ThreadPool::with_available_parallelism();
    let options = OvOptions::for_device("CPU", Some(pool.n_threads()), &[]).unwrap();
    let ov = OvBackend::new(Arc::clone(&model), "CPU", WeightFormat::F32, options).expect("ov:CPU");
    let native = CpuBackend::new(Arc::clone(&model), pool.n_threads());
    let shapes = [
        ArtifactShape::Prefill {
            chunk: CHUNK,
            window,
        },
        ArtifactShape::Decode { batch: 1, window },
    ];
    let [ov_prefill, ov_decode] = shapes.map(|s| ov.compile(s).expect("compiles"));
    let [cpu_prefill, cpu_decode] = shapes.map(|s| native.compile(s).expect("compiles"));
    assert_eq!(ov_decode.executing_device(), "CPU");

    let g = golden(golden_name);
    for prompt in g["prompts"].as_array().expect("prompts") {
        let id = prompt["id"].as_str().expect("id");
        let prompt_ids = ids(&prompt["prompt_token_ids"]);
        let n = ids(&prompt["generated_token_ids"]).len();
        let gaps: Vec<f64> = prompt["top1_top2_gap"]
            .as_array()
            .expect("gaps")
            .iter()
            .map(|v| v.as_f64().expect("gap"))
            .collect();
        let mut kv = model.new_kv_cache_of(window, KvType::F32);
        let want = greedy(
            cpu_prefill.as_ref(),
            cpu_decode.as_ref(),
            &pool,
            &mut kv,
            &prompt_ids,
            n,
        );
        let mut kv = model.new_kv_cache_of(window, KvType::F32);
        let got = greedy(
            ov_prefill.as_ref(),
            ov_decode.as_ref(),
            &pool,
            &mut kv,
            &prompt_ids,
            n,
        );
        if let Some(step) = got.iter().zip(&want).position(|(a, b)| a != b) {
            assert!(
                gaps[step] < TIE_GAP,
                "{golden_name} {id}: ov:CPU chose {} at step {step}, native {} (reference gap {})\n ov: {got:?}\n cpu: {want:?}",
                got[step],
                want[step],
                gaps[step]
            );
            eprintln!("{golden_name} {id}: near-tie at step {step}, stopping comparison");
        }
    }
}

#[test]
fn smollm2_on_openvino_cpu_matches_native_f32() {
    check(
        "smollm2-135m-instruct-q4_1.gguf",
        "golden-smollm2-135m-public.json",
        512,
    );
}

#[test]
fn qwen2_on_openvino_cpu_matches_native_f32() {
    check(
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "golden-qwen2.5-coder-0.5b-public.json",
        512,
    );
}

#[test]
fn gemma3_on_openvino_cpu_matches_native_f32() {
    check(
        "gemma-3-270m-q4_k_m.gguf",
        "golden-gemma3-270m-public.json",
        512,
    );
}

/// Prompts of 1,000 and 1,300 tokens: Gemma 3's local layers see 512 of them, through the
/// graph's second mask.
#[test]
fn gemma3_long_prompts_on_openvino_cpu_match_native_f32() {
    check(
        "gemma-3-270m-q4_k_m.gguf",
        "golden-gemma3-270m-long.json",
        2048,
    );
}
