//! Unit tests on a toy vocabulary built in memory (the real models are in `tests/`).

use pyramid_gguf::{Metadata, Value};

use super::*;
use crate::vocab::byte_level_encode;

/// 256 byte tokens, three merges (`Ġt`, `he`, `Ġthe`), then added tokens:
/// 259 `<|im_start|>` and 260 `<|im_end|>` (control), 261 `<tool>` (user-defined).
fn toy_metadata() -> Metadata {
    let mut pieces: Vec<String> = (0..=255u8).map(|b| byte_level_encode(&[b])).collect();
    pieces.extend(["Ġt", "he", "Ġthe", "<|im_start|>", "<|im_end|>", "<tool>"].map(String::from));
    let mut types = vec![1i32; pieces.len()];
    types[259] = 3;
    types[260] = 3;
    types[261] = 4;
    let strings = |v: Vec<String>| Value::Array(v.into_iter().map(Value::String).collect());
    let mut md = Metadata::new();
    md.insert("tokenizer.ggml.model", Value::String("gpt2".into()));
    md.insert("tokenizer.ggml.pre", Value::String("smollm".into()));
    md.insert("tokenizer.ggml.tokens", strings(pieces));
    md.insert(
        "tokenizer.ggml.token_type",
        Value::Array(types.into_iter().map(Value::I32).collect()),
    );
    md.insert(
        "tokenizer.ggml.merges",
        strings(vec!["Ġ t".into(), "h e".into(), "Ġt he".into()]),
    );
    md.insert("tokenizer.ggml.bos_token_id", Value::U32(259));
    md.insert("tokenizer.ggml.eos_token_id", Value::U32(260));
    md
}

fn toy() -> Tokenizer {
    Tokenizer::from_gguf(&toy_metadata()).unwrap()
}

#[test]
fn added_tokens_are_parsed_only_when_asked() {
    let tok = toy();
    let ids = tok.encode("<|im_start|>the the<|im_end|>", true).unwrap();
    assert_eq!(ids[0], 259);
    assert_eq!(*ids.last().unwrap(), 260);
    assert_eq!(ids[ids.len() - 2], 258); // "Ġthe"
    let plain = tok.encode("<|im_start|>", false).unwrap();
    assert_eq!(plain.len(), "<|im_start|>".len()); // one byte token per character
    assert_eq!(tok.decode(&plain).unwrap(), "<|im_start|>");
    // User-defined tokens are matched even without parse_special.
    assert_eq!(tok.encode("<tool>", false).unwrap(), [261]);
}

#[test]
fn encode_prompt_adds_bos_eos_only_when_metadata_says_so() {
    let tok = toy();
    assert_eq!(
        tok.encode_prompt("a").unwrap(),
        tok.encode("a", true).unwrap()
    );
    let mut md = toy_metadata();
    md.insert("tokenizer.ggml.add_bos_token", Value::Bool(true));
    md.insert("tokenizer.ggml.add_eos_token", Value::Bool(true));
    let tok = Tokenizer::from_gguf(&md).unwrap();
    let ids = tok.encode_prompt("a").unwrap();
    assert_eq!(ids.len(), 3);
    assert_eq!((ids[0], ids[2]), (259, 260));
}

#[test]
fn decode_matches_the_tokenizers_crate_on_normal_tokens() {
    let tok = toy();
    let ids = tok.encode("the théâtre 🚀\n\t x", false).unwrap();
    assert_eq!(Some(tok.decode(&ids).unwrap()), tok.decode_reference(&ids));
    assert_eq!(tok.decode(&ids).unwrap(), "the théâtre 🚀\n\t x");
}

#[test]
fn out_of_range_ids_are_errors() {
    let tok = toy();
    let n = tok.n_vocab() as u32;
    let err = tok.decode(&[1, n]).unwrap_err();
    assert!(
        matches!(err, TokenizerError::TokenOutOfRange { id, .. } if id == n),
        "{err}"
    );
    assert!(tok.token_bytes(n).is_none());
    assert!(tok.token_piece(u32::MAX).is_none());
    assert!(StreamDecoder::new().push(&tok, n).is_err());
}

#[test]
fn stream_holds_back_partial_characters() {
    let tok = toy();
    // "🚀" is 4 bytes and the toy vocabulary has one token per byte.
    let ids = tok.encode("a🚀b", false).unwrap();
    let mut stream = StreamDecoder::new();
    let chunks: Vec<String> = ids
        .iter()
        .map(|&id| stream.push(&tok, id).unwrap())
        .collect();
    assert_eq!(chunks, ["a", "", "", "", "🚀", "b"]);
    assert!(!stream.has_pending());

    // A lone lead byte followed by ASCII: replaced at once, like decode() does.
    let lead = tok.encode("🚀", false).unwrap()[0];
    let a = tok.encode("a", false).unwrap()[0];
    let mut stream = StreamDecoder::new();
    assert_eq!(stream.push(&tok, lead).unwrap(), "");
    assert_eq!(stream.push(&tok, a).unwrap(), "\u{FFFD}a");
    assert_eq!(tok.decode(&[lead, a]).unwrap(), "\u{FFFD}a");
    // A truncated tail is flushed by finish().
    assert_eq!(stream.push(&tok, lead).unwrap(), "");
    assert!(stream.has_pending());
    assert_eq!(stream.finish(), "\u{FFFD}");
}

#[test]
fn end_of_generation_covers_eos_and_known_end_tokens() {
    let tok = toy();
    assert!(tok.is_end_of_generation(260));
    assert!(!tok.is_end_of_generation(259));
    assert_eq!(tok.end_of_generation_ids(), [260]);
}

#[test]
fn phi3s_turn_end_ends_a_reply() {
    let mut md = toy_metadata();
    let mut tokens = md.get_array("tokenizer.ggml.tokens").unwrap().to_vec();
    let mut types = md.get_array("tokenizer.ggml.token_type").unwrap().to_vec();
    tokens.push(Value::String("<|end|>".into()));
    types.push(Value::I32(3));
    md.insert("tokenizer.ggml.tokens", Value::Array(tokens));
    md.insert("tokenizer.ggml.token_type", Value::Array(types));
    let tok = Tokenizer::from_gguf(&md).unwrap();
    assert_eq!(tok.end_of_generation_ids(), [260, 262]);
}

#[test]
fn unsupported_model_is_named() {
    let mut md = toy_metadata();
    md.insert("tokenizer.ggml.model", Value::String("rwkv".into()));
    let err = Tokenizer::from_gguf(&md).unwrap_err();
    assert!(
        matches!(&err, TokenizerError::Unsupported(m) if m == "rwkv"),
        "{err}"
    );
    assert!(err.to_string().contains("'rwkv'"));
}

#[test]
fn bad_metadata_is_reported_with_the_key() {
    let mut md = toy_metadata();
    md.insert(
        "tokenizer.ggml.token_type",
        Value::Array(vec![Value::I32(1)]),
    );
    let err = Tokenizer::from_gguf(&md).unwrap_err();
    assert!(
        matches!(err, TokenizerError::LengthMismatch { len: 1, .. }),
        "{err}"
    );

    let mut md = toy_metadata();
    md.insert("tokenizer.ggml.eos_token_id", Value::U32(9999));
    let err = Tokenizer::from_gguf(&md).unwrap_err();
    assert!(
        matches!(err, TokenizerError::SpecialIdOutOfRange { id: 9999, .. }),
        "{err}"
    );

    let mut md = toy_metadata();
    md.insert("tokenizer.ggml.unknown_token_id", Value::U32(70000));
    let err = Tokenizer::from_gguf(&md).unwrap_err();
    assert!(
        matches!(err, TokenizerError::SpecialIdOutOfRange { id: 70000, .. }),
        "{err}"
    );

    let mut md = toy_metadata();
    md.insert("tokenizer.ggml.pad_token_id", Value::I32(-1));
    md.insert("tokenizer.ggml.padding_token_id", Value::I32(-1));
    assert_eq!(Tokenizer::from_gguf(&md).unwrap().pad_id(), None);
}

#[test]
fn types_are_shareable_across_threads() {
    fn check<T: Send + Sync>() {}
    check::<Tokenizer>();
    check::<ChatTemplate>();
    check::<StreamDecoder>();
}

/// Prose, code, numbers and whitespace runs, in several scripts.
const MIXED_TEXT: &str = "The quick brown fox jumps over the lazy dog. It's 2024-05-17, \
    and 3.14159 is pi.\n\n  def main():\n    print(\"hello world\")  # comment\n\tTabs\tand   \
    spaces  \r\nNaïve café résumé — Ελληνικά κείμενα, русский текст, 中文文本 and 日本語. \
    list:\n\n1. first item\n2. second item\n<|im_start|>user\nhi there<|im_end|>\n";

/// The real models' tokenizers, when their files are in `$PYRAMID_HOME/models`.
fn real_tokenizers() -> Vec<Tokenizer> {
    let home = std::env::var_os("PYRAMID_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".cache/pyramid"))
        });
    let Some(home) = home else { return Vec::new() };
    [
        "smollm2-135m-instruct-q4_1.gguf",
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    ]
    .iter()
    .filter_map(|file| pyramid_gguf::GgufFile::open(home.join("models").join(file)).ok())
    .map(|f| Tokenizer::from_gguf(f.metadata()).unwrap())
    .collect()
}

#[test]
fn text_tokenised_in_pieces_gives_the_whole_texts_ids() {
    let mut tokenizers = vec![Tokenizer::from_gguf(&toy_metadata()).unwrap()];
    tokenizers.extend(real_tokenizers());
    println!(
        "{} tokenizers (the toy and the real models present)",
        tokenizers.len()
    );
    for tok in &tokenizers {
        let whole = tok
            .encode_in_pieces(MIXED_TEXT, true, usize::MAX, usize::MAX)
            .unwrap();
        for piece_bytes in [1, 5, 40, 300] {
            let pieces = tok
                .encode_in_pieces(MIXED_TEXT, true, usize::MAX, piece_bytes)
                .unwrap();
            assert_eq!(pieces, whole, "pieces of {piece_bytes} bytes");
        }
        assert_eq!(tok.encode(MIXED_TEXT, true).unwrap(), whole);
    }
}

#[test]
fn encoding_within_a_limit_stops_past_it() {
    let tok = Tokenizer::from_gguf(&toy_metadata()).unwrap();
    let text = "the theme of the thesis";
    let n = tok.encode(text, true).unwrap().len();
    assert_eq!(tok.encode_within(text, true, n).unwrap().len(), n);
    for limit in [0, 1, n - 1] {
        for piece_bytes in [1, 4, usize::MAX] {
            let err = tok
                .encode_in_pieces(text, true, limit, piece_bytes)
                .unwrap_err();
            assert!(matches!(err, TokenizerError::TooManyTokens { .. }), "{err}");
        }
    }
    // Far beyond the limit, refused from its length alone.
    let huge = "x".repeat(1 << 20);
    let err = tok.encode_within(&huge, true, 1000).unwrap_err();
    assert!(
        matches!(err, TokenizerError::TooManyTokens { limit: 1000 }),
        "{err}"
    );
    // BOS counts against the limit.
    let with_bos = tok.encode_prompt(text).unwrap().len();
    assert!(tok.encode_prompt_within(text, with_bos).is_ok());
    assert!(tok.encode_prompt_within(text, with_bos - 1).is_err());
}

#[test]
fn bytes_a_vocabulary_drops_do_not_count_against_the_limit() {
    // SmolLM2 has no token for 0x06: those bytes vanish, and a prompt of millions of them
    // and one word fits a limit of a few tokens.
    for tok in real_tokenizers() {
        let text = format!("{}hi", "\u{6}".repeat(200_000));
        let want = tok.encode(&text, true).unwrap();
        assert_eq!(tok.encode_within(&text, true, want.len()).unwrap(), want);
        // A text with no cut point is still refused from its length when it cannot fit.
        let err = tok
            .encode_within(&"x".repeat(1 << 20), true, 100)
            .unwrap_err();
        assert!(matches!(err, TokenizerError::TooManyTokens { .. }), "{err}");
    }
}
