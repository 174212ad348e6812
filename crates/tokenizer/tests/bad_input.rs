//! Bad ids and bad metadata are errors that name the problem, never panics.

mod common;

use common::*;
use pyramid_gguf::{Metadata, Value};
use pyramid_tokenizer::{ChatTemplate, StreamDecoder, Tokenizer, TokenizerError};

/// The real SmolLM2 metadata with `edit` applied to each entry (`None` drops it).
fn edited(edit: impl Fn(&str, &Value) -> Option<Value>) -> Metadata {
    let mut out = Metadata::new();
    for (key, value) in metadata(SMOLLM2).iter() {
        if let Some(v) = edit(key, value) {
            out.insert(key, v);
        }
    }
    out
}

#[test]
fn out_of_range_id_is_an_error() {
    let tok = tokenizer(SMOLLM2);
    let n = u32::try_from(tok.n_vocab()).unwrap();
    for bad in [n, n + 1, u32::MAX] {
        let err = tok.decode(&[1, bad]).unwrap_err();
        assert!(
            matches!(err, TokenizerError::TokenOutOfRange { id, n_vocab } if id == bad && n_vocab == tok.n_vocab()),
            "{err}"
        );
        assert!(err.to_string().contains(&bad.to_string()));
        assert!(tok.token_bytes(bad).is_none());
        assert!(tok.token_piece(bad).is_none());
        assert!(!tok.is_end_of_generation(bad));
        assert!(StreamDecoder::new().push(tok, bad).is_err());
    }
}

#[test]
fn missing_tokens_array_is_an_error() {
    let md = edited(|k, v| (k != "tokenizer.ggml.tokens").then(|| v.clone()));
    let err = Tokenizer::from_gguf(&md).unwrap_err();
    assert!(matches!(err, TokenizerError::Metadata(_)), "{err}");
    assert!(err.to_string().contains("tokenizer.ggml.tokens"), "{err}");
}

#[test]
fn sentencepiece_without_scores_is_named() {
    let md = edited(|k, v| match k {
        "tokenizer.ggml.model" => Some(Value::String("llama".into())),
        "tokenizer.ggml.scores" => None,
        _ => Some(v.clone()),
    });
    let err = Tokenizer::from_gguf(&md).unwrap_err();
    assert!(matches!(err, TokenizerError::MissingScores), "{err}");
    assert!(err.to_string().contains("tokenizer.ggml.scores"), "{err}");
}

#[test]
fn unsupported_model_type_is_named() {
    for model in ["bert", "t5", "rwkv"] {
        let md = edited(|k, v| {
            Some(if k == "tokenizer.ggml.model" {
                Value::String(model.into())
            } else {
                v.clone()
            })
        });
        let err = Tokenizer::from_gguf(&md).unwrap_err();
        assert!(
            matches!(&err, TokenizerError::Unsupported(m) if m == model),
            "{err}"
        );
        assert!(err.to_string().contains(model));
    }
}

#[test]
fn model_without_chat_template_is_a_clear_error() {
    let md = edited(|k, v| (k != "tokenizer.chat_template").then(|| v.clone()));
    let err = ChatTemplate::from_gguf(&md).unwrap_err();
    assert!(matches!(err, TokenizerError::NoChatTemplate), "{err}");
    let tok = Tokenizer::from_gguf(&md).unwrap();
    assert!(tok.chat_template_source().is_none());
    assert!(matches!(
        tok.chat_template(),
        Err(TokenizerError::NoChatTemplate)
    ));
}

#[test]
fn unknown_pre_type_falls_back_to_gpt2() {
    let md = edited(|k, v| {
        Some(if k == "tokenizer.ggml.pre" {
            Value::String("some-future-pre".into())
        } else {
            v.clone()
        })
    });
    let tok = Tokenizer::from_gguf(&md).unwrap();
    assert_eq!(tok.pre_type(), pyramid_tokenizer::PreType::Gpt2);
    let s = "fallback still round-trips 123";
    assert_eq!(tok.decode(&tok.encode(s, true).unwrap()).unwrap(), s);
}
