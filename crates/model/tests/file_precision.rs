//! `--precision file` on synthetic GGUF files written in Q8_0, Q4_0 and Q4_1 and on files
//! llama.cpp's `llama-quantize` wrote in every type (`testdata/gguf-quants`): the weights
//! the kernels multiply are the file's, a forward pass follows the f32 model of the same
//! dequantised weights, and block types no kernel runs exactly are refused by name.

use std::collections::HashSet;

use pyramid_gguf::{quants, GgmlType, GgufFile, GgufWriter};
use pyramid_kernels::{ops::argmax, ThreadPool};
use pyramid_model::linear::PackedWeights;
use pyramid_model::synthetic::{synthetic_gguf, SyntheticSpec};
use pyramid_model::{
    Architecture, Embedding, Linear, LogitsFor, Model, ModelError, Precision, Scratch,
};
use pyramid_testdata::quantized_fixture;
use sha2::{Digest, Sha256};

const TYPES: [GgmlType; 3] = [GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1];

fn spec(ty: GgmlType, untied_output: bool) -> SyntheticSpec {
    SyntheticSpec {
        weight_type: ty,
        untied_output,
        ..SyntheticSpec::tiny(Architecture::Llama)
    }
}

fn open(writer: &GgufWriter) -> GgufFile {
    GgufFile::from_bytes(writer.to_bytes()).expect("parses")
}

/// `file`'s tensors again, with `name` replaced by `bytes` of type `ty`.
fn replaced(file: &GgufFile, name: &str, ty: GgmlType, bytes: Vec<u8>) -> GgufWriter {
    let mut writer = GgufWriter::new();
    for (key, value) in file.metadata().iter() {
        writer.add_metadata(key, value.clone()).expect("metadata");
    }
    for info in file.tensors() {
        let (ty, bytes) = if info.name == name {
            (ty, bytes.clone())
        } else {
            (info.ggml_type, file.tensor_bytes(info).to_vec())
        };
        writer
            .add_tensor(&info.name, &info.dims, ty, bytes)
            .expect("tensor");
    }
    writer
}

/// Every projection of `model` (and the output head) by its tensor name.
fn projections(model: &Model) -> Vec<(String, &Linear)> {
    // A tied model's head is its embedding table.
    let head = if model.weights.layers.is_empty()
        || matches!(model.weights.token_embd, Embedding::Output)
    {
        "token_embd.weight"
    } else {
        "output.weight"
    };
    let mut all = vec![(head.to_string(), &model.weights.output)];
    for (i, l) in model.weights.layers.iter().enumerate() {
        let ffn = l.dense_ffn().expect("dense");
        for (t, lin) in [
            ("attn_q", &l.wq),
            ("attn_k", &l.wk),
            ("attn_v", &l.wv),
            ("attn_output", &l.wo),
            ("ffn_gate", &ffn.gate),
            ("ffn_up", &ffn.up),
            ("ffn_down", &ffn.down),
        ] {
            all.push((format!("blk.{i}.{t}.weight"), lin));
        }
    }
    all
}

/// Each projection (and an untied embedding table), dequantised from the packed form the
/// kernels read, equals the GGUF dequantiser's output of the file's bytes (as numbers:
/// Q4_0's `q·d + (-8d)` gives +0 where `d·(q - 8)` gives -0 for a negative `d`, and the two
/// multiply alike). Returns the block types seen.
fn assert_projections_are_the_files(file: &GgufFile, model: &Model) -> HashSet<GgmlType> {
    let mut all = projections(model);
    if let Embedding::Table(table) = &model.weights.token_embd {
        all.push(("token_embd.weight".to_string(), table.as_ref()));
    }
    let mut types = HashSet::new();
    for (name, lin) in all {
        let Linear::Quant(q) = lin else {
            panic!("{name} is not packed")
        };
        assert!(q.outlier_channels.is_empty(), "{name}: no calibration");
        let info = file.tensor_info(&name).expect("tensor");
        types.insert(info.ggml_type);
        let mut want = vec![0.0; info.n_elements() as usize];
        quants::dequantize(info.ggml_type, file.tensor_bytes(info), &mut want)
            .expect("dequantises");
        let (n_rows, n_cols) = (lin.n_out(), lin.n_in());
        let mut row = vec![0.0; n_cols];
        for r in 0..n_rows {
            lin.dequantize_row_into(r, &mut row);
            assert_eq!(row, want[r * n_cols..(r + 1) * n_cols], "{name} row {r}");
        }
    }
    types
}

#[test]
fn packed_weights_are_the_files_bit_for_bit() {
    for ty in TYPES {
        let file = open(&synthetic_gguf(&spec(ty, true)).expect("synthetic"));
        let model = Model::from_gguf_with(&file, Precision::File).expect("loads");
        assert_eq!(assert_projections_are_the_files(&file, &model), [ty].into());
        // Q8_0 packs as INT8, both 4-bit types as INT4.
        let Linear::Quant(q) = &model.weights.layers[0].wq else {
            unreachable!("checked above")
        };
        let four_bit = matches!(q.packed, PackedWeights::I4(_));
        assert_eq!(four_bit, ty != GgmlType::Q8_0, "{ty}");
    }
}

/// A Q4_0 block whose `-8·d` overflows f16 cannot be a 4-bit group with a minimum; the
/// tensor goes to INT8 codes `q - 8` instead, still exactly the file's.
#[test]
fn q4_0_beyond_f16_minimums_packs_as_int8_exactly() {
    let base = open(&synthetic_gguf(&spec(GgmlType::Q4_0, false)).expect("synthetic"));
    let name = "blk.1.attn_q.weight";
    let info = base.tensor_info(name).expect("tensor");
    let mut values = vec![0.0; info.n_elements() as usize];
    quants::dequantize(GgmlType::Q4_0, base.tensor_bytes(info), &mut values).expect("dequant");
    values[37] = 70_000.0; // d = -8750: exact in f16, but 8·d is not
    let bytes = quants::quantize(GgmlType::Q4_0, &values).expect("quantises");
    let file = open(&replaced(&base, name, GgmlType::Q4_0, bytes));
    let model = Model::from_gguf_with(&file, Precision::File).expect("loads");
    assert!(matches!(
        &model.weights.layers[1].wq,
        Linear::Quant(q) if matches!(q.packed, PackedWeights::I8(_))
    ));
    assert_eq!(
        assert_projections_are_the_files(&file, &model),
        [GgmlType::Q4_0].into()
    );
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| f64::from(*x) * f64::from(*y))
        .sum();
    let norm = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b))
}

/// The largest logit's lead over the next.
fn top_two_gap(logits: &[f32]) -> f32 {
    let (mut first, mut second) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &l in logits {
        if l > first {
            (first, second) = (l, first);
        } else if l > second {
            second = l;
        }
    }
    first - second
}

/// `tokens` fed one after the other behind `prompt`: each step's logits.
fn teacher_forced(
    model: &Model,
    pool: &ThreadPool,
    prompt: &[u32],
    tokens: &[u32],
) -> Vec<Vec<f32>> {
    let mut kv = model.new_kv_cache(prompt.len() + tokens.len());
    let mut scratch = Scratch::default();
    std::iter::once(prompt)
        .chain(tokens.chunks(1))
        .take(tokens.len())
        .map(|input| {
            model
                .forward(pool, input, &mut kv, &mut scratch, LogitsFor::Last)
                .expect("forward")
        })
        .collect()
}

/// Greedy decoding from `prompt` for `n_steps` tokens.
fn greedy(model: &Model, pool: &ThreadPool, prompt: &[u32], n_steps: usize) -> Vec<u32> {
    let mut kv = model.new_kv_cache(prompt.len() + n_steps);
    let mut scratch = Scratch::default();
    let mut tokens: Vec<u32> = Vec::new();
    for _ in 0..n_steps {
        let input = tokens.last().map_or(prompt, std::slice::from_ref);
        let logits = model
            .forward(pool, input, &mut kv, &mut scratch, LogitsFor::Last)
            .expect("forward");
        tokens.push(argmax(&logits));
    }
    tokens
}

#[test]
fn forward_at_file_follows_the_f32_model_and_is_thread_count_invariant() {
    let prompt = [1u32, 17, 42, 5, 99, 23, 8];
    const N_STEPS: usize = 6;
    let (one, three) = (ThreadPool::new(1).unwrap(), ThreadPool::new(3).unwrap());
    for ty in TYPES {
        for untied in [false, true] {
            let file = open(&synthetic_gguf(&spec(ty, untied)).expect("synthetic"));
            let reference = Model::from_gguf(&file).expect("f32 loads");
            let model = Model::from_gguf_with(&file, Precision::File).expect("loads");
            let want = greedy(&reference, &three, &prompt, N_STEPS);
            let want_logits = teacher_forced(&reference, &three, &prompt, &want);
            let got_logits = teacher_forced(&model, &three, &prompt, &want);
            let mut agreeing = 0;
            for (step, (g, w)) in got_logits.iter().zip(&want_logits).enumerate() {
                let c = cosine(g, w);
                assert!(c > 0.9999, "{ty} untied={untied} step {step}: cosine {c}");
                // Greedy tokens agree, but where f32's top two are closer than the logits
                // moved: a near-tie of a random model, which 8-bit activations may flip.
                let max_diff = g
                    .iter()
                    .zip(w)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0, f32::max);
                if argmax(g) == argmax(w) {
                    agreeing += 1;
                } else {
                    let gap = top_two_gap(w);
                    assert!(
                        gap < max_diff,
                        "{ty} untied={untied} step {step}: gap {gap}"
                    );
                }
            }
            eprintln!("{ty} untied={untied}: {agreeing}/{N_STEPS} greedy tokens as f32");
            assert!(
                agreeing >= N_STEPS - 1,
                "{ty} untied={untied}: {agreeing}/{N_STEPS}"
            );
            let got = greedy(&model, &three, &prompt, N_STEPS);
            assert_eq!(
                greedy(&model, &one, &prompt, N_STEPS),
                got,
                "{ty} untied={untied}"
            );
            assert_eq!(
                teacher_forced(&model, &one, &prompt, &want),
                got_logits,
                "{ty} untied={untied}: 1 and 3 threads"
            );
        }
    }
}

#[test]
fn a_block_type_without_an_exact_kernel_is_refused_by_name() {
    // Rows of 256 so a Q2_K super-block fits; all-zero bytes are a valid Q2_K block.
    let base = open(
        &synthetic_gguf(&SyntheticSpec {
            n_ff: 256,
            ..spec(GgmlType::Q8_0, false)
        })
        .expect("synthetic"),
    );
    let name = "blk.0.ffn_down.weight";
    let n_bytes = GgmlType::Q2K.bytes_for(64 * 256).expect("whole blocks") as usize;
    let file = open(&replaced(&base, name, GgmlType::Q2K, vec![0; n_bytes]));
    let err = Model::from_gguf_with(&file, Precision::File).expect_err("refused");
    assert!(
        matches!(&err, ModelError::FileType { name: n, ty } if n == name && *ty == GgmlType::Q2K),
        "{err}"
    );
    let message = err.to_string();
    assert!(
        message.contains("Q2_K") && message.contains(name) && message.contains("--precision int8"),
        "{message}"
    );
    // The other precisions still load it, re-quantised as they always are.
    Model::from_gguf_with(&file, Precision::Int8).expect("int8 loads");
}

/// Float tensors keep their form: F32 in f32 (no calibration, no packing).
#[test]
fn float_tensors_stay_float() {
    let file = open(&synthetic_gguf(&spec(GgmlType::F32, true)).expect("synthetic"));
    let model = Model::from_gguf_with(&file, Precision::File).expect("loads");
    for (name, lin) in projections(&model) {
        assert!(matches!(lin, Linear::F32(_)), "{name}");
    }
    let file = open(&synthetic_gguf(&spec(GgmlType::BF16, true)).expect("synthetic"));
    let model = Model::from_gguf_with(&file, Precision::File).expect("loads");
    for (name, lin) in projections(&model) {
        assert!(matches!(lin, Linear::Bf16 { .. }), "{name}");
    }
}

/// Block types `--precision file` runs exactly, and those it refuses by name.
const RUN: [GgmlType; 11] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q3K,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
    GgmlType::IQ4NL,
    GgmlType::IQ4XS,
];
const REFUSED: [GgmlType; 1] = [GgmlType::Q2K];

/// Files `llama-quantize` wrote, every type of the list and its fallbacks: each
/// tensor's dequantised values are gguf-py's (SHA-256 of the f32 bytes), and at `file`
/// every projection is the file's bit for bit, with logits close to the f32 model's, or
/// the load names the block type it cannot run.
#[test]
fn llama_quantize_files_run_at_file_precision_bit_for_bit() {
    let read = |name: &str| -> serde_json::Value {
        let text = std::fs::read_to_string(quantized_fixture(name)).expect("fixture");
        serde_json::from_str(&text).expect("json")
    };
    let (types, dequantized) = (read("types.json"), read("dequant.json"));
    let files = types.as_object().expect("files");
    assert_eq!(files.len(), 13);
    let (mut ran, mut refused) = (HashSet::new(), HashSet::new());
    let pool = ThreadPool::new(2).unwrap();
    for (file_name, tensors) in files {
        let file = GgufFile::open(quantized_fixture(file_name)).expect("opens");
        for (name, ty) in tensors.as_object().expect("tensors") {
            let info = file.tensor_info(name).expect("tensor");
            assert_eq!(
                info.ggml_type.to_string(),
                ty.as_str().unwrap(),
                "{file_name} {name}"
            );
            if !quants::can_dequantize(info.ggml_type) {
                continue;
            }
            let mut values = vec![0.0f32; info.n_elements() as usize];
            quants::dequantize(info.ggml_type, file.tensor_bytes(info), &mut values).unwrap();
            let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            let digest = format!("{:x}", Sha256::digest(&bytes));
            let want = &dequantized[file_name][name]["f32_sha256"];
            assert_eq!(digest, want.as_str().unwrap(), "{file_name} {name}");
        }
        match Model::from_gguf_with(&file, Precision::File) {
            Ok(model) => {
                let seen = assert_projections_are_the_files(&file, &model);
                assert!(
                    seen.iter().all(|ty| RUN.contains(ty)),
                    "{file_name}: {seen:?}"
                );
                ran.extend(seen);
                let reference = Model::from_gguf(&file).expect("f32 loads");
                let prompt = [1, 17, 200, 45, 3, 99, 250, 7];
                let (l_file, l_f32) = (
                    teacher_forced(&model, &pool, &prompt, &prompt),
                    teacher_forced(&reference, &pool, &prompt, &prompt),
                );
                for (pos, (a, b)) in l_file.iter().zip(&l_f32).enumerate() {
                    let c = cosine(a, b);
                    assert!(c > 0.999, "{file_name} position {pos}: cosine {c}");
                }
            }
            Err(ModelError::FileType { name, ty }) => {
                assert!(REFUSED.contains(&ty), "{file_name}: {ty} refused ({name})");
                refused.insert(ty);
            }
            Err(e) => panic!("{file_name}: {e}"),
        }
    }
    assert_eq!(ran, RUN.into(), "every runnable type ran");
    assert_eq!(
        refused,
        REFUSED.into(),
        "every other type was refused by name"
    );
}
