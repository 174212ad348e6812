//! Reading a reply's tool calls as it streams in: `<tool_call>` blocks, or a whole reply
//! that is one untagged call.

use serde_json::Value;

use super::{ToolSet, CLOSE, OPEN};

/// `text` without a surrounding Markdown code fence (```` ```json ... ``` ````).
fn unfenced(text: &str) -> &str {
    let text = text.trim();
    let Some(inner) = text.strip_prefix("```").and_then(|t| t.strip_suffix("```")) else {
        return text;
    };
    // The fence's language tag runs to the first newline.
    inner.split_once('\n').map_or(inner, |(_, body)| body)
}

/// A call parsed from a reply.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedCall {
    pub name: String,
    /// The arguments object as compact JSON text, as OpenAI returns it.
    pub arguments: String,
}

/// What the parser lets through: text of the answer, or a complete call.
#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    Text(String),
    Call(ParsedCall),
}

/// A reply read as it streams in: through a [`ToolCallParser`] when the request's tools
/// may be called, as plain text otherwise. Both protocols' replies read it so.
#[derive(Debug)]
pub struct ReplyReader(Option<ToolCallParser>);

impl ReplyReader {
    pub fn new(tools: Option<&ToolSet>) -> Self {
        Self(tools.filter(|t| t.parses_calls()).map(ToolCallParser::new))
    }

    /// The pieces `text` completes (nothing for no text).
    pub fn push(&mut self, text: String) -> Vec<Piece> {
        match self.0.as_mut() {
            Some(parser) => parser.push(&text),
            None if text.is_empty() => Vec::new(),
            None => vec![Piece::Text(text)],
        }
    }

    /// What was held back, once the reply has ended.
    pub fn finish(&mut self) -> Vec<Piece> {
        self.0
            .as_mut()
            .map(ToolCallParser::finish)
            .unwrap_or_default()
    }

    /// Calls read so far.
    pub fn n_calls(&self) -> usize {
        self.0.as_ref().map_or(0, ToolCallParser::n_calls)
    }
}

/// Splits a streamed reply into text and calls. Text that might be the start of a
/// `<tool_call>` tag is held back until it is known not to be; a call is released when
/// its closing tag arrives. A block that is not a well-formed call of a known function
/// (bad JSON, unknown name, no closing tag by the end) is returned as text.
///
/// Small models often write the call without its tags: the whole reply one JSON object
/// `{"name": ..., "arguments": ...}`, bare or in a Markdown code fence. A reply that
/// starts like one (`{` or a fence) is held back to its end and read as a call if it is
/// exactly that, and as tagged text otherwise.
#[derive(Debug)]
pub struct ToolCallParser {
    names: Vec<String>,
    /// At most one call is returned (`parallel_tool_calls: false`); later blocks are text.
    single: bool,
    pending: String,
    inside: bool,
    /// A call just ended: the newline between calls that may follow belongs to neither.
    after_call: bool,
    /// Nothing but whitespace has come yet.
    at_start: bool,
    /// The reply started like an untagged call: everything is held to the end.
    untagged: bool,
    calls: usize,
}

impl ToolCallParser {
    pub fn new(tools: &ToolSet) -> Self {
        Self {
            names: tools.names.clone(),
            single: !tools.parallel,
            pending: String::new(),
            inside: false,
            after_call: false,
            at_start: true,
            untagged: false,
            calls: 0,
        }
    }

    /// How many calls were returned.
    pub fn n_calls(&self) -> usize {
        self.calls
    }

    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.pending.push_str(text);
        if self.at_start {
            let head = self.pending.trim_start();
            if head.is_empty() || (head.len() < 3 && "```".starts_with(head)) {
                return Vec::new();
            }
            self.at_start = false;
            self.untagged = head.starts_with('{') || head.starts_with("```");
        }
        if self.untagged {
            return Vec::new();
        }
        let mut out = Vec::new();
        loop {
            if self.after_call && !self.pending.is_empty() {
                self.after_call = false;
                if self.pending.starts_with('\n') {
                    self.pending.remove(0);
                }
            }
            if self.inside {
                let Some(end) = self.pending.find(CLOSE) else {
                    return out;
                };
                let block: String = self.pending.drain(..end + CLOSE.len()).collect();
                self.inside = false;
                let body = &block[OPEN.len()..end];
                match self.parse_call(body) {
                    Some(call) => {
                        self.calls += 1;
                        self.after_call = true;
                        out.push(Piece::Call(call));
                    }
                    None => out.push(Piece::Text(block)),
                }
            } else if let Some(start) = self
                .pending
                .find(OPEN)
                .filter(|_| !self.single || self.calls == 0)
            {
                if start > 0 {
                    out.push(Piece::Text(self.pending.drain(..start).collect()));
                }
                self.inside = true;
            } else {
                // Hold back a tail that could still become the opening tag.
                let hold = (1..OPEN.len().min(self.pending.len() + 1))
                    .rev()
                    .find(|&l| self.pending.ends_with(&OPEN[..l]))
                    .filter(|_| !self.single || self.calls == 0)
                    .unwrap_or(0);
                let release = self.pending.len() - hold;
                if release > 0 {
                    out.push(Piece::Text(self.pending.drain(..release).collect()));
                }
                return out;
            }
        }
    }

    /// Whatever is held back, as text: an unclosed block is not a call.
    pub fn finish(&mut self) -> Vec<Piece> {
        self.at_start = false;
        if std::mem::take(&mut self.untagged) {
            let reply = std::mem::take(&mut self.pending);
            if let Some(call) = self.parse_call(unfenced(&reply)) {
                self.calls += 1;
                return vec![Piece::Call(call)];
            }
            let mut out = self.push(&reply);
            out.extend(self.finish());
            return out;
        }
        self.inside = false;
        let rest = std::mem::take(&mut self.pending);
        if rest.is_empty() {
            Vec::new()
        } else {
            vec![Piece::Text(rest)]
        }
    }

    fn parse_call(&self, body: &str) -> Option<ParsedCall> {
        let Ok(Value::Object(call)) = serde_json::from_str::<Value>(body.trim()) else {
            return None;
        };
        let name = call.get("name")?.as_str()?;
        if !self.names.iter().any(|n| n == name) {
            return None;
        }
        let arguments = match call.get("arguments") {
            Some(args @ Value::Object(_)) => args.to_string(),
            // Some models write the arguments as a JSON string.
            Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
                Ok(args @ Value::Object(_)) => args.to_string(),
                _ => return None,
            },
            None => "{}".to_string(),
            Some(_) => return None,
        };
        Some(ParsedCall {
            name: name.to_string(),
            arguments,
        })
    }
}
