//! The native backend's mixed pass (prefill chunks and decode tokens of sequences on
//! different windows at once) against the same sequences run alone through the static
//! prefill and decode artifacts of their own windows.

use std::sync::Arc;

use pyramid_gguf::GgufFile;
use pyramid_kernels::ThreadPool;
use pyramid_model::synthetic::{synthetic_gguf, SyntheticSpec};
use pyramid_model::{Architecture, KvCache, Model, Precision, Segment};
use pyramid_runtime::{prefill_chunked, ArtifactShape, Backend, CpuBackend, RuntimeError};

fn tiny(precision: Precision) -> Arc<Model> {
    let bytes = synthetic_gguf(&SyntheticSpec::tiny(Architecture::Llama))
        .unwrap()
        .to_bytes();
    let model = Model::from_gguf(&GgufFile::from_bytes(bytes).unwrap()).unwrap();
    Arc::new(model.into_precision(precision, None))
}

#[test]
fn a_mixed_pass_equals_each_sequence_alone_bit_for_bit() {
    let pool = ThreadPool::new(2).unwrap();
    for precision in [Precision::F32, Precision::Int8] {
        let model = tiny(precision);
        let backend = CpuBackend::new(Arc::clone(&model), 2);
        assert!(backend.runs_mixed_passes());
        // (window, cached prefix, new tokens)
        let cases: [(usize, Vec<u32>, Vec<u32>); 3] = [
            (32, vec![3, 4, 5], vec![9]),
            (64, (0..40).collect(), vec![17]),
            (128, vec![1, 2], (50..70).collect()),
        ];
        let prefill = |window: usize, tokens: &[u32], kv: &mut KvCache| {
            let exe = backend
                .compile(ArtifactShape::Prefill {
                    chunk: tokens.len(),
                    window,
                })
                .unwrap();
            let mut logits = Vec::new();
            prefill_chunked(exe.as_ref(), &pool, tokens, kv, &mut logits).unwrap();
            logits
        };
        let mut alone = Vec::new();
        let mut caches = Vec::new();
        for (window, cached, new) in &cases {
            let mut kv = model.new_kv_cache(*window);
            prefill(*window, cached, &mut kv);
            caches.push(kv.clone());
            let logits = if new.len() == 1 {
                let exe = backend
                    .compile(ArtifactShape::Decode {
                        batch: 1,
                        window: *window,
                    })
                    .unwrap();
                let mut logits = Vec::new();
                exe.run(&pool, &mut [Segment::new(new, &mut kv)], &mut logits)
                    .unwrap();
                logits
            } else {
                prefill(*window, new, &mut kv)
            };
            alone.push(logits);
        }
        let mixed = backend
            .compile(ArtifactShape::Mixed {
                rows: 32,
                batch: 4,
                logits: 4,
                window: 128,
            })
            .unwrap();
        let mut segments: Vec<Segment<'_>> = caches
            .iter_mut()
            .zip(&cases)
            .map(|(kv, (_, _, new))| Segment::new(new, kv))
            .collect();
        let mut logits = Vec::new();
        mixed.run(&pool, &mut segments, &mut logits).unwrap();
        let n_vocab = model.config.n_vocab;
        for (i, (got, want)) in logits.chunks_exact(n_vocab).zip(&alone).enumerate() {
            assert_eq!(got, want.as_slice(), "{precision}: sequence {i}");
        }
        for (kv, (_, cached, new)) in caches.iter().zip(&cases) {
            assert_eq!(kv.len(), cached.len() + new.len());
        }
    }
}

#[test]
fn a_mixed_pass_refuses_what_it_was_not_compiled_for() {
    let pool = ThreadPool::new(1).unwrap();
    let model = tiny(Precision::F32);
    let backend = CpuBackend::new(Arc::clone(&model), 1);
    let mixed = backend
        .compile(ArtifactShape::Mixed {
            rows: 4,
            batch: 2,
            logits: 2,
            window: 32,
        })
        .unwrap();
    let mut logits = Vec::new();
    let (mut a, mut b, mut c) = (
        model.new_kv_cache(32),
        model.new_kv_cache(32),
        model.new_kv_cache(32),
    );
    let too_many_rows = mixed.run(&pool, &mut [Segment::new(&[1; 5], &mut a)], &mut logits);
    let too_many_segments = mixed.run(
        &pool,
        &mut [
            Segment::new(&[1], &mut a),
            Segment::new(&[1], &mut b),
            Segment::new(&[1], &mut c),
        ],
        &mut logits,
    );
    let mut large = model.new_kv_cache(64);
    let too_large_a_cache = mixed.run(&pool, &mut [Segment::new(&[1], &mut large)], &mut logits);
    for result in [too_many_rows, too_many_segments, too_large_a_cache] {
        assert!(
            matches!(result, Err(RuntimeError::BadShape { .. })),
            "{result:?}"
        );
    }
    assert!(a.is_empty(), "a refused pass changes no cache");
}
