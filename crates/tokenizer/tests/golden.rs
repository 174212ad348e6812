//! The real models against Hugging Face transformers' reference outputs (testdata/refs).

mod common;

use common::*;
use pyramid_tokenizer::{ChatMessage, ChatTemplate, StreamDecoder};

fn check_prompt_ids(file: &str) {
    let tok = tokenizer(file);
    let golden = golden(file);
    for prompt in golden["prompts"].as_array().expect("prompts") {
        let id = str_field(prompt, "id");
        let text = str_field(prompt, "prompt_text");
        let want = ids(&prompt["prompt_token_ids"]);
        let got = tok.encode_prompt(text).unwrap();
        assert_eq!(got, want, "{file}: prompt '{id}' tokenizes differently");
    }
}

#[test]
fn smollm2_prompt_ids_match_reference() {
    check_prompt_ids(SMOLLM2);
}

#[test]
fn qwen25_prompt_ids_match_reference() {
    check_prompt_ids(QWEN25);
}

#[test]
fn gemma3_prompt_ids_match_reference() {
    check_prompt_ids(GEMMA3);
}

fn check_chat_template(file: &str) {
    let template = ChatTemplate::from_gguf(&metadata(file)).unwrap();
    let via_tokenizer = tokenizer(file).chat_template().unwrap();
    let inputs = refs_json("prompts-public.json");
    let golden = golden(file);
    let mut n_chat = 0;
    for input in inputs["prompts"].as_array().expect("prompts") {
        let Some(messages) = input["messages"].as_array() else {
            continue;
        };
        let id = str_field(input, "id");
        let messages: Vec<ChatMessage> = messages
            .iter()
            .map(|m| ChatMessage::new(str_field(m, "role"), str_field(m, "content")))
            .collect();
        let reference = golden["prompts"]
            .as_array()
            .expect("prompts")
            .iter()
            .find(|p| p["id"] == input["id"])
            .unwrap_or_else(|| panic!("{file}: no golden entry for '{id}'"));
        let want = str_field(reference, "prompt_text");
        assert_eq!(
            template.render(&messages, true).unwrap(),
            want,
            "{file}: '{id}'"
        );
        assert_eq!(via_tokenizer.render(&messages, true).unwrap(), want);
        n_chat += 1;
    }
    assert!(n_chat > 0, "prompts-public.json has no chat prompt");
}

#[test]
fn smollm2_chat_template_matches_reference() {
    check_chat_template(SMOLLM2);
}

#[test]
fn qwen25_chat_template_matches_reference() {
    check_chat_template(QWEN25);
}

fn check_decode_and_stream(file: &str) {
    let tok = tokenizer(file);
    let golden = golden(file);
    for prompt in golden["prompts"].as_array().expect("prompts") {
        let id = str_field(prompt, "id");
        let generated = ids(&prompt["generated_token_ids"]);
        let text = tok.decode(&generated).unwrap();
        assert_eq!(text, str_field(prompt, "generated_text"), "{file}: '{id}'");

        // Prompt and generation together, fed one token at a time.
        let mut all = ids(&prompt["prompt_token_ids"]);
        all.extend(&generated);
        let whole = tok.decode(&all).unwrap();
        let mut stream = StreamDecoder::new();
        let mut streamed = String::new();
        for &token in &all {
            let chunk = stream.push(tok, token).unwrap();
            // A chunk never carries a replacement character the whole text does not have.
            assert!(
                !chunk.contains('\u{FFFD}') || whole.contains('\u{FFFD}'),
                "{file}: '{id}': chunk {chunk:?} has a split character"
            );
            streamed.push_str(&chunk);
        }
        assert!(!stream.has_pending(), "{file}: '{id}': bytes left over");
        streamed.push_str(&stream.finish());
        assert_eq!(streamed, whole, "{file}: '{id}': streamed text differs");
    }
}

#[test]
fn smollm2_decode_and_stream_match_reference() {
    check_decode_and_stream(SMOLLM2);
}

#[test]
fn qwen25_decode_and_stream_match_reference() {
    check_decode_and_stream(QWEN25);
}

#[test]
fn unicode_prompt_splits_characters_across_tokens() {
    // The stream test above is only meaningful if some token ends mid-character.
    for file in [SMOLLM2, QWEN25] {
        let tok = tokenizer(file);
        let ids = tok.encode("Ünïcödé ✓ 12345 — 東京 🚀 test", true).unwrap();
        let split = ids
            .iter()
            .any(|&id| std::str::from_utf8(tok.token_bytes(id).unwrap()).is_err());
        assert!(split, "{file}: no token splits a character");
    }
}

#[test]
fn special_tokens_and_end_of_generation() {
    let smol = tokenizer(SMOLLM2);
    let im_end = smol.added_token_id("<|im_end|>").unwrap();
    assert_eq!(smol.encode("<|im_end|>", true).unwrap(), [im_end]);
    assert!(smol.encode("<|im_end|>", false).unwrap().len() > 1);
    assert_eq!(smol.decode(&[im_end]).unwrap(), "<|im_end|>");
    assert!(smol.is_end_of_generation(im_end));
    assert!(smol.is_end_of_generation(smol.eos_id().unwrap()));
    assert!(!smol.is_end_of_generation(smol.encode("Paris", false).unwrap()[0]));

    let qwen = tokenizer(QWEN25);
    for text in ["<|im_end|>", "<|endoftext|>"] {
        let id = qwen.added_token_id(text).unwrap();
        assert!(qwen.is_end_of_generation(id), "{text}");
    }
    let im_start = qwen.added_token_id("<|im_start|>").unwrap();
    assert!(!qwen.is_end_of_generation(im_start));
    assert_eq!(qwen.token_piece(im_start), Some("<|im_start|>"));
    let space_the = qwen.encode(" the", false).unwrap();
    assert_eq!(space_the.len(), 1);
    assert_eq!(qwen.token_piece(space_the[0]), Some("Ġthe"));
    assert_eq!(qwen.token_bytes(space_the[0]), Some(&b" the"[..]));
}
