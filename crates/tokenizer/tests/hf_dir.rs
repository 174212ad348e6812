//! Tokenizers of Hugging Face directories against transformers.
//!
//! `testdata/hf/*/reference.json` (see `testdata/hf/make.py`) holds what transformers'
//! `AutoTokenizer` gives on 25 texts (code, whitespace runs, digits, emoji, CJK, Arabic,
//! combining marks, private-use characters, special tokens written inline): ids with and
//! without special-token parsing, with BOS/EOS as the post-processor adds them, and the
//! decoded text; and a chat rendering. The three tokenizers are a byte-level BPE with a
//! BOS template (Llama 3 style), Qwen2's NFC + regex + byte-level pipeline with its
//! merges written as strings, and Gemma's SentencePiece-style BPE with byte fallback.

use pyramid_testdata::{hf_fixture, hf_reference, ids, HF_FIXTURES};
use pyramid_tokenizer::{ChatMessage, StreamDecoder, Tokenizer};

#[test]
fn ids_and_texts_are_transformers_own() {
    for name in HF_FIXTURES {
        let tok =
            Tokenizer::from_hf_dir(&hf_fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        for case in hf_reference(name)["tokenizer_cases"].as_array().unwrap() {
            let text = case["text"].as_str().unwrap();
            let want = ids(&case["ids"]);
            assert_eq!(tok.encode(text, true).unwrap(), want, "{name}: {text:?}");
            assert_eq!(
                tok.encode(text, false).unwrap(),
                ids(&case["ids_split_special"]),
                "{name}, special tokens as text: {text:?}"
            );
            assert_eq!(
                tok.encode_prompt(text).unwrap(),
                ids(&case["ids_with_special"]),
                "{name}, as a prompt: {text:?}"
            );
            let decoded = case["decoded"].as_str().unwrap();
            assert_eq!(tok.decode(&want).unwrap(), decoded, "{name}: {text:?}");
            let mut stream = StreamDecoder::new();
            let mut streamed = String::new();
            for &id in &want {
                streamed.push_str(&stream.push(&tok, id).unwrap());
            }
            streamed.push_str(&stream.finish());
            assert_eq!(streamed, decoded, "{name}, streamed: {text:?}");
        }
    }
}

#[test]
fn special_tokens_and_end_tokens_come_from_the_directory() {
    for name in HF_FIXTURES {
        let tok = Tokenizer::from_hf_dir(&hf_fixture(name)).unwrap();
        let config = &hf_reference(name)["config"];
        let id = |key: &str| config[key].as_u64().map(|i| i as u32);
        assert_eq!(tok.bos_id(), id("bos_token_id"), "{name}");
        assert_eq!(tok.eos_id(), id("eos_token_id"), "{name}");
        for eos in config["generation_eos_token_ids"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let eos = eos.as_u64().unwrap() as u32;
            assert!(tok.is_end_of_generation(eos), "{name}: {eos} ends a reply");
        }
        assert_eq!(
            tok.n_vocab() as u64,
            config["vocab_size"].as_u64().unwrap(),
            "{name}"
        );
    }
    // Qwen2 adds nothing around a prompt; the others add BOS.
    assert!(!Tokenizer::from_hf_dir(&hf_fixture("tiny-qwen2"))
        .unwrap()
        .add_bos());
    assert!(Tokenizer::from_hf_dir(&hf_fixture("tiny-gemma3"))
        .unwrap()
        .add_bos());
}

/// Ids past the tokenizer's own but within the model's vocabulary (Qwen2 pads its
/// embedding table) decode to nothing, as in transformers.
#[test]
fn padding_ids_of_the_model_vocabulary_decode_to_nothing() {
    let tok = Tokenizer::from_hf_dir(&hf_fixture("tiny-qwen2")).unwrap();
    assert_eq!(tok.n_vocab(), 512);
    assert_eq!(tok.decode(&[511]).unwrap(), "");
    assert!(tok.decode(&[512]).is_err());
}

#[test]
fn chat_templates_render_as_transformers_renders_them() {
    for name in HF_FIXTURES {
        let tok = Tokenizer::from_hf_dir(&hf_fixture(name)).unwrap();
        let chat = &hf_reference(name)["chat"];
        let messages: Vec<ChatMessage> = chat["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| ChatMessage::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
            .collect();
        let template = tok.chat_template().unwrap();
        let rendered = template.render(&messages, true).unwrap();
        assert_eq!(rendered, chat["rendered"].as_str().unwrap(), "{name}");
        assert_eq!(
            template.render(&messages, false).unwrap(),
            chat["rendered_no_generation_prompt"].as_str().unwrap(),
            "{name}"
        );
        assert_eq!(
            tok.encode(&rendered, true).unwrap(),
            ids(&chat["ids"]),
            "{name}"
        );
    }
}

#[test]
fn a_prompt_past_the_limit_is_refused() {
    let tok = Tokenizer::from_hf_dir(&hf_fixture("tiny-gemma3")).unwrap();
    let text = "word ".repeat(10_000);
    assert!(tok.encode_prompt_within(&text, 100).is_err());
    let short = tok.encode_prompt_within("word word", 100).unwrap();
    assert_eq!(short, tok.encode_prompt("word word").unwrap());
}

#[test]
fn a_broken_directory_is_an_error_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let err = Tokenizer::from_hf_dir(dir.path()).unwrap_err().to_string();
    assert!(err.contains("has no tokenizer.json"), "{err}");
    std::fs::write(dir.path().join("tokenizer.json"), "{ not json").unwrap();
    let err = Tokenizer::from_hf_dir(dir.path()).unwrap_err().to_string();
    assert!(err.contains("tokenizer.json: not valid JSON"), "{err}");

    for entry in std::fs::read_dir(hf_fixture("tiny-gemma3")).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
    }
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        r#"{"bos_token": "<nope>"}"#,
    )
    .unwrap();
    let err = Tokenizer::from_hf_dir(dir.path()).unwrap_err().to_string();
    assert!(err.contains("'bos_token' is \"<nope>\""), "{err}");
}

/// Older directories: special tokens named only in `special_tokens_map.json`, and
/// transformers 4's `add_bos_token`, which decides over the post-processor.
#[test]
fn older_directories_name_tokens_where_transformers_4_did() {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(hf_fixture("tiny-gemma3")).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
    }
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        r#"{"add_bos_token": false}"#,
    )
    .unwrap();
    std::fs::write(
        dir.path().join("special_tokens_map.json"),
        r#"{"bos_token": {"content": "<bos>"}, "eos_token": "<end_of_turn>"}"#,
    )
    .unwrap();
    let tok = Tokenizer::from_hf_dir(dir.path()).unwrap();
    assert_eq!((tok.bos_id(), tok.eos_id()), (Some(2), Some(5)));
    assert!(!tok.add_bos());
    assert_eq!(
        tok.encode_prompt("hi").unwrap(),
        tok.encode("hi", true).unwrap()
    );
}
