//! Probe graphs (a block, a part of one, a projection) on OpenVINO's CPU plugin in f32
//! against the native kernels running the same computation, for both RoPE styles and a
//! Gemma 3 sliding-window layer: what `pyramid affinity` relies on to mark a device's
//! cell valid.
//!
//! Needs OpenVINO (`scripts/setup-openvino.sh`, which the test script runs).

use std::sync::Arc;

use pyramid_gguf::GgufFile;
use pyramid_kernels::ThreadPool;
use pyramid_model::linear::LinearScratch;
use pyramid_model::synthetic::{synthetic_gguf, SyntheticSpec};
use pyramid_model::{Architecture, BlockPart, KvCache, Linear, Model, Projection, Scratch};
use pyramid_openvino::{OvBackend, OvOptions, ProbeGraph, WeightFormat};

fn tiny(arch: Architecture) -> Arc<Model> {
    let bytes = synthetic_gguf(&SyntheticSpec::tiny(arch))
        .unwrap()
        .to_bytes();
    Arc::new(Model::from_gguf(&GgufFile::from_bytes(bytes).unwrap()).unwrap())
}

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n as u32)
        .map(|i| (i.wrapping_mul(2654435761).wrapping_add(seed) % 2001) as f32 / 1000.0 - 1.0)
        .collect()
}

/// A cache of `past` live positions (room for `rows` more) with values in every layer.
fn cache(model: &Model, past: usize, rows: usize) -> KvCache {
    let cfg = &model.config;
    let mut kv = model.new_kv_cache(past + rows);
    for layer in 0..cfg.n_layer {
        for head in 0..cfg.n_head_kv {
            let n = past * cfg.head_dim;
            let seed = (layer * 8 + head) as u32;
            kv.write_head_rows(layer, head, 0, &values(n, seed), &values(n, seed + 100))
                .unwrap();
        }
    }
    kv.commit(past).unwrap();
    kv
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn probes_compute_what_the_native_kernels_compute() {
    let pool = ThreadPool::new(2).unwrap();
    // Gemma 3's layer 0 slides over 8 positions; its layer 5 and the others' 1 see all.
    for (arch, layers) in [
        (Architecture::Llama, vec![1]),
        (Architecture::Qwen2, vec![1]),
        (Architecture::Gemma3, vec![0, 5]),
    ] {
        let model = tiny(arch);
        let cfg = &model.config;
        let options = OvOptions::for_device("CPU", Some(2), &[]).unwrap();
        let ov = OvBackend::new(Arc::clone(&model), "CPU", WeightFormat::F32, options).unwrap();
        for &layer in &layers {
            // Prefill rows over a short past, and one decode row over a longer one.
            for (rows, past, window) in [(12, 5, 32), (1, 30, 32)] {
                let mut kv = cache(&model, past, rows);
                for part in BlockPart::ALL {
                    let input = values(rows * part.input_width(cfg), 7);
                    let mut native = vec![0.0; rows * part.output_width(cfg)];
                    model
                        .run_block(
                            &pool,
                            layer,
                            part,
                            &input,
                            &mut native,
                            &mut kv,
                            &mut Scratch::default(),
                        )
                        .unwrap();
                    let mut probe = ov
                        .compile_probe(ProbeGraph::Block(part), layer, rows, window)
                        .unwrap();
                    assert_eq!(probe.executing_device(), "CPU");
                    probe.prepare(&input, &kv).unwrap();
                    probe.run().unwrap();
                    let diff = max_diff(&probe.output().unwrap(), &native);
                    assert!(
                        diff < 1e-4,
                        "{arch:?} layer {layer} {part:?} {rows} rows over {past}: {diff}"
                    );
                }
                for p in Projection::ALL {
                    let lin: &Linear = p.weight(&model.weights.layers[layer]).unwrap();
                    let input = values(rows * lin.n_in(), 11);
                    let mut native = vec![0.0; rows * lin.n_out()];
                    let bias = p.bias(&model.weights.layers[layer]);
                    let mut scratch = LinearScratch::for_shape(rows, lin.n_in());
                    lin.forward(&pool, &input, bias, &mut native, rows, &mut scratch);
                    let mut probe = ov
                        .compile_probe(ProbeGraph::Projection(p), layer, rows, window)
                        .unwrap();
                    probe.prepare(&input, &kv).unwrap();
                    probe.run().unwrap();
                    let diff = max_diff(&probe.output().unwrap(), &native);
                    assert!(diff < 1e-4, "{arch:?} {p:?}: {diff}");
                }
            }
        }
    }
}

#[test]
fn probe_misuse_is_an_error() {
    let model = tiny(Architecture::Qwen2);
    let options = OvOptions::for_device("CPU", Some(2), &[]).unwrap();
    let ov = OvBackend::new(Arc::clone(&model), "CPU", WeightFormat::F32, options).unwrap();
    assert!(ov
        .compile_probe(ProbeGraph::Block(BlockPart::Whole), 9, 4, 16)
        .is_err());
    let mut probe = ov
        .compile_probe(ProbeGraph::Block(BlockPart::Whole), 0, 4, 16)
        .unwrap();
    assert!(probe.run().is_err(), "running before the inputs are filled");
    let kv = cache(&model, 20, 4);
    let input = values(4 * model.config.n_embd, 1);
    assert!(
        probe.prepare(&input, &kv).is_err(),
        "a past longer than the window"
    );
    assert!(probe.prepare(&input[1..], &cache(&model, 3, 4)).is_err());
}
