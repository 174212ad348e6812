//! What the test suites share: the cached real models (CI fetches them before the tests
//! run, `scripts/test.sh` on a developer's machine) and the Hugging Face reference files
//! under `testdata/refs` (see its README for their provenance).
//!
//! A dev-dependency only. Its functions panic with a message naming the missing or broken
//! file, which is how a test should fail when its data is not in place.

use std::path::PathBuf;

use serde_json::Value;

/// The directory the models are cached in (`$PYRAMID_HOME/models`, by default under
/// `~/.cache/pyramid`).
pub fn models_dir() -> PathBuf {
    pyramid_registry::ModelCache::from_env()
        .expect("a cache directory (PYRAMID_HOME or HOME)")
        .models_dir()
}

/// The path of a cached model file, which must be there.
pub fn model_path(file: &str) -> PathBuf {
    let path = models_dir().join(file);
    assert!(
        path.is_file(),
        "{} is missing: run scripts/test.sh (or `pyramid fetch`) first",
        path.display()
    );
    path
}

/// The path of a file under `testdata/refs`.
pub fn refs_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/refs")
        .join(name)
}

/// A public-domain book (`testdata/texts`, see its README): a long context of real prose.
pub fn long_text() -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/texts/alice-in-wonderland.txt");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// A JSON file under `testdata/refs`.
pub fn refs(name: &str) -> Value {
    let path = refs_path(name);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The tiny Hugging Face model directories under `testdata/hf` (`make.py` there made
/// them), each with transformers' outputs in `reference.json`.
pub const HF_FIXTURES: [&str; 3] = ["tiny-llama", "tiny-qwen2", "tiny-gemma3"];

/// The tiny models of the newer families under `testdata/hf` (`families.py` there made
/// them): each a directory and, inside it, the same model as a GGUF file written by
/// llama.cpp's converter (`<name>.gguf`), with transformers' outputs in `reference.json`.
pub const FAMILY_FIXTURES: [&str; 4] = ["tiny-qwen3", "tiny-smollm3", "tiny-phi3", "tiny-qwen3moe"];

/// The path of a file or directory under `testdata/hf`.
pub fn hf_fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/hf")
        .join(name)
}

/// A file of `testdata/gguf-quants`: one tiny model quantised by llama.cpp's
/// `llama-quantize` to each of its types (`make.sh` there made them), with `types.json`
/// (every tensor's type) and `dequant.json` (gguf-py's dequantised values' SHA-256).
pub fn quantized_fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/gguf-quants")
        .join(name)
}

/// `reference.json` of one of [`HF_FIXTURES`].
pub fn hf_reference(name: &str) -> Value {
    let path = hf_fixture(name).join("reference.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The largest difference between `logits` (`[positions, n_vocab]`, row after row) and
/// a reference's `[[f32; n_vocab]; positions]` JSON array of them.
pub fn worst_logit_gap(logits: &[f32], reference: &Value) -> f64 {
    let rows = reference.as_array().expect("logits are an array of rows");
    let n_vocab = rows.first().and_then(Value::as_array).map_or(0, Vec::len);
    let mut worst = 0.0f64;
    for (pos, want) in rows.iter().enumerate() {
        for (i, w) in want
            .as_array()
            .expect("a row is an array")
            .iter()
            .enumerate()
        {
            let got = f64::from(logits[pos * n_vocab + i]);
            worst = worst.max((got - w.as_f64().expect("a logit is a number")).abs());
        }
    }
    worst
}

/// A JSON array of token ids.
pub fn ids(value: &Value) -> Vec<u32> {
    value
        .as_array()
        .expect("an array of token ids")
        .iter()
        .map(|id| {
            let id = id.as_u64().expect("a token id");
            u32::try_from(id).expect("a token id within u32")
        })
        .collect()
}

/// `(id, prompt_token_ids)` of every prompt in a reference file.
pub fn reference_prompts(name: &str) -> Vec<(String, Vec<u32>)> {
    refs(name)["prompts"]
        .as_array()
        .unwrap_or_else(|| panic!("{name} has no prompts array"))
        .iter()
        .map(|p| {
            let id = p["id"].as_str().expect("a prompt id").to_string();
            (id, ids(&p["prompt_token_ids"]))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_public_prompts_have_ids_and_tokens() {
        let prompts = reference_prompts("golden-smollm2-135m-public.json");
        assert!(!prompts.is_empty());
        for (id, tokens) in &prompts {
            assert!(!id.is_empty() && !tokens.is_empty(), "{id}");
        }
    }

    #[test]
    #[should_panic(expected = "cannot read")]
    fn a_missing_reference_names_its_path() {
        refs("no-such-file.json");
    }
}
