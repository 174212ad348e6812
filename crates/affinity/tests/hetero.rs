//! Prefill split between the native kernels and OpenVINO's CPU plugin, on tiny random
//! models in f32: the session's cache and logits are the single-device run's (to f32
//! rounding), greedy tokens after it are identical, both executors ran tasks, and shapes
//! it cannot run are errors.
//!
//! Needs OpenVINO (`scripts/setup-openvino.sh`, which the test script runs).

use std::sync::Arc;

use pyramid_affinity::hetero::HeteroBackend;
use pyramid_affinity::schedule::Assignment;
use pyramid_gguf::GgufFile;
use pyramid_kernels::ThreadPool;
use pyramid_model::synthetic::{synthetic_gguf, SyntheticSpec};
use pyramid_model::{Architecture, KvType, LogitsFor, Model, Scratch};
use pyramid_openvino::{OvBackend, OvOptions, WeightFormat};
use pyramid_runtime::{argmax, prefill_chunked, ArtifactShape, Backend};

fn tiny(arch: Architecture) -> Arc<Model> {
    let bytes = synthetic_gguf(&SyntheticSpec::tiny(arch))
        .unwrap()
        .to_bytes();
    Arc::new(Model::from_gguf(&GgufFile::from_bytes(bytes).unwrap()).unwrap())
}

fn greedy(
    model: &Model,
    pool: &ThreadPool,
    kv: &mut pyramid_model::KvCache,
    first: u32,
    n: usize,
) -> Vec<u32> {
    let mut tokens = vec![first];
    for _ in 1..n {
        let logits = model
            .forward(
                pool,
                &tokens[tokens.len() - 1..],
                kv,
                &mut Scratch::default(),
                LogitsFor::Last,
            )
            .unwrap();
        tokens.push(argmax(&logits));
    }
    tokens
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max)
}

#[test]
fn a_split_prefill_leaves_the_single_device_cache_and_tokens() {
    let pool = ThreadPool::new(2).unwrap();
    for arch in [Architecture::Qwen2, Architecture::Gemma3] {
        let model = tiny(arch);
        let options = OvOptions::for_device("CPU", Some(1), &[]).unwrap();
        let ov = OvBackend::new(Arc::clone(&model), "CPU", WeightFormat::F32, options).unwrap();
        let hetero = HeteroBackend::new(Arc::clone(&model), Arc::new(ov));
        assert_eq!(hetero.device(), "cpu+ov:CPU");
        let window = 64;
        let prefill = hetero
            .compile(ArtifactShape::Prefill { chunk: 16, window })
            .unwrap();
        assert!(
            prefill.executing_device().contains("CPU"),
            "{}",
            prefill.executing_device()
        );
        // 37 tokens: two full chunks and a padded one, past the tiny Gemma's window of 8.
        let prompt: Vec<u32> = (0..37u32).map(|i| (i * 31 + 5) % 250).collect();
        let mut split_kv = model.new_kv_cache_of(window, KvType::F32);
        let mut logits = Vec::new();
        prefill_chunked(&*prefill, &pool, &prompt, &mut split_kv, &mut logits).unwrap();
        assert_eq!(split_kv.len(), prompt.len());

        let mut native_kv = model.new_kv_cache_of(window, KvType::F32);
        let expected = model
            .forward(
                &pool,
                &prompt,
                &mut native_kv,
                &mut Scratch::default(),
                LogitsFor::Last,
            )
            .unwrap();
        let diff = max_abs_diff(&logits, &expected);
        assert!(diff < 1e-3, "{arch:?}: logits differ by {diff}");
        let first = argmax(&expected);
        assert_eq!(argmax(&logits), first);
        assert_eq!(
            greedy(&model, &pool, &mut split_kv, first, 12),
            greedy(&model, &pool, &mut native_kv, first, 12),
            "{arch:?}"
        );
    }
}

#[test]
fn both_executors_run_and_unrunnable_shapes_are_errors() {
    let model = tiny(Architecture::Llama);
    let options = OvOptions::for_device("CPU", Some(1), &[]).unwrap();
    let ov = OvBackend::new(Arc::clone(&model), "CPU", WeightFormat::F32, options).unwrap();
    let hetero = HeteroBackend::new(Arc::clone(&model), Arc::new(ov));
    let window = 32;
    let err = hetero
        .compile(ArtifactShape::Decode { batch: 1, window })
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("prefill only"), "{err}");
    let err = hetero
        .compile(ArtifactShape::Prefill { chunk: 10, window })
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("multiple of 4"), "{err}");
    let shape = ArtifactShape::Prefill { chunk: 8, window };
    let executable = hetero.compile_split(shape).unwrap();
    let pool = ThreadPool::new(2).unwrap();
    let mut kv = model.new_kv_cache_of(window, KvType::F32);
    let mut logits = Vec::new();
    prefill_chunked(
        &executable,
        &pool,
        &[1, 2, 3, 4, 5, 6, 7, 8],
        &mut kv,
        &mut logits,
    )
    .unwrap();
    let stats = executable.last_schedule();
    assert_eq!(stats.tasks[0] + stats.tasks[1], 4 * model.config.n_layer);
    assert!(stats.tasks[0] > 0 && stats.tasks[1] > 0, "{stats:?}");
}

/// Given each layer's cost on both executors, the layers run where the plan puts them,
/// and the prompt's logits are the free-for-all's.
#[test]
fn layers_placed_from_costs_run_where_the_plan_says() {
    let spec = SyntheticSpec {
        n_layer: 6,
        ..SyntheticSpec::tiny(Architecture::Llama)
    };
    let bytes = synthetic_gguf(&spec).unwrap().to_bytes();
    let model = Arc::new(Model::from_gguf(&GgufFile::from_bytes(bytes).unwrap()).unwrap());
    let n_layer = model.config.n_layer;
    let backend = || {
        let options = OvOptions::for_device("CPU", Some(1), &[]).unwrap();
        let ov = OvBackend::new(Arc::clone(&model), "CPU", WeightFormat::F32, options).unwrap();
        HeteroBackend::new(Arc::clone(&model), Arc::new(ov))
    };
    let err = backend()
        .with_costs(vec![[1.0, 1.0]; n_layer + 1])
        .err()
        .unwrap();
    assert!(err.to_string().contains("layers"), "{err}");
    // The device runs layers 2 and 5 ten times slower than its others, which it runs
    // twice as fast as the native kernels: a free-for-all would hand it some of them.
    let mut costs = vec![[2e-3, 1e-3]; n_layer];
    costs[2][1] = 1e-2;
    costs[5][1] = 1e-2;
    let placed = backend().with_costs(costs).unwrap();
    let (window, chunk) = (32, 8);
    let plan = placed.plan_for(chunk).unwrap().unwrap();
    assert!(plan.predicted < plan.predicted_either, "{plan:?}");
    assert_eq!(plan.assignment[2], Assignment::Native, "{plan:?}");
    assert_eq!(plan.assignment[5], Assignment::Native, "{plan:?}");
    let on = |place| plan.assignment.iter().filter(|a| **a == place).count();
    assert_eq!(on(Assignment::Either), 0, "{plan:?}");
    let free = backend();
    assert!(free.plan_for(chunk).is_none());

    let pool = ThreadPool::new(2).unwrap();
    let prompt: Vec<u32> = (0..8u32).map(|i| (i * 17 + 3) % 250).collect();
    let run = |backend: &HeteroBackend| {
        let executable = backend
            .compile_split(ArtifactShape::Prefill { chunk, window })
            .unwrap();
        let mut kv = model.new_kv_cache_of(window, KvType::F32);
        let mut logits = Vec::new();
        prefill_chunked(&executable, &pool, &prompt, &mut kv, &mut logits).unwrap();
        (logits, executable.last_schedule())
    };
    let (placed_logits, stats) = run(&placed);
    assert_eq!(
        stats.tasks,
        [4 * on(Assignment::Native), 4 * on(Assignment::Device)],
        "{stats:?}"
    );
    let (free_logits, _) = run(&free);
    let diff = max_abs_diff(&placed_logits, &free_logits);
    assert!(diff < 1e-4, "logits differ by {diff}");
}
