//! Shared helpers: locating the real models and the Hugging Face reference data.

#![allow(dead_code)] // each test binary uses a different subset

use std::path::PathBuf;
use std::sync::OnceLock;

use pyramid_gguf::{GgufFile, Metadata};
use pyramid_tokenizer::Tokenizer;
use serde_json::Value as Json;

pub const SMOLLM2: &str = "smollm2-135m-instruct-q4_1.gguf";
pub const QWEN25: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";
pub const GEMMA3: &str = "gemma-3-270m-q4_k_m.gguf";

/// `$PYRAMID_HOME/models/<file>`, with `PYRAMID_HOME` defaulting to `~/.cache/pyramid`,
/// whether or not the file is there.
pub fn model_location(file: &str) -> PathBuf {
    let home = std::env::var_os("PYRAMID_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/pyramid")))
        .expect("neither PYRAMID_HOME nor HOME is set");
    home.join("models").join(file)
}

/// [`model_location`], which must hold the model.
pub fn model_path(file: &str) -> PathBuf {
    let path = model_location(file);
    assert!(
        path.is_file(),
        "model file {} is missing: fetch the test models into $PYRAMID_HOME/models first",
        path.display()
    );
    path
}

pub fn metadata(file: &str) -> Metadata {
    let path = model_path(file);
    let gguf = GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    gguf.metadata().clone()
}

/// One tokenizer per model per test binary: building Qwen's 151k merges is not free.
pub fn tokenizer(file: &str) -> &'static Tokenizer {
    static SMOL: OnceLock<Tokenizer> = OnceLock::new();
    static QWEN: OnceLock<Tokenizer> = OnceLock::new();
    static GEMMA: OnceLock<Tokenizer> = OnceLock::new();
    let cell = match file {
        SMOLLM2 => &SMOL,
        QWEN25 => &QWEN,
        GEMMA3 => &GEMMA,
        other => panic!("no cached tokenizer for {other}"),
    };
    cell.get_or_init(|| Tokenizer::from_gguf(&metadata(file)).expect("tokenizer loads"))
}

pub fn refs_json(name: &str) -> Json {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/refs")
        .join(name);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The golden file for a model file.
pub fn golden(file: &str) -> Json {
    refs_json(match file {
        SMOLLM2 => "golden-smollm2-135m-public.json",
        QWEN25 => "golden-qwen2.5-coder-0.5b-public.json",
        GEMMA3 => "golden-gemma3-270m-public.json",
        other => panic!("no golden file for {other}"),
    })
}

pub fn ids(value: &Json) -> Vec<u32> {
    value
        .as_array()
        .expect("an array of token ids")
        .iter()
        .map(|v| {
            v.as_u64()
                .and_then(|v| u32::try_from(v).ok())
                .expect("a u32 id")
        })
        .collect()
}

pub fn str_field<'a>(value: &'a Json, key: &str) -> &'a str {
    value[key]
        .as_str()
        .unwrap_or_else(|| panic!("field '{key}' is not a string in {value}"))
}
