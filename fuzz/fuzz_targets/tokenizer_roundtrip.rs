//! Tokenizer encode/decode round trip.
//!
//! Input: one selector byte, then the text (UTF-8; other bytes are replaced by U+FFFD) and,
//! read again as little-endian `u16`s, a list of ids to decode. The selector's bit 0 is
//! `parse_special`; the rest picks a tokenizer: the toy vocabulary under each pre-tokenizer
//! rule set, then the real models in the pyramid cache if there are any (byte-level BPE and,
//! with Gemma 3, SentencePiece).
//!
//! Properties, for every tokenizer and text:
//! - `encode` succeeds and every id is below `n_vocab`;
//! - `decode(encode(text)) == text` (byte-level BPE, SentencePiece with byte fallback and
//!   added tokens lose nothing but the bytes a vocabulary has no token for, and
//!   SentencePiece reads a literal `▁` as the space it stands for), or for vocabularies
//!   that compose to NFC first, the two agree after NFC;
//! - a `StreamDecoder` fed the ids one at a time emits exactly `decode(ids)`;
//! - `encode_prompt` adds BOS/EOS only as the metadata says;
//! - `encode_within` / `encode_prompt_within` give the same ids at a limit the text fits,
//!   and refuse with `TooManyTokens` at one token less (the early stop never misjudges:
//!   found here, it once refused text whose bytes the vocabulary drops);
//! - decoding arbitrary ids fails exactly when one is out of range, and streams the same.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use pyramid_fuzz_common::{model_files, toy_metadata, PRE_TYPES};
use pyramid_gguf::GgufFile;
use pyramid_tokenizer::{StreamDecoder, TokenType, Tokenizer, TokenizerError};
use unicode_normalization::UnicodeNormalization;

/// A tokenizer under test, which bytes its vocabulary has a token of their own for
/// (a byte-level piece, or SentencePiece's `<0xXX>`), and whether it writes spaces as `▁`.
struct Case {
    tok: Tokenizer,
    has_byte: [bool; 256],
    marks_spaces: bool,
}

impl Case {
    fn new(tok: Tokenizer) -> Case {
        let mut has_byte = [false; 256];
        let mut marks_spaces = false;
        for id in 0..tok.n_vocab() as u32 {
            let added = tok.token_type(id).is_some_and(TokenType::is_added);
            if let (false, Some(&[b])) = (added, tok.token_bytes(id)) {
                has_byte[usize::from(b)] = true;
            }
            marks_spaces |=
                tok.token_piece(id) == Some(SPACE_MARK) && tok.token_bytes(id) == Some(b" ");
        }
        Case {
            tok,
            has_byte,
            marks_spaces,
        }
    }

    /// What decoding the encoding of `text` must give: byte-level BPE drops a byte whose
    /// token the vocabulary lacks, as Hugging Face's BPE without an unknown token does
    /// (SmolLM2 lacks 0x04, 0x06, 0x13, 0x14, 0x16, 0x1D, 0xF1 and 0xF2); the rest comes
    /// back exactly, except that SentencePiece decodes a `▁` in the text as a space (so do
    /// Hugging Face and llama.cpp). Assumes no added token's text holds such a byte or mark
    /// (true of every vocabulary here), since added tokens are matched before the model.
    fn expected_round_trip(&self, text: &str) -> String {
        let text = if self.marks_spaces {
            text.replace(SPACE_MARK, " ")
        } else {
            text.to_owned()
        };
        let text = text.as_str();
        if text.bytes().all(|b| self.has_byte[usize::from(b)]) {
            return text.to_owned();
        }
        let kept: Vec<u8> = text
            .bytes()
            .filter(|&b| self.has_byte[usize::from(b)])
            .collect();
        String::from_utf8_lossy(&kept).into_owned()
    }
}

/// How SentencePiece writes a space inside its pieces.
const SPACE_MARK: &str = "\u{2581}";

fn cases() -> &'static [Case] {
    static ALL: OnceLock<Vec<Case>> = OnceLock::new();
    ALL.get_or_init(|| {
        let mut all: Vec<Case> = PRE_TYPES
            .iter()
            .map(|pre| {
                let tok =
                    Tokenizer::from_gguf(&toy_metadata(pre)).expect("the toy vocabulary builds");
                Case::new(tok)
            })
            .collect();
        for path in model_files() {
            let file = GgufFile::open(&path).expect("a cached model opens");
            let tok =
                Tokenizer::from_gguf(file.metadata()).expect("a cached model's tokenizer builds");
            let case = Case::new(tok);
            let missing: Vec<String> = (0..256)
                .filter(|&b| !case.has_byte[b])
                .map(|b| format!("{b:02x}"))
                .collect();
            eprintln!(
                "tokenizer_roundtrip: tokenizer {} is {} ({} tokens; no byte token for: {})",
                all.len(),
                path.display(),
                case.tok.n_vocab(),
                missing.join(" ")
            );
            all.push(case);
        }
        all
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let all = cases();
    let case = &all[usize::from(selector >> 1) % all.len()];
    let tok = &case.tok;
    let parse_special = selector & 1 == 1;
    let text = String::from_utf8_lossy(rest);
    let n_vocab = tok.n_vocab();

    let ids = tok.encode(&text, parse_special).expect("any text encodes");
    assert!(
        ids.iter().all(|&id| (id as usize) < n_vocab),
        "id beyond {n_vocab}: {ids:?}"
    );
    let decoded = tok.decode(&ids).expect("ids from encode decode");
    if tok.pre_type().normalizes_to_nfc() {
        // The normaliser runs on each run of text between added tokens, so compare NFC to NFC.
        let want = case.expected_round_trip(&text);
        let (want, got): (String, String) = (want.nfc().collect(), decoded.nfc().collect());
        assert_eq!(got, want, "round trip (after NFC) of {text:?}: ids {ids:?}");
    } else {
        let want = case.expected_round_trip(&text);
        assert_eq!(decoded, want, "round trip of {text:?}: ids {ids:?}");
    }
    assert_eq!(
        streamed(tok, &ids).expect("ids from encode stream"),
        decoded
    );

    let prompt = tok.encode_prompt(&text).expect("any prompt encodes");
    let special = if parse_special {
        ids.clone()
    } else {
        tok.encode(&text, true).expect("any text encodes")
    };
    let bos = tok.bos_id().filter(|_| tok.add_bos());
    let eos = tok.eos_id().filter(|_| tok.add_eos());
    let expected: Vec<u32> = bos.into_iter().chain(special).chain(eos).collect();
    assert_eq!(prompt, expected);

    // The early stop: a limit the text fits gives the same ids, one token less is refused.
    // One of the four checks per input (by its length), as each costs a whole encode.
    let (use_prompt, one_less) = (rest.len() & 1 == 1, rest.len() & 2 == 2);
    let (want, n) = if use_prompt {
        (&prompt, prompt.len())
    } else {
        (&ids, ids.len())
    };
    let within = |limit| {
        if use_prompt {
            tok.encode_prompt_within(&text, limit)
        } else {
            tok.encode_within(&text, parse_special, limit)
        }
    };
    match (one_less, n.checked_sub(1)) {
        (true, Some(short)) => {
            let got = within(short);
            assert!(
                matches!(got, Err(TokenizerError::TooManyTokens { .. })),
                "{got:?} at limit {short} for {n} tokens"
            );
        }
        _ => {
            let got = within(n);
            assert_eq!(got.as_ref().ok(), Some(want), "{got:?} at limit {n}");
        }
    }

    // The same bytes as ids; a few past the vocabulary so both outcomes are reached.
    let ids: Vec<u32> = rest
        .chunks_exact(2)
        .map(|c| u32::from(u16::from_le_bytes([c[0], c[1]])) % (n_vocab as u32 + 4))
        .collect();
    let in_range = ids.iter().all(|&id| (id as usize) < n_vocab);
    match (tok.decode(&ids), streamed(tok, &ids)) {
        (Ok(whole), Ok(pieces)) => {
            assert!(in_range);
            assert_eq!(pieces, whole, "stream vs decode of {ids:?}");
        }
        (Err(_), Err(_)) => assert!(!in_range),
        (a, b) => panic!("decode {a:?} but stream {b:?} for {ids:?}"),
    }
    for &id in &ids {
        let known = (id as usize) < n_vocab;
        assert_eq!(tok.token_bytes(id).is_some(), known);
        assert_eq!(tok.token_piece(id).is_some(), known);
        assert_eq!(tok.token_type(id).is_some(), known);
        let _ = tok.is_end_of_generation(id);
    }
});

/// `ids` through a [`StreamDecoder`], chunks concatenated, the held-back tail flushed.
fn streamed(tok: &Tokenizer, ids: &[u32]) -> pyramid_tokenizer::Result<String> {
    let mut stream = StreamDecoder::new();
    let mut out = String::new();
    for &id in ids {
        out.push_str(&stream.push(tok, id)?);
    }
    out.push_str(&stream.finish());
    Ok(out)
}
