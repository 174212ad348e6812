//! Chat-template compile and render on hostile templates and messages.
//!
//! Input: a flags byte, then `\0`-separated fields: the template source, then role and
//! content pairs (one `user` message when none are given). Flags: bit 0 is
//! `add_generation_prompt`; bit 1 gives the template empty BOS/EOS texts instead of ChatML's.
//!
//! Property: compiling and rendering return, `Ok` or a `TokenizerError`, and never panic,
//! hang (libFuzzer's `-timeout`) or exhaust memory (`-rss_limit_mb`); the renderer's fuel and
//! output cap are what keep loops of 10⁵ × 10⁵ iterations within the timeout.
//!
//! Found: minijinja 2.24 parses `{% for in x %}` (no loop variable) and the error it then
//! raises has a span that ends before it starts, which its debug mode (on whenever
//! `debug_assertions` are) panicked formatting; `ChatTemplate` now turns debug mode off.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pyramid_fuzz_common::nul_fields;
use pyramid_tokenizer::{ChatMessage, ChatTemplate};

/// Conversations longer than this add nothing a shorter one does not reach.
const MAX_MESSAGES: usize = 16;

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let mut fields = nul_fields(rest).map(String::from_utf8_lossy);
    let Some(source) = fields.next() else {
        return;
    };
    let (bos, eos) = if flags & 2 == 0 {
        ("<|endoftext|>", "<|im_end|>")
    } else {
        ("", "")
    };
    let Ok(template) = ChatTemplate::new(source.into_owned(), bos, eos) else {
        return;
    };
    let mut messages = Vec::new();
    while let (Some(role), Some(content)) = (fields.next(), fields.next()) {
        messages.push(ChatMessage::new(role, content));
        if messages.len() == MAX_MESSAGES {
            break;
        }
    }
    if messages.is_empty() {
        messages.push(ChatMessage::new("user", "Hello"));
    }
    let _ = template.render(&messages, flags & 1 == 1);
});
