//! What the fuzz targets and the seed generator share.
//!
//! - [`toy_metadata`]: a byte-level BPE vocabulary small enough to build in a millisecond
//!   and to write into a seed file, with every kind of added token the tokenizer treats
//!   specially (control, user-defined, one that is a prefix of others, a multi-byte one).
//! - [`PRE_TYPES`]: one `tokenizer.ggml.pre` name per pre-tokenizer rule set, so the toy
//!   vocabulary exercises every rule even where no model file is present.
//! - [`model_files`]: the real GGUF models in the pyramid cache, if any; targets add their
//!   tokenizers when present, so a crash found with them needs the same files to reproduce.
//! - [`nul_fields`]: the `\0`-separated fields a structured input is written as.

use std::path::PathBuf;

use pyramid_gguf::{Metadata, Value};
use pyramid_model::synthetic::byte_char;

/// One name per rule set in `PreType`: Default, Gpt2, Llama3, Qwen2, Smollm.
pub const PRE_TYPES: [&str; 5] = ["default", "gpt2", "llama-bpe", "qwen2", "smollm"];

/// A ChatML template as Qwen2.5 and SmolLM2 ship it, without their default system prompt.
pub const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// Merge rules of the toy vocabulary, in priority order, as byte-level pieces: common English
/// pairs, whitespace runs (`Ġ` is a space, `Ċ` a newline, `ĉ` a tab), digits, punctuation.
const TOY_MERGES: &[(&str, &str)] = &[
    ("Ġ", "t"),
    ("h", "e"),
    ("Ġt", "he"),
    ("i", "n"),
    ("Ġ", "a"),
    ("e", "r"),
    ("o", "n"),
    ("Ġ", "s"),
    ("r", "e"),
    ("a", "t"),
    ("Ġ", "w"),
    ("o", "r"),
    ("e", "n"),
    ("t", "h"),
    ("th", "e"),
    ("in", "g"),
    ("Ġ", "in"),
    ("Ġs", "t"),
    ("Ċ", "Ċ"),
    ("Ġ", "Ġ"),
    ("ĠĠ", "ĠĠ"),
    ("ĉ", "ĉ"),
    ("Ġ", "Ċ"),
    ("1", "2"),
    ("12", "3"),
    ("Ġ", "1"),
    ("0", "0"),
    ("'", "s"),
    ("Ġ", "("),
    (")", ";"),
    ("{", "}"),
    ("=", "="),
    ("Ã", "©"),
    ("ð", "Ł"),
];

/// Added tokens of the toy vocabulary: (text, GGUF token type). 3 is control, 4 user-defined.
const TOY_ADDED: &[(&str, i32)] = &[
    ("<|endoftext|>", 3),
    ("<|im_start|>", 3),
    ("<|im_end|>", 3),
    ("<tool>", 4),
    // A user-defined prefix of the control tokens: without parse_special it wins there.
    ("<|im", 4),
    // Multi-byte text, matched on its first byte like any other.
    ("→", 4),
];

/// Byte-level pieces for `bytes`, through the synthetic models' GPT-2 byte table (kept apart
/// from the tokenizer, so the vocabulary below does not depend on the code under test).
pub fn byte_level_encode(bytes: &[u8]) -> String {
    bytes.iter().map(|&b| byte_char(b)).collect()
}

/// The toy vocabulary as GGUF metadata for pre-tokenizer `pre`: 256 byte tokens, one token
/// per [`TOY_MERGES`] rule, then [`TOY_ADDED`]. BOS is `<|endoftext|>`, EOS `<|im_end|>`;
/// `add_bos_token` is on for `llama-bpe` (as Llama 3 has it) so `encode_prompt` is exercised.
pub fn toy_metadata(pre: &str) -> Metadata {
    let mut pieces: Vec<String> = (0..=255u8).map(|b| byte_level_encode(&[b])).collect();
    let mut merges = Vec::with_capacity(TOY_MERGES.len());
    for (a, b) in TOY_MERGES {
        let joined = format!("{a}{b}");
        if !pieces.contains(&joined) {
            pieces.push(joined);
        }
        merges.push(format!("{a} {b}"));
    }
    let mut types = vec![1i32; pieces.len()];
    for (text, ty) in TOY_ADDED {
        pieces.push((*text).to_owned());
        types.push(*ty);
    }
    let id_of = |text: &str| -> u32 {
        let idx = pieces
            .iter()
            .position(|p| p == text)
            .expect("the token is in TOY_ADDED");
        u32::try_from(idx).expect("the toy vocabulary is tiny")
    };
    let (bos, eos) = (id_of("<|endoftext|>"), id_of("<|im_end|>"));
    let strings = |v: Vec<String>| Value::Array(v.into_iter().map(Value::String).collect());
    let mut md = Metadata::new();
    md.insert("tokenizer.ggml.model", Value::String("gpt2".into()));
    md.insert("tokenizer.ggml.pre", Value::String(pre.into()));
    md.insert("tokenizer.ggml.tokens", strings(pieces));
    md.insert(
        "tokenizer.ggml.token_type",
        Value::Array(types.into_iter().map(Value::I32).collect()),
    );
    md.insert("tokenizer.ggml.merges", strings(merges));
    md.insert("tokenizer.ggml.bos_token_id", Value::U32(bos));
    md.insert("tokenizer.ggml.eos_token_id", Value::U32(eos));
    md.insert(
        "tokenizer.ggml.add_bos_token",
        Value::Bool(pre == "llama-bpe"),
    );
    md.insert("tokenizer.chat_template", Value::String(CHATML.into()));
    md
}

/// The `*.gguf` files in `$PYRAMID_HOME/models` (default `~/.cache/pyramid/models`), sorted
/// by name so a target's choice of tokenizer from an input byte is stable on one machine.
pub fn model_files() -> Vec<PathBuf> {
    let home = std::env::var_os("PYRAMID_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/pyramid")));
    let Some(dir) = home.map(|h| h.join("models")) else {
        return Vec::new();
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "gguf"))
        .collect();
    files.sort();
    files
}

/// The fields of `data` between `\0` bytes.
pub fn nul_fields(data: &[u8]) -> impl Iterator<Item = &[u8]> {
    data.split(|&b| b == 0)
}
