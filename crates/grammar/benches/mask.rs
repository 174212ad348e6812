//! Per-token mask time: `cargo bench -p pyramid-grammar --bench mask`.
//!
//! Replays a JSON reply token by token under its schema on each test model's vocabulary
//! and reports the time of `mask_logits` (mask computation and its application to a
//! full row of logits) per token: the cost a constrained sequence adds to each decode step.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use pyramid_gguf::GgufFile;
use pyramid_grammar::{Grammar, GrammarVocab};
use pyramid_tokenizer::Tokenizer;
use serde_json::json;

fn main() {
    let home = std::env::var_os("PYRAMID_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache/pyramid"));
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 40},
            "age": {"type": "integer", "minimum": 0, "maximum": 130},
            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
            "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}, "required": ["city", "zip"]}
        },
        "required": ["name", "age", "tags", "address"],
        "additionalProperties": false
    });
    let person = r#"{"name": "Ada Lovelace, Countess of Lovelace", "age": 36, "tags": ["mathematician", "writer", "analyst", "poet"], "address": {"city": "London", "zip": "12345"}}"#;
    // Strings with length bounds: every token of the vocabulary is checked at each step.
    let words_schema = json!({"type": "array", "items": {"type": "string", "minLength": 3, "maxLength": 12}, "maxItems": 60});
    let words = r#"["apple", "river", "mountain", "quiet", "lantern", "orbit", "velvet", "harbor", "meadow", "cipher", "thunder", "pebble"]"#;
    let cases = [
        ("person", schema, person),
        ("bounded words", words_schema, words),
    ];
    for file in [
        "smollm2-135m-instruct-q4_1.gguf",
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    ] {
        let path = home.join("models").join(file);
        let gguf = GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let tok = Arc::new(Tokenizer::from_gguf(gguf.metadata()).unwrap());
        let started = Instant::now();
        let vocab = GrammarVocab::new(Arc::clone(&tok)).unwrap();
        let vocab_ms = started.elapsed().as_secs_f64() * 1e3;
        println!(
            "{file}: vocabulary of {} tokens prepared in {vocab_ms:.0} ms",
            tok.n_vocab()
        );
        for (name, schema, reply) in &cases {
            let ids = tok.encode(reply, false).unwrap();
            let mut logits = vec![0f32; tok.n_vocab()];
            let mut per_token = Vec::new();
            let mut compile_ms = Vec::new();
            for _ in 0..20 {
                let started = Instant::now();
                let mut c = vocab.compile(&Grammar::JsonSchema(schema.clone())).unwrap();
                compile_ms.push(started.elapsed().as_secs_f64() * 1e3);
                for &id in &ids {
                    logits.fill(0.0);
                    let started = Instant::now();
                    c.mask_logits(&mut logits).unwrap();
                    per_token.push(started.elapsed().as_secs_f64() * 1e6);
                    assert!(
                        logits[id as usize] == 0.0,
                        "the reply's own token is allowed"
                    );
                    c.accept(id).unwrap();
                }
            }
            per_token.sort_by(f64::total_cmp);
            compile_ms.sort_by(f64::total_cmp);
            let pct = |v: &[f64], p: f64| v[((v.len() - 1) as f64 * p) as usize];
            let mean = per_token.iter().sum::<f64>() / per_token.len() as f64;
            println!(
            "  {name}: schema compiled in {:.2} ms (median); \
             mask per token over {} tokens: mean {mean:.0} us, median {:.0} us, p90 {:.0} us, max {:.0} us",
            pct(&compile_ms, 0.5),
            per_token.len(),
            pct(&per_token, 0.5),
            pct(&per_token, 0.9),
            per_token[per_token.len() - 1],
        );
        }
    }
}
