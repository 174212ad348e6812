//! Shared helpers: locating the real models and the Hugging Face reference data.

#![allow(dead_code)] // each test binary uses a different subset

use std::sync::OnceLock;

use pyramid_gguf::{GgufFile, Metadata};
use pyramid_tokenizer::{ChatMessage, Tokenizer, ToolCall};
use serde_json::Value as Json;

#[allow(unused_imports)] // as above
pub use pyramid_testdata::{ids, model_path, models_dir, refs as refs_json};

pub const SMOLLM2: &str = "smollm2-135m-instruct-q4_1.gguf";
pub const QWEN25: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";
pub const GEMMA3: &str = "gemma-3-270m-q4_k_m.gguf";

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

/// The golden file for a model file.
pub fn golden(file: &str) -> Json {
    refs_json(match file {
        SMOLLM2 => "golden-smollm2-135m-public.json",
        QWEN25 => "golden-qwen2.5-coder-0.5b-public.json",
        GEMMA3 => "golden-gemma3-270m-public.json",
        other => panic!("no golden file for {other}"),
    })
}

pub fn str_field<'a>(value: &'a Json, key: &str) -> &'a str {
    value[key]
        .as_str()
        .unwrap_or_else(|| panic!("field '{key}' is not a string in {value}"))
}

/// A chat message as the golden files write it (OpenAI's shape: `tool_calls` with
/// `function.name` and `function.arguments`, `tool_call_id`, `reasoning_content`).
pub fn message(m: &Json) -> ChatMessage {
    let mut message = ChatMessage::new(
        m["role"].as_str().unwrap(),
        m["content"].as_str().unwrap_or_default(),
    );
    message.tool_call_id = m["tool_call_id"].as_str().map(str::to_string);
    message.reasoning_content = m["reasoning_content"].as_str().map(str::to_string);
    if let Some(calls) = m["tool_calls"].as_array() {
        message.tool_calls = calls
            .iter()
            .map(|c| ToolCall {
                id: c["id"].as_str().unwrap().to_string(),
                name: c["function"]["name"].as_str().unwrap().to_string(),
                arguments: c["function"]["arguments"].clone(),
            })
            .collect();
    }
    message
}
