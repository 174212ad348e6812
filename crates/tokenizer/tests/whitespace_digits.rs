//! Whitespace, digit and punctuation mixes against Hugging Face `tokenizers` (issue 19).
//!
//! `data/whitespace_digits.json` holds the reference ids, made by `whitespace_digits.py` (which
//! says how to rerun it) from each GGUF's vocabulary and the pre-tokenizer of the model's
//! `tokenizer.json`. A missing model file skips that model's check.

mod common;

use common::*;
use serde_json::Value as Json;

const REFERENCE: &str = include_str!("data/whitespace_digits.json");

fn check_against_reference(file: &str) {
    let path = models_dir().join(file);
    if !path.is_file() {
        eprintln!("skipping {file}: {} is missing", path.display());
        return;
    }
    let reference: Json = serde_json::from_str(REFERENCE).expect("reference data is JSON");
    let cases = reference["models"][file]["cases"]
        .as_array()
        .unwrap_or_else(|| panic!("no reference cases for {file}"));
    assert!(!cases.is_empty(), "no reference cases for {file}");

    let tok = tokenizer(file);
    let mismatches: Vec<String> = cases
        .iter()
        .filter_map(|case| {
            let text = str_field(case, "text");
            let want = ids(&case["ids"]);
            let got = tok.encode(text, false).unwrap();
            (got != want).then(|| format!("{text:?}: got {got:?}, want {want:?}"))
        })
        .collect();
    assert!(
        mismatches.is_empty(),
        "{file}: {} of {} texts differ from Hugging Face:\n{}",
        mismatches.len(),
        cases.len(),
        mismatches.join("\n")
    );
}

#[test]
fn smollm2_whitespace_and_digits_match_hf() {
    check_against_reference(SMOLLM2);
}

#[test]
fn qwen25_whitespace_and_digits_match_hf() {
    check_against_reference(QWEN25);
}
