//! Tool-call parsing of streamed replies (`pyramid_server::tools::ToolCallParser`).
//!
//! Input: the first byte picks how the reply is cut into stream pieces and whether
//! parallel calls are allowed; the rest is the reply text (lossy UTF-8).
//! Properties:
//! - the parser never panics, and the pieces it returns are the same however the reply is
//!   cut (whole, or in pieces of 1–16 bytes on character boundaries);
//! - its text pieces and the calls' blocks add up to the reply: text is only held back,
//!   never lost, and what is not a call comes back as text, in order;
//! - every call names a known function and carries a JSON object as arguments, and with
//!   parallel calls off at most one call comes back.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pyramid_server::tools::{Piece, ToolCallParser, ToolSet};
use serde_json::{json, Map, Value};

fn tools(parallel: bool) -> ToolSet {
    let mut body = Map::new();
    body.insert(
        "tools".into(),
        json!([
            {"type": "function", "function": {"name": "get_weather"}},
            {"type": "function", "function": {"name": "now"}}
        ]),
    );
    body.insert("parallel_tool_calls".into(), json!(parallel));
    ToolSet::parse(&body, pyramid_server::api::DEFAULT_MAX_TOOLS)
        .expect("valid tools")
        .expect("some tools")
}

fn parse(tools: &ToolSet, text: &str, piece: usize) -> Vec<Piece> {
    let mut parser = ToolCallParser::new(tools);
    let mut out = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let mut cut = piece.min(rest.len());
        while !rest.is_char_boundary(cut) {
            cut += 1;
        }
        out.extend(parser.push(&rest[..cut]));
        rest = &rest[cut..];
    }
    out.extend(parser.finish());
    assert_eq!(
        parser.n_calls(),
        out.iter().filter(|p| matches!(p, Piece::Call(_))).count()
    );
    normalise(out)
}

/// Adjacent text pieces merged: how text is split into pieces is not a property.
fn normalise(pieces: Vec<Piece>) -> Vec<Piece> {
    let mut out: Vec<Piece> = Vec::new();
    for piece in pieces {
        match (out.last_mut(), piece) {
            (_, Piece::Text(t)) if t.is_empty() => {}
            (Some(Piece::Text(last)), Piece::Text(t)) => last.push_str(&t),
            (_, piece) => out.push(piece),
        }
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let Some((&control, text)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(text);
    let tools = tools(control & 0x80 == 0);
    let whole = parse(&tools, &text, usize::MAX);
    let piece = usize::from(control & 0x0f) + 1;
    assert_eq!(
        parse(&tools, &text, piece),
        whole,
        "pieces of {piece} bytes"
    );
    let mut calls = 0;
    let mut text_len = 0;
    for p in &whole {
        match p {
            Piece::Text(t) => text_len += t.len(),
            Piece::Call(call) => {
                calls += 1;
                assert!(
                    ["get_weather", "now"].contains(&call.name.as_str()),
                    "{call:?}"
                );
                let args: Value =
                    serde_json::from_str(&call.arguments).expect("arguments are JSON");
                assert!(args.is_object(), "{call:?}");
            }
        }
    }
    if control & 0x80 != 0 {
        assert!(calls <= 1, "{calls} calls without parallel calls");
    }
    // Calls take text out of the reply; without calls, the text is the whole reply.
    if calls == 0 {
        assert_eq!(text_len, text.len());
    } else {
        assert!(text_len < text.len());
    }
});
