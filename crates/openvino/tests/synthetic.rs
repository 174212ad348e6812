//! The OpenVINO graphs against the native f32 path on tiny random-weight models of both
//! RoPE styles and of Gemma 3 (sliding windows of 8 positions), on OpenVINO's CPU plugin (f32): prefill chunks, batched decode with
//! fewer sequences than slots, migration between windows (compact caches copy, reserved ones only move their bound), and a route that prefills on
//! one backend and decodes on the other.
//!
//! Needs OpenVINO (`scripts/setup-openvino.sh`, which the test script runs).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use pyramid_gguf::GgufFile;
use pyramid_kernels::ThreadPool;
use pyramid_model::synthetic::{synthetic_gguf, SyntheticSpec};
use pyramid_model::{Architecture, KvCache, KvType, LogitsFor, Model, Precision, Scratch, Segment};
use pyramid_openvino::{
    DecodeLayout, OutlierChannels, OvBackend, OvOptions, WeightFormat, DECODE_LAYOUT_KEY,
};
use pyramid_runtime::{prefill_chunked, prefill_stepping, ArtifactShape, Backend, Executable};

fn tiny(arch: Architecture, untied: bool) -> Arc<Model> {
    let spec = SyntheticSpec {
        untied_output: untied,
        ..SyntheticSpec::tiny(arch)
    };
    let bytes = synthetic_gguf(&spec).unwrap().to_bytes();
    Arc::new(Model::from_gguf(&GgufFile::from_bytes(bytes).unwrap()).unwrap())
}

fn ov_cpu(model: &Arc<Model>, format: WeightFormat) -> OvBackend {
    let options = OvOptions::for_device("CPU", Some(2), &[]).unwrap();
    OvBackend::new(Arc::clone(model), "CPU", format, options).expect("OpenVINO CPU plugin")
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn prompt(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 31 + salt * 7 + 5) % 250)
        .collect()
}

/// Native logits after `tokens`, each position run one by one through a fresh cache.
fn native_last_logits(model: &Model, pool: &ThreadPool, tokens: &[u32]) -> Vec<f32> {
    let mut kv = model.new_kv_cache(tokens.len());
    model
        .forward(
            pool,
            tokens,
            &mut kv,
            &mut Scratch::default(),
            LogitsFor::Last,
        )
        .unwrap()
}

#[test]
fn prefill_and_decode_match_native_f32_for_both_rope_styles() {
    let pool = ThreadPool::new(2).unwrap();
    for (arch, untied) in [
        (Architecture::Llama, true),
        (Architecture::Qwen2, false),
        (Architecture::Gemma3, false),
    ] {
        let model = tiny(arch, untied);
        let ov = ov_cpu(&model, WeightFormat::F32);
        let window = 64;
        let prefill = ov
            .compile(ArtifactShape::Prefill { chunk: 16, window })
            .unwrap();
        let decode = ov
            .compile(ArtifactShape::Decode { batch: 1, window })
            .unwrap();
        assert_eq!(prefill.executing_device(), "CPU");

        // 37 tokens: two full chunks and a padded one.
        let tokens = prompt(37, 1);
        let mut kv = model.new_kv_cache_of(window, KvType::F32);
        let mut logits = Vec::new();
        prefill_chunked(prefill.as_ref(), &pool, &tokens, &mut kv, &mut logits).unwrap();
        assert_eq!(kv.len(), 37);
        let expected = native_last_logits(&model, &pool, &tokens);
        let d = max_diff(&logits, &expected);
        assert!(d < 1e-3, "{arch:?} prefill differs by {d}");

        let mut all = tokens.clone();
        for step in 0..5u32 {
            let next = [(step * 13 + 2) % 250];
            all.push(next[0]);
            let mut segs = [Segment::new(&next, &mut kv)];
            decode.run(&pool, &mut segs, &mut logits).unwrap();
            let expected = native_last_logits(&model, &pool, &all);
            let d = max_diff(&logits, &expected);
            assert!(d < 1e-3, "{arch:?} decode step {step} differs by {d}");
        }
    }
}

/// An artifact that counts its runs.
struct Counted {
    inner: Arc<dyn Executable>,
    runs: AtomicUsize,
}

impl Executable for Counted {
    fn shape(&self) -> ArtifactShape {
        self.inner.shape()
    }
    fn bytes(&self) -> usize {
        self.inner.bytes()
    }
    fn executing_device(&self) -> String {
        self.inner.executing_device()
    }
    fn run(
        &self,
        pool: &ThreadPool,
        segments: &mut [Segment<'_>],
        logits: &mut Vec<f32>,
    ) -> pyramid_runtime::Result<()> {
        self.runs.fetch_add(1, Ordering::Relaxed);
        self.inner.run(pool, segments, logits)
    }
}

#[test]
fn a_prefill_stepping_up_smaller_windows_equals_one_on_the_whole_window() {
    let pool = ThreadPool::new(2).unwrap();
    let model = tiny(Architecture::Llama, true);
    let ov = ov_cpu(&model, WeightFormat::F32);
    let rungs: Vec<Counted> = [16, 32, 64]
        .into_iter()
        .map(|window| Counted {
            inner: ov
                .compile(ArtifactShape::Prefill { chunk: 8, window })
                .unwrap(),
            runs: AtomicUsize::new(0),
        })
        .collect();
    let all: Vec<&dyn Executable> = rungs.iter().map(|r| r as &dyn Executable).collect();
    // 37 tokens, five chunks: the cache after each holds 8, 16, 24, 32 and 40 positions.
    let tokens = prompt(37, 3);
    let prefill = |rungs: &[&dyn Executable], reserve: usize| {
        let mut kv = KvCache::with_reserve(&model.config, 64, reserve, KvType::F32);
        let mut logits = Vec::new();
        prefill_stepping(rungs, &pool, &tokens, &mut kv, &mut logits).unwrap();
        assert_eq!((kv.len(), kv.capacity()), (37, 64));
        (kv, logits)
    };
    let (kv_whole, whole) = prefill(&all[2..], 64);
    assert_eq!(rungs[2].runs.swap(0, Ordering::Relaxed), 5);
    let (kv_stepped, stepped) = prefill(&all, 128);
    let runs: Vec<usize> = rungs
        .iter()
        .map(|r| r.runs.load(Ordering::Relaxed))
        .collect();
    assert_eq!(runs, [2, 2, 1], "chunks per window");
    assert!(max_diff(&stepped, &whole) < 1e-4);
    let expected = native_last_logits(&model, &pool, &tokens);
    assert!(max_diff(&stepped, &expected) < 1e-3);
    assert_eq!(kv_stepped.len(), kv_whole.len());
    // A compact cache would copy to move its bound: every chunk runs on its own window.
    for r in &rungs {
        r.runs.store(0, Ordering::Relaxed);
    }
    prefill(&all, 64);
    let runs: Vec<usize> = rungs
        .iter()
        .map(|r| r.runs.load(Ordering::Relaxed))
        .collect();
    assert_eq!(runs, [0, 0, 5]);
}

#[test]
fn batched_decode_with_empty_slots_matches_each_sequence_alone() {
    // Gemma 3's windows of 8 are crossed by every prompt here.
    for arch in [Architecture::Qwen2, Architecture::Gemma3] {
        batched_decode_with_empty_slots(arch);
    }
}

fn batched_decode_with_empty_slots(arch: Architecture) {
    let pool = ThreadPool::new(2).unwrap();
    let model = tiny(arch, false);
    let ov = ov_cpu(&model, WeightFormat::F32);
    let window = 48;
    let prefill = ov
        .compile(ArtifactShape::Prefill { chunk: 8, window })
        .unwrap();
    // Four slots, three sequences: the empty slot must not disturb the others.
    let decode = ov
        .compile(ArtifactShape::Decode { batch: 4, window })
        .unwrap();
    let prompts: Vec<Vec<u32>> = [5, 11, 20].iter().map(|&n| prompt(n, n as u32)).collect();
    // Compact and reserved caches side by side: each is staged from its own layout.
    let mut caches: Vec<_> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let reserve = if i % 2 == 0 { window } else { 4 * window };
            let mut kv = KvCache::with_reserve(&model.config, window, reserve, KvType::F32);
            prefill_chunked(prefill.as_ref(), &pool, p, &mut kv, &mut Vec::new()).unwrap();
            kv
        })
        .collect();
    let next: Vec<[u32; 1]> = (0..3).map(|i| [(i * 40 + 9) % 250]).collect();
    let mut segs: Vec<Segment<'_>> = caches
        .iter_mut()
        .zip(&next)
        .map(|(kv, t)| Segment::new(t, kv))
        .collect();
    let mut logits = Vec::new();
    decode.run(&pool, &mut segs, &mut logits).unwrap();
    let n_vocab = model.config.n_vocab;
    assert_eq!(logits.len(), 3 * n_vocab);
    for (i, p) in prompts.iter().enumerate() {
        let mut all = p.clone();
        all.push(next[i][0]);
        let expected = native_last_logits(&model, &pool, &all);
        let d = max_diff(&logits[i * n_vocab..(i + 1) * n_vocab], &expected);
        assert!(d < 1e-3, "sequence {i} differs by {d}");
        assert_eq!(caches[i].len(), all.len());
    }
}

/// A decode batch laid out on the sequence axis of one graph sequence (what NPUs take),
/// on a batch axis, and one sequence at a time: the same greedy tokens, step after step,
/// and logits within rounding; an empty slot changes nothing.
#[test]
fn packed_batched_and_single_decode_give_the_same_tokens() {
    for (arch, untied) in [(Architecture::Llama, true), (Architecture::Gemma3, false)] {
        packed_batched_and_single_decode(arch, untied);
    }
}

fn packed_batched_and_single_decode(arch: Architecture, untied: bool) {
    let pool = ThreadPool::new(2).unwrap();
    let model = tiny(arch, untied);
    let window = 40;
    let backend = |layout: &str| {
        let options =
            OvOptions::for_device("CPU", Some(2), &[format!("{DECODE_LAYOUT_KEY}={layout}")])
                .unwrap();
        OvBackend::new(Arc::clone(&model), "CPU", WeightFormat::F32, options).unwrap()
    };
    let (packed, batched) = (backend("packed"), backend("batched"));
    assert_eq!(
        OvOptions::for_device("NPU", None, &[])
            .unwrap()
            .decode_layout,
        DecodeLayout::Packed,
        "NPUs take no batch axis"
    );
    assert!(
        OvOptions::for_device("CPU", None, &["PYRAMID_DECODE_LAYOUT=diagonal".into()]).is_err()
    );
    let prefill = batched
        .compile(ArtifactShape::Prefill { chunk: 8, window })
        .unwrap();
    let single = batched
        .compile(ArtifactShape::Decode { batch: 1, window })
        .unwrap();
    let shape = ArtifactShape::Decode { batch: 4, window };
    let runs: Vec<(&str, Arc<dyn pyramid_runtime::Executable>)> = vec![
        ("packed", packed.compile(shape).unwrap()),
        ("batched", batched.compile(shape).unwrap()),
    ];
    let n_vocab = model.config.n_vocab;
    // Three sequences of different lengths in four slots, five greedy steps each.
    let prompts: Vec<Vec<u32>> = [3, 9, 17].iter().map(|&n| prompt(n, n as u32)).collect();
    let fresh = || -> Vec<pyramid_model::KvCache> {
        prompts
            .iter()
            .map(|p| {
                let mut kv = model.new_kv_cache_of(window, KvType::F32);
                prefill_chunked(prefill.as_ref(), &pool, p, &mut kv, &mut Vec::new()).unwrap();
                kv
            })
            .collect()
    };
    let first: Vec<u32> = (0..3).map(|i| (i * 40 + 9) % 250).collect();
    // One at a time: the reference tokens and logits.
    let mut want_tokens = vec![Vec::new(); 3];
    // [step][sequence]
    let mut want_logits = vec![Vec::new(); 5];
    for (i, kv) in fresh().iter_mut().enumerate() {
        let mut token = first[i];
        let mut logits = Vec::new();
        for step_logits in want_logits.iter_mut() {
            single
                .run(&pool, &mut [Segment::new(&[token], kv)], &mut logits)
                .unwrap();
            step_logits.push(logits.clone());
            token = pyramid_runtime::argmax(&logits);
            want_tokens[i].push(token);
        }
    }
    for (name, decode) in &runs {
        let mut caches = fresh();
        let mut tokens: Vec<[u32; 1]> = first.iter().map(|&t| [t]).collect();
        let mut got = vec![Vec::new(); 3];
        let mut logits = Vec::new();
        for (step, want) in want_logits.iter().enumerate() {
            let mut segs: Vec<Segment<'_>> = caches
                .iter_mut()
                .zip(&tokens)
                .map(|(kv, t)| Segment::new(t, kv))
                .collect();
            decode.run(&pool, &mut segs, &mut logits).unwrap();
            assert_eq!(logits.len(), 3 * n_vocab);
            for (i, row) in logits.chunks_exact(n_vocab).enumerate() {
                let d = max_diff(row, &want[i]);
                assert!(d < 1e-3, "{name}: sequence {i} step {step} differs by {d}");
                tokens[i][0] = pyramid_runtime::argmax(row);
                got[i].push(tokens[i][0]);
            }
        }
        assert_eq!(got, want_tokens, "{name} decode against one at a time");
        for (kv, p) in caches.iter().zip(&prompts) {
            assert_eq!(kv.len(), p.len() + 5);
        }
    }
}

/// A cache holding old rows past its length (a cached conversation truncated to the
/// prefix a new request shares) gives exactly a fresh cache's logits: masked positions
/// contribute nothing, whatever they hold.
#[test]
fn stale_rows_past_a_caches_length_change_nothing() {
    let pool = ThreadPool::new(2).unwrap();
    let model = tiny(Architecture::Qwen2, false);
    let ov = ov_cpu(&model, WeightFormat::F32);
    let window = 32;
    let prefill = ov
        .compile(ArtifactShape::Prefill { chunk: 8, window })
        .unwrap();
    let decode = ov
        .compile(ArtifactShape::Decode { batch: 1, window })
        .unwrap();
    let run = |kv: &mut pyramid_model::KvCache| {
        let mut logits = Vec::new();
        prefill_chunked(prefill.as_ref(), &pool, &prompt(7, 2), kv, &mut logits).unwrap();
        decode
            .run(&pool, &mut [Segment::new(&[42], kv)], &mut logits)
            .unwrap();
        logits
    };
    let fresh = run(&mut model.new_kv_cache_of(window, KvType::F32));
    let mut reused = model.new_kv_cache_of(window, KvType::F32);
    let mut scratch = Vec::new();
    prefill_chunked(
        prefill.as_ref(),
        &pool,
        &prompt(30, 9),
        &mut reused,
        &mut scratch,
    )
    .unwrap();
    reused.truncate(0);
    assert_eq!(run(&mut reused), fresh);
}

#[test]
fn migration_between_windows_and_native_to_openvino_handoff_keep_tokens() {
    let pool = ThreadPool::new(2).unwrap();
    let model = tiny(Architecture::Llama, false);
    let ov = ov_cpu(&model, WeightFormat::F32);
    let native = pyramid_runtime::CpuBackend::new(Arc::clone(&model), 2);
    let tokens = prompt(30, 3);
    let greedy = |exe: &dyn pyramid_runtime::Executable,
                  kv: &mut pyramid_model::KvCache,
                  first: u32,
                  n: usize| {
        let mut out = vec![first];
        let mut logits = Vec::new();
        for _ in 0..n {
            let t = [*out.last().unwrap()];
            exe.run(&pool, &mut [Segment::new(&t, kv)], &mut logits)
                .unwrap();
            out.push(pyramid_runtime::argmax(&logits));
        }
        out
    };

    // Reference: native prefill and decode in a 64-position window.
    let mut kv = model.new_kv_cache_of(64, KvType::F32);
    let mut logits = Vec::new();
    let native_prefill = native
        .compile(ArtifactShape::Prefill {
            chunk: 16,
            window: 64,
        })
        .unwrap();
    prefill_chunked(
        native_prefill.as_ref(),
        &pool,
        &tokens,
        &mut kv,
        &mut logits,
    )
    .unwrap();
    let first = pyramid_runtime::argmax(&logits);
    let native_decode = native
        .compile(ArtifactShape::Decode {
            batch: 1,
            window: 64,
        })
        .unwrap();
    let expected = greedy(native_decode.as_ref(), &mut kv, first, 20);

    // OpenVINO prefill at window 32, migrated to 64 for decode: a compact cache copies.
    let ov_prefill = ov
        .compile(ArtifactShape::Prefill {
            chunk: 16,
            window: 32,
        })
        .unwrap();
    let ov_decode = |window| {
        ov.compile(ArtifactShape::Decode { batch: 1, window })
            .unwrap()
    };
    let mut kv = model.new_kv_cache_of(32, KvType::F32);
    prefill_chunked(ov_prefill.as_ref(), &pool, &tokens, &mut kv, &mut logits).unwrap();
    assert_eq!(pyramid_runtime::argmax(&logits), first);
    assert!(kv.grow_to(64).unwrap() > 0);
    assert_eq!(greedy(ov_decode(64).as_ref(), &mut kv, first, 20), expected);

    // A cache reserving 128 positions crosses 32 -> 64 -> 128 as new bounds over the
    // same memory: no byte copied, the tokens of the native run.
    let mut kv = KvCache::with_reserve(&model.config, 32, 128, KvType::F32);
    prefill_chunked(ov_prefill.as_ref(), &pool, &tokens, &mut kv, &mut logits).unwrap();
    assert_eq!(kv.grow_to(64).unwrap(), 0);
    let mut got = greedy(ov_decode(64).as_ref(), &mut kv, first, 10);
    assert_eq!(kv.grow_to(128).unwrap(), 0);
    let last = *got.last().unwrap();
    got.extend_from_slice(&greedy(ov_decode(128).as_ref(), &mut kv, last, 10)[1..]);
    assert_eq!(got, expected);

    // Native prefill handed to OpenVINO decode through one route backend.
    let route = pyramid_runtime::RouteBackend::new(Arc::new(native), Arc::new(ov)).unwrap();
    let mut kv = model.new_kv_cache_of(64, KvType::F32);
    let p = route
        .compile(ArtifactShape::Prefill {
            chunk: 16,
            window: 64,
        })
        .unwrap();
    let d = route
        .compile(ArtifactShape::Decode {
            batch: 1,
            window: 64,
        })
        .unwrap();
    assert!(p.executing_device().starts_with("cpu"));
    assert_eq!(d.executing_device(), "CPU");
    prefill_chunked(p.as_ref(), &pool, &tokens, &mut kv, &mut logits).unwrap();
    assert_eq!(greedy(d.as_ref(), &mut kv, first, 20), expected);
}

/// The largest difference of `ov`'s logits after prefilling `tokens` (one chunk of 16
/// over a window of 32) from `expected`, as a fraction of `expected`'s largest.
fn prefill_error(
    ov: &OvBackend,
    model: &Model,
    pool: &ThreadPool,
    tokens: &[u32],
    expected: &[f32],
) -> f32 {
    let exe = ov
        .compile(ArtifactShape::Prefill {
            chunk: 16,
            window: 32,
        })
        .unwrap();
    let mut kv = model.new_kv_cache_of(32, KvType::F32);
    let mut logits = Vec::new();
    prefill_chunked(exe.as_ref(), pool, tokens, &mut kv, &mut logits).unwrap();
    let scale = expected.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    max_diff(&logits, expected) / scale
}

#[test]
fn compressed_weights_stay_close_to_f32() {
    let pool = ThreadPool::new(2).unwrap();
    let model = tiny(Architecture::Qwen2, false);
    let tokens = prompt(12, 4);
    let expected = native_last_logits(&model, &pool, &tokens);
    // Tolerances as fractions of the largest logit; a wrong nibble order or scale layout
    // gives errors of the order of the logits themselves.
    for (format, tol) in [
        (WeightFormat::F16, 0.01),
        (WeightFormat::Bf16, 0.03),
        (WeightFormat::Int8, 0.05),
        (WeightFormat::Int4, 0.3),
    ] {
        let d = prefill_error(&ov_cpu(&model, format), &model, &pool, &tokens, &expected);
        eprintln!("{format:?}: relative difference {d}");
        assert!(d < tol, "{format:?}: relative difference {d}");
        assert!(
            d > 0.0,
            "{format:?} gave exactly the f32 result: weights not compressed?"
        );
    }
}

#[test]
fn outlier_channels_keep_quantised_activations_close_to_f32() {
    let pool = ThreadPool::new(2).unwrap();
    let mut f32_model = (*tiny(Architecture::Llama, true)).clone();
    // One channel of every normed input forty times the others': in a group of
    // activations quantised at run time it leaves the rest of the group a few levels.
    for layer in &mut f32_model.weights.layers {
        layer.attn_norm[5] *= 40.0;
        layer.ffn_norm[37] *= 40.0;
    }
    let tokens = prompt(12, 4);
    let calibration = f32_model.calibrate(&pool, &prompt(40, 9)).unwrap();
    let int8 = f32_model
        .clone()
        .into_precision(Precision::Int8, Some(&calibration));
    let outliers = OutlierChannels::of(&int8);
    assert!(
        !outliers.is_empty(),
        "the calibration found no outlier channel"
    );
    let model = Arc::new(f32_model);
    let expected = native_last_logits(&model, &pool, &tokens);
    let error = |outliers: OutlierChannels| {
        let quantised = ["DYNAMIC_QUANTIZATION_GROUP_SIZE=32".to_string()];
        let options = OvOptions::for_device("CPU", Some(2), &quantised)
            .unwrap()
            .with_outliers(outliers);
        let ov = OvBackend::new(Arc::clone(&model), "CPU", WeightFormat::Int8, options).unwrap();
        prefill_error(&ov, &model, &pool, &tokens, &expected)
    };
    let (apart, within) = (error(outliers), error(OutlierChannels::default()));
    eprintln!("relative difference: outliers apart {apart}, within {within}");
    assert!(
        apart < within / 2.0 && apart < 0.05,
        "outliers apart {apart}, within {within}"
    );
}

#[test]
fn bad_devices_options_and_caches_are_clear_errors() {
    let model = tiny(Architecture::Qwen2, false);
    let options = OvOptions::for_device("NPU", None, &[]).unwrap();
    let err = OvBackend::new(Arc::clone(&model), "NPU", WeightFormat::F32, options)
        .err()
        .expect("no NPU on this machine")
        .to_string();
    assert!(
        err.contains("'ov:NPU' is not present") && err.contains("ov:CPU"),
        "{err}"
    );

    let err = OvOptions::for_device("CPU", None, &["NO_EQUALS_SIGN".into()]).unwrap_err();
    assert!(err.to_string().contains("KEY=VALUE"), "{err}");

    // A property the plugin rejects: the OpenVINO message arrives with the shape.
    let options =
        OvOptions::for_device("CPU", None, &["INFERENCE_PRECISION_HINT=f7".into()]).unwrap();
    let ov = OvBackend::new(Arc::clone(&model), "CPU", WeightFormat::F32, options).unwrap();
    let err = ov
        .compile(ArtifactShape::Decode {
            batch: 1,
            window: 16,
        })
        .err()
        .expect("bad precision hint")
        .to_string();
    assert!(err.contains("decode b1 w16") && err.contains("f7"), "{err}");

    let ov = ov_cpu(&model, WeightFormat::F32);
    let exe = ov
        .compile(ArtifactShape::Decode {
            batch: 1,
            window: 16,
        })
        .unwrap();
    let mut kv = model.new_kv_cache_of(16, KvType::Int8);
    let err = exe
        .run(
            &ThreadPool::new(1).unwrap(),
            &mut [Segment::new(&[1], &mut kv)],
            &mut Vec::new(),
        )
        .unwrap_err()
        .to_string();
    assert!(err.contains("f32 caches"), "{err}");
    assert!(kv.is_empty(), "a refused run leaves the cache untouched");
}

/// Llama 3 RoPE scaling reaches the graph through the host's RoPE angles: the tiny Llama 3
/// fixture (`testdata/llama3-rope`) on ov:CPU equals the native f32 path.
#[test]
fn llama3_rope_scaling_matches_native_f32() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/llama3-rope/tiny-llama3.gguf");
    let model = Arc::new(Model::load(&path).unwrap());
    assert!(model.config.rope_factors.is_some());
    let pool = ThreadPool::new(2).unwrap();
    let ov = ov_cpu(&model, WeightFormat::F32);
    let window = 64;
    let prefill = ov
        .compile(ArtifactShape::Prefill { chunk: 16, window })
        .unwrap();
    let tokens = prompt(40, 3)
        .into_iter()
        .map(|t| t % model.config.n_vocab as u32)
        .collect::<Vec<_>>();
    let mut kv = model.new_kv_cache_of(window, KvType::F32);
    let mut logits = Vec::new();
    prefill_chunked(prefill.as_ref(), &pool, &tokens, &mut kv, &mut logits).unwrap();
    let d = max_diff(&logits, &native_last_logits(&model, &pool, &tokens));
    assert!(d < 1e-3, "ov:CPU differs from native by {d}");
}
