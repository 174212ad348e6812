//! Tool-call parsing of streamed replies (`pyramid_server::tools::ToolCallParser`).
//!
//! Input: the first byte picks how the reply is cut into stream pieces and whether
//! parallel calls are allowed; the rest is the reply text (lossy UTF-8).
//! Properties:
//! - the parser never panics, and the pieces it returns are the same however the reply is
//!   cut (whole, or in pieces of 1–16 bytes on character boundaries), once neighbouring
//!   text and argument fragments are joined;
//! - every call is a start naming a known function, argument fragments that open a JSON
//!   object, and an end, and with parallel calls off at most one call comes back;
//! - text is only held back, never lost: a reply without calls and without a
//!   `<tool_call>` tag comes back whole.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pyramid_server::tools::{Piece, ToolCallParser, ToolSet};
use serde_json::{json, Map};

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
        out.iter()
            .filter(|p| matches!(p, Piece::CallStart(_)))
            .count()
    );
    normalise(out)
}

/// Neighbouring text pieces and argument fragments joined: how they are split into
/// pieces is not a property.
fn normalise(pieces: Vec<Piece>) -> Vec<Piece> {
    let mut out: Vec<Piece> = Vec::new();
    for piece in pieces {
        match (out.last_mut(), piece) {
            (_, Piece::Text(t)) if t.is_empty() => {}
            (Some(Piece::Text(last)), Piece::Text(t)) => last.push_str(&t),
            (Some(Piece::Arguments(last)), Piece::Arguments(t)) => last.push_str(&t),
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
    let mut open = false;
    for p in &whole {
        match p {
            Piece::Text(t) => {
                assert!(!open, "text inside a call");
                text_len += t.len();
            }
            Piece::Reasoning(_) => panic!("no thought without a thinking template"),
            Piece::CallStart(name) => {
                assert!(!open, "a call inside a call");
                assert!(["get_weather", "now"].contains(&name.as_str()), "{name}");
                calls += 1;
                open = true;
            }
            Piece::Arguments(args) => {
                assert!(open && args.starts_with('{'), "{args:?}");
            }
            Piece::CallEnd => {
                assert!(open, "an end without a call");
                open = false;
            }
        }
    }
    assert!(!open, "a call left open at the end");
    if control & 0x80 != 0 {
        assert!(calls <= 1, "{calls} calls without parallel calls");
    }
    if calls == 0 && !text.contains("<tool_call>") {
        assert_eq!(text_len, text.len());
    }
    assert!(text_len <= text.len());
});
