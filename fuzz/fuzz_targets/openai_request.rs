//! OpenAI request parsing and validation (`pyramid_server::api::parse`), then what the
//! server does next with a chat request: render it with a ChatML template and tokenize it.
//!
//! Input: a request body, parsed as both `/v1/chat/completions` and `/v1/completions`.
//! Properties:
//! - parsing returns a request or a 4xx `ApiError`, never panics, and the error body is the
//!   OpenAI error object;
//! - an accepted request holds only values the engine accepts: at least one message, at most
//!   4 non-empty stop strings, `max_tokens` ≥ 1, `top_logprobs` ≤ 20, and a sampler whose
//!   *f32* temperature is in [0, 2] and top_p in (0, 1] (the f64 → f32 cast must not move a
//!   value that passed validation out of range);
//! - the messages render and tokenize, with the tools' fallback prompt when there are tools;
//! - the grammar a request's tools and `response_format` ask for compiles against the
//!   vocabulary or fails with an error, never a panic or a hang.
#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use pyramid_fuzz_common::toy_metadata;
use pyramid_grammar::GrammarVocab;
use pyramid_server::api::{
    parse, Endpoint, GenerationRequest, Prompt, DEFAULT_MAX_TOOLS, MAX_TOP_LOGPROBS,
};
use pyramid_server::tools::{fallback_messages, reply_grammar};
use pyramid_tokenizer::{ChatTemplate, Tokenizer};

fn grammar_vocab() -> &'static GrammarVocab {
    static VOCAB: OnceLock<GrammarVocab> = OnceLock::new();
    VOCAB.get_or_init(|| {
        GrammarVocab::new(Arc::new(toy().0.clone())).expect("the toy vocabulary takes grammars")
    })
}

fn toy() -> &'static (Tokenizer, ChatTemplate) {
    static TOY: OnceLock<(Tokenizer, ChatTemplate)> = OnceLock::new();
    TOY.get_or_init(|| {
        let tok = Tokenizer::from_gguf(&toy_metadata("smollm")).expect("the toy vocabulary builds");
        let template = tok.chat_template().expect("the toy vocabulary has ChatML");
        (tok, template)
    })
}

fuzz_target!(|data: &[u8]| {
    for endpoint in [Endpoint::Chat, Endpoint::Completion] {
        match parse(endpoint, data, DEFAULT_MAX_TOOLS) {
            Ok(request) => check_request(endpoint, &request),
            Err(err) => {
                assert!(
                    err.status.is_client_error(),
                    "{endpoint:?}: {} {err}",
                    err.status
                );
                let body = err.body();
                assert!(body["error"]["message"].is_string(), "{body}");
                assert!(serde_json_roundtrips(&body));
            }
        }
    }
});

fn check_request(endpoint: Endpoint, r: &GenerationRequest) {
    assert_eq!(r.endpoint, endpoint);
    let s = &r.sampler;
    assert!(
        s.temperature.is_finite() && (0.0..=2.0).contains(&s.temperature),
        "temperature {}",
        s.temperature
    );
    assert!(
        s.top_p > 0.0 && s.top_p <= 1.0,
        "top_p {} (as f32) was accepted",
        s.top_p
    );
    assert!(
        r.stop.len() <= 4 && r.stop.iter().all(|s| !s.is_empty()),
        "{:?}",
        r.stop
    );
    assert!(r.max_tokens.is_none_or(|n| n >= 1));
    assert!(r.logprobs.is_none_or(|k| k <= MAX_TOP_LOGPROBS));
    match (&r.prompt, endpoint) {
        (Prompt::Chat(messages), Endpoint::Chat) => {
            assert!(!messages.is_empty());
            for m in messages {
                assert!(
                    matches!(m.role.as_str(), "system" | "user" | "assistant" | "tool"),
                    "{}",
                    m.role
                );
            }
            let (tok, template) = toy();
            let messages = match &r.tools {
                Some(tools) => fallback_messages(messages, tools.prompt_tools()),
                None => messages.clone(),
            };
            let text = template
                .render(&messages, true)
                .expect("ChatML renders any messages");
            let ids = tok
                .encode(&text, true)
                .expect("a rendered prompt tokenizes");
            assert!(!ids.is_empty());
            if let Some(grammar) = reply_grammar(r.tools.as_ref(), r.response_format.as_ref()) {
                let _ = grammar_vocab().compile(&grammar);
            }
        }
        (Prompt::Text(text), Endpoint::Completion) => {
            let (tok, _) = toy();
            tok.encode_prompt(text).expect("a prompt tokenizes");
        }
        (prompt, endpoint) => panic!("{endpoint:?} parsed as {prompt:?}"),
    }
}

fn serde_json_roundtrips(body: &serde_json::Value) -> bool {
    let text = body.to_string();
    serde_json::from_str::<serde_json::Value>(&text).is_ok_and(|v| &v == body)
}
