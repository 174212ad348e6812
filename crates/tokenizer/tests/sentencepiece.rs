//! A SentencePiece vocabulary (Gemma 3 270M) against Hugging Face.
//!
//! `data/sentencepiece.json` holds the reference ids, made by `sentencepiece.py` (which says
//! how to rerun it) with the tokenizer transformers rebuilds from the same GGUF: code,
//! whitespace runs, digits, emoji, CJK and other scripts, HTML tags (user-defined tokens),
//! control tokens with and without special-token parsing, and characters only byte fallback
//! covers.

mod common;

use common::*;
use serde_json::Value as Json;

const REFERENCE: &str = include_str!("data/sentencepiece.json");

#[test]
fn gemma3_matches_hf_on_varied_text() {
    let tok = tokenizer(GEMMA3);
    let reference: Json = serde_json::from_str(REFERENCE).expect("reference data is JSON");
    let cases = reference["cases"].as_array().expect("cases");
    assert!(cases.len() >= 20, "too few reference cases");
    let mut mismatches = Vec::new();
    for case in cases {
        let text = str_field(case, "text");
        for (parse_special, key) in [(false, "ids"), (true, "ids_parse_special")] {
            let want = ids(&case[key]);
            let got = tok.encode(text, parse_special).unwrap();
            if got != want {
                mismatches.push(format!("{text:?} ({key}): got {got:?}, want {want:?}"));
            }
        }
        let special = ids(&case["ids_parse_special"]);
        let decoded = tok.decode(&special).unwrap();
        if decoded != str_field(case, "decoded") {
            mismatches.push(format!("{text:?}: decodes to {decoded:?}"));
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} differences from Hugging Face:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
}

#[test]
fn gemma3_prompts_start_with_bos_and_stop_at_end_of_turn() {
    let tok = tokenizer(GEMMA3);
    let ids = tok.encode_prompt("Hello").unwrap();
    assert_eq!(ids[0], tok.bos_id().expect("Gemma has BOS"));
    assert_eq!(tok.token_piece(ids[0]), Some("<bos>"));
    let end_of_turn = tok
        .added_token_id("<end_of_turn>")
        .expect("in the vocabulary");
    assert!(tok.is_end_of_generation(end_of_turn));
    assert!(tok.is_end_of_generation(tok.eos_id().expect("Gemma has EOS")));
}

#[test]
fn gemma3_round_trips_text() {
    let tok = tokenizer(GEMMA3);
    for text in [
        "plain words and  double  spaces",
        "tabs\tand\nnewlines\n\n",
        "東京 🚀 Ünïcödé \u{e000}",
        "<table><td>x</td></table>",
    ] {
        let ids = tok.encode(text, false).unwrap();
        assert_eq!(tok.decode(&ids).unwrap(), text);
    }
}
