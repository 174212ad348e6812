//! Which tokens a text reply never samples, on the packaged models: media markers and
//! control tokens outside the chat format are suppressed; end tokens, the chat format's
//! own control tokens, tool-call tags and ordinary added tokens are not.

mod common;

use common::{tokenizer, GEMMA3, QWEN25};

fn id(tok: &pyramid_tokenizer::Tokenizer, text: &str) -> u32 {
    tok.added_token_id(text)
        .unwrap_or_else(|| panic!("{text} is in the vocabulary"))
}

#[test]
fn media_markers_and_stray_control_tokens_are_suppressed_the_chat_format_is_not() {
    let qwen = tokenizer(QWEN25);
    let suppressed = qwen.suppressed_ids();
    let is = |text: &str| suppressed.binary_search(&id(qwen, text)).is_ok();
    for text in ["<|vision_start|>", "<|image_pad|>", "<|fim_middle|>"] {
        assert!(is(text), "{text}");
    }
    // Ends a reply; opens a turn in the template; calls a tool.
    for text in ["<|im_end|>", "<|endoftext|>", "<|im_start|>", "<tool_call>"] {
        assert!(!is(text), "{text}");
    }
    assert!(suppressed.windows(2).all(|w| w[0] < w[1]), "ascending");

    let gemma = tokenizer(GEMMA3);
    let suppressed = gemma.suppressed_ids();
    let is = |text: &str| suppressed.binary_search(&id(gemma, text)).is_ok();
    // Typed as ordinary added tokens in this file, like Gemma's whitespace runs.
    assert!(is("<start_of_image>") && is("<pad>") && is("<unused0>"));
    assert!(!is("<end_of_turn>"));
    assert!(suppressed.binary_search(&id(gemma, "\n\n")).is_err());
}
