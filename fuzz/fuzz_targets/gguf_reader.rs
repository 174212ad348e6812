//! The GGUF reader on hostile bytes, and everything that reads a parsed header before any
//! weight is loaded.
//!
//! Input: a whole GGUF file. Properties:
//! - `GgufFile::from_bytes` returns, never panics, and allocates no more than the input
//!   justifies (libFuzzer's `-rss_limit_mb` / `-malloc_limit_mb` catch the rest);
//! - every tensor it accepts lies inside the file, and dequantises or fails cleanly;
//! - a file the reader accepts and the writer can re-encode reads back the same;
//! - the model config, tokenizer and chat template built from its metadata fail cleanly,
//!   and a tokenizer that builds returns only ids below `n_vocab`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pyramid_gguf::{GgufFile, GgufWriter};
use pyramid_model::ModelConfig;
use pyramid_tokenizer::{ChatTemplate, StreamDecoder, Tokenizer};

/// Re-encoding pads every tensor to the file's alignment (up to 1 MiB): skip files whose
/// copy would be far larger than themselves (many tiny tensors overlapping in the input).
const MAX_REWRITE_BYTES: u64 = 64 << 20;

fuzz_target!(|data: &[u8]| {
    let Ok(file) = GgufFile::from_bytes(data.to_vec()) else {
        return;
    };
    let md = file.metadata();
    for (key, value) in md.iter() {
        let _ = (
            md.get_str(key),
            md.get_u64(key),
            md.get_f32(key),
            md.get_bool(key),
        );
        let _ = (
            md.get_str_array(key),
            md.get_f32_array(key),
            md.get_i64_array(key),
        );
        let _ = (value.as_integer(), value.as_f64(), value.type_name());
    }

    let len = data.len() as u64;
    for t in file.tensors() {
        let bytes = file.tensor_bytes(t);
        assert_eq!(bytes.len() as u64, t.n_bytes, "tensor '{}'", t.name);
        assert!(
            t.offset <= len && t.n_bytes <= len,
            "tensor '{}' beyond the file",
            t.name
        );
        if let Ok(values) = file.tensor_f32(&t.name) {
            assert_eq!(values.len() as u64, t.n_elements(), "tensor '{}'", t.name);
        }
        assert!(file.tensor_info(&t.name).is_ok() && file.has_tensor(&t.name));
    }

    check_rewrite(&file);

    if let Ok(cfg) = ModelConfig::from_metadata(md) {
        let _ = (cfg.q_dim(), cfg.kv_dim());
    }
    let _ = ChatTemplate::from_gguf(md);
    if let Ok(tok) = Tokenizer::from_gguf(md) {
        let n_vocab = tok.n_vocab();
        for text in [
            "Hello, world! 123",
            "<|im_start|>user\nhi<|im_end|>",
            " \n\n  é🚀",
        ] {
            let Ok(ids) = tok.encode_prompt(text) else {
                continue;
            };
            assert!(
                ids.iter().all(|&id| (id as usize) < n_vocab),
                "{ids:?} >= {n_vocab}"
            );
            let whole = tok.decode(&ids).expect("ids the tokenizer returned decode");
            let mut stream = StreamDecoder::new();
            let mut pieces = String::new();
            for &id in &ids {
                pieces.push_str(&stream.push(&tok, id).expect("ids the tokenizer returned"));
            }
            pieces.push_str(&stream.finish());
            assert_eq!(pieces, whole);
        }
        let _ = tok.chat_template();
    }
});

/// Writes the parsed file again with the project's writer and reads it back: metadata,
/// tensor names, shapes, types and bytes must survive (offsets may change).
fn check_rewrite(file: &GgufFile) {
    let alignment = file
        .metadata()
        .get("general.alignment")
        .and_then(|v| v.as_integer())
        .map_or(32, |a| a as u64);
    let rewritten: u64 = file
        .tensors()
        .iter()
        .map(|t| t.n_bytes.div_ceil(alignment) * alignment)
        .sum();
    if rewritten > MAX_REWRITE_BYTES {
        return;
    }
    let mut w = GgufWriter::new();
    for (key, value) in file.metadata().iter() {
        // The writer refuses arrays that mix element types, which GGUF's nested arrays
        // can (each inner array has its own); such a file just is not re-encodable.
        if w.add_metadata(key, value.clone()).is_err() {
            return;
        }
    }
    for t in file.tensors() {
        w.add_tensor(
            t.name.clone(),
            &t.dims,
            t.ggml_type,
            file.tensor_bytes(t).to_vec(),
        )
        .expect("a tensor the reader accepted is one the writer accepts");
    }
    let again = GgufFile::from_bytes(w.to_bytes()).expect("the writer's output reads back");
    // Debug text, so NaN metadata compares equal to itself.
    assert_eq!(
        format!("{:?}", again.metadata()),
        format!("{:?}", file.metadata())
    );
    assert_eq!(again.tensors().len(), file.tensors().len());
    for (a, b) in again.tensors().iter().zip(file.tensors()) {
        assert_eq!(
            (&a.name, &a.dims, a.ggml_type, a.n_bytes),
            (&b.name, &b.dims, b.ggml_type, b.n_bytes)
        );
        assert_eq!(
            again.tensor_bytes(a),
            file.tensor_bytes(b),
            "tensor '{}'",
            a.name
        );
    }
}
