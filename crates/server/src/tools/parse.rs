//! Reading a reply's tool calls as it streams in: `<tool_call>` blocks, or calls written
//! bare (a JSON object opening a line, perhaps in a Markdown code fence, one per line).
//!
//! A call's arguments stream out as the model writes them, compacted, so a client sees
//! the first delta with the call's name and then fragments of its arguments, as
//! llama.cpp and vLLM stream them; a reply read whole gives the concatenation.

use serde_json::Value;

use super::scan::{read_head, CompactJson, Head};
use super::{ToolSet, CLOSE, OPEN};
use crate::reasoning::{Thinking, ThoughtSplitter};

/// A call read whole.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedCall {
    pub name: String,
    /// The arguments object as compact JSON text, as OpenAI returns it.
    pub arguments: String,
}

/// What the parser lets through, in the reply's order.
#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    /// Text of a thinking model's thought ([`crate::reasoning`]).
    Reasoning(String),
    /// Text of the answer.
    Text(String),
    /// A call of the named function begins.
    CallStart(String),
    /// The next fragment of the open call's arguments.
    Arguments(String),
    /// The open call is complete (or was cut off by the end of the reply).
    CallEnd,
}

/// A reply's text and calls, gathered from its pieces.
#[derive(Debug, Default, PartialEq)]
pub struct Gathered {
    pub reasoning: String,
    pub text: String,
    pub calls: Vec<ParsedCall>,
}

impl Gathered {
    pub fn add(&mut self, pieces: Vec<Piece>) {
        for piece in pieces {
            match piece {
                Piece::Reasoning(text) => self.reasoning.push_str(&text),
                Piece::Text(text) => self.text.push_str(&text),
                Piece::CallStart(name) => self.calls.push(ParsedCall {
                    name,
                    arguments: String::new(),
                }),
                Piece::Arguments(part) => {
                    if let Some(call) = self.calls.last_mut() {
                        call.arguments.push_str(&part);
                    }
                }
                Piece::CallEnd => {}
            }
        }
    }
}

/// A reply read as it streams in: its thought split off when the model thinks, its
/// answer through a [`ToolCallParser`] when the request's tools may be called, as plain
/// text otherwise. Every protocol's reply reads it so.
#[derive(Debug)]
pub struct ReplyReader {
    thought: Option<ThoughtSplitter>,
    calls: Option<ToolCallParser>,
}

impl ReplyReader {
    pub fn new(tools: Option<&ToolSet>, thinking: Thinking) -> Self {
        Self {
            thought: ThoughtSplitter::new(thinking),
            calls: tools.filter(|t| t.parses_calls()).map(ToolCallParser::new),
        }
    }

    /// The pieces `text` completes (nothing for no text).
    pub fn push(&mut self, text: String) -> Vec<Piece> {
        let (mut pieces, answer) = match self.thought.as_mut() {
            Some(splitter) => splitter.push(&text),
            None => (Vec::new(), text),
        };
        pieces.extend(self.answer(answer));
        pieces
    }

    fn answer(&mut self, text: String) -> Vec<Piece> {
        match self.calls.as_mut() {
            Some(parser) => parser.push(&text),
            None if text.is_empty() => Vec::new(),
            None => vec![Piece::Text(text)],
        }
    }

    /// What was held back, once the reply has ended.
    pub fn finish(&mut self) -> Vec<Piece> {
        let (mut pieces, answer) = self
            .thought
            .as_mut()
            .map(ThoughtSplitter::finish)
            .unwrap_or_default();
        pieces.extend(self.answer(answer));
        pieces.extend(
            self.calls
                .as_mut()
                .map(ToolCallParser::finish)
                .unwrap_or_default(),
        );
        pieces
    }

    /// Calls begun so far.
    pub fn n_calls(&self) -> usize {
        self.calls.as_ref().map_or(0, ToolCallParser::n_calls)
    }
}

/// How a call is written.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Form {
    /// Inside `<tool_call>` … `</tool_call>`.
    Tagged,
    /// A bare JSON object, perhaps inside a code fence.
    Bare { fenced: bool },
}

#[derive(Debug)]
enum State {
    /// Answer text. `line_start`: a bare call may begin here (at the start of the reply
    /// or of a line).
    Text { line_start: bool },
    /// A call's head is being read; the JSON starts `skip` bytes into the held text (after
    /// whitespace and a fence line).
    Head { form: Form, skip: usize },
    /// The open call's arguments are streaming.
    Arguments { form: Form, json: CompactJson },
    /// The arguments are done: what is left of the call's text is read and dropped.
    Tail(Form),
    /// The closing fence of a fenced bare call.
    Fence,
    /// A tagged block that cannot stream (its arguments are a JSON string, its keys in
    /// another order, or it is not a call): held whole to its closing tag.
    Whole,
}

/// Splits a streamed reply into text and calls. Text that might be the start of a
/// `<tool_call>` tag is held back until it is known not to be. Once a block's head names
/// a known function, the call is open and its arguments stream; a block that cannot be a
/// call of a known function comes back as text. A tag cut off by the end of the reply is
/// dropped, never left in the answer.
///
/// Small models often write calls without the tags: a JSON object
/// `{"name": ..., "arguments": ...}` opening a line, bare or in a Markdown code fence,
/// one per line. Those are read as calls too (the lazy grammar of
/// [`super::ToolSet`] holds them to the same form); JSON that is not a call of a known
/// function, and JSON inside a line, is text.
#[derive(Debug)]
pub struct ToolCallParser {
    names: Vec<String>,
    /// At most one call is returned (`parallel_tool_calls: false`); later blocks are text.
    single: bool,
    pending: String,
    state: State,
    /// A tagged call just ended: the newline between calls belongs to neither.
    after_call: bool,
    /// A bare call just ended: the whitespace after it belongs to nothing.
    after_bare: bool,
    calls: usize,
}

impl ToolCallParser {
    pub fn new(tools: &ToolSet) -> Self {
        Self {
            names: tools.names.clone(),
            single: !tools.parallel,
            pending: String::new(),
            state: State::Text { line_start: true },
            after_call: false,
            after_bare: false,
            calls: 0,
        }
    }

    /// How many calls were begun.
    pub fn n_calls(&self) -> usize {
        self.calls
    }

    fn may_call(&self) -> bool {
        !self.single || self.calls == 0
    }

    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.pending.push_str(text);
        let mut out = Vec::new();
        while self.step(&mut out) {}
        out
    }

    /// One move of the state machine; false when it needs more text.
    fn step(&mut self, out: &mut Vec<Piece>) -> bool {
        match &mut self.state {
            State::Text { line_start: true } => {
                if self.after_bare {
                    let blank = self.pending.len() - self.pending.trim_start().len();
                    self.pending.drain(..blank);
                }
                let head = self.pending.trim_start();
                let skip = self.pending.len() - head.len();
                if head.is_empty() || (head.len() < 3 && "```".starts_with(head)) {
                    return false;
                }
                let fence = head.strip_prefix("```").map(|t| t.find('\n'));
                self.state = match fence {
                    _ if !self.may_call() => State::Text { line_start: false },
                    // The fence's language tag runs to the first newline.
                    Some(None) => return false,
                    Some(Some(line)) => State::Head {
                        form: Form::Bare { fenced: true },
                        skip: skip + 3 + line + 1,
                    },
                    None if head.starts_with('{') => State::Head {
                        form: Form::Bare { fenced: false },
                        skip,
                    },
                    None => State::Text { line_start: false },
                };
                if matches!(self.state, State::Text { .. }) {
                    self.after_bare = false;
                }
                true
            }
            State::Text { line_start: false } => self.text(out),
            State::Head { form, skip } => {
                let (form, skip) = (*form, *skip);
                match read_head(&self.pending[skip..], &self.names) {
                    Head::Incomplete => false,
                    Head::Object { name, len } => {
                        self.pending.drain(..skip + len);
                        self.calls += 1;
                        out.push(Piece::CallStart(name));
                        self.state = State::Arguments {
                            form,
                            json: CompactJson::default(),
                        };
                        true
                    }
                    _ if form == Form::Tagged => {
                        self.state = State::Whole;
                        true
                    }
                    _ => {
                        self.state = State::Text { line_start: false };
                        true
                    }
                }
            }
            State::Arguments { form, json } => {
                let (part, used) = json.read(&self.pending);
                let (form, done) = (*form, json.is_done());
                self.pending.drain(..used);
                if !part.is_empty() {
                    out.push(Piece::Arguments(part));
                }
                if done {
                    out.push(Piece::CallEnd);
                    self.state = State::Tail(form);
                }
                done
            }
            State::Tail(Form::Tagged) => {
                let Some(end) = self.pending.find(CLOSE) else {
                    // Only the tail that could start the closing tag is kept.
                    let keep = floor_char_boundary(
                        &self.pending,
                        self.pending.len().saturating_sub(CLOSE.len() - 1),
                    );
                    self.pending.drain(..keep);
                    return false;
                };
                self.pending.drain(..end + CLOSE.len());
                self.after_call = true;
                self.state = State::Text { line_start: false };
                true
            }
            State::Tail(Form::Bare { fenced }) => {
                let fenced = *fenced;
                let rest = self.pending.trim_start();
                if rest.is_empty() {
                    return false;
                }
                if rest.starts_with('}') {
                    let used = self.pending.len() - rest.len() + 1;
                    self.pending.drain(..used);
                    self.after_bare = true;
                    self.state = if fenced {
                        State::Fence
                    } else {
                        State::Text { line_start: true }
                    };
                } else {
                    self.state = State::Text { line_start: false };
                }
                true
            }
            State::Fence => {
                let rest = self.pending.trim_start();
                if rest.len() < 3 && "```".starts_with(rest) {
                    return false;
                }
                if rest.starts_with("```") {
                    let used = self.pending.len() - rest.len() + 3;
                    self.pending.drain(..used);
                    self.state = State::Text { line_start: true };
                } else {
                    self.state = State::Text { line_start: false };
                }
                true
            }
            State::Whole => {
                let Some(end) = self.pending.find(CLOSE) else {
                    return false;
                };
                let body: String = self.pending.drain(..end + CLOSE.len()).collect();
                match self.whole_call(&body[..end]) {
                    Some(call) => {
                        self.after_call = true;
                        out.extend(call);
                    }
                    None => out.push(Piece::Text(format!("{OPEN}{body}"))),
                }
                self.state = State::Text { line_start: false };
                true
            }
        }
    }

    /// Answer text up to the next `<tool_call>`, holding back what could start one.
    fn text(&mut self, out: &mut Vec<Piece>) -> bool {
        if self.after_call && !self.pending.is_empty() {
            self.after_call = false;
            if self.pending.starts_with('\n') {
                self.pending.remove(0);
            }
        }
        let may_call = self.may_call();
        let tag = self.pending.find(OPEN).filter(|_| may_call);
        let line = self.pending.find('\n').filter(|_| may_call);
        if let Some(end) = line.filter(|&l| tag.is_none_or(|t| l < t)) {
            // A new line may open with a bare call.
            out.push(Piece::Text(self.pending.drain(..=end).collect()));
            self.state = State::Text { line_start: true };
            return true;
        }
        if let Some(start) = tag {
            if start > 0 {
                out.push(Piece::Text(self.pending.drain(..start).collect()));
            }
            self.pending.drain(..OPEN.len());
            self.state = State::Head {
                form: Form::Tagged,
                skip: 0,
            };
            return true;
        }
        let hold = (1..OPEN.len().min(self.pending.len() + 1))
            .rev()
            .find(|&l| self.pending.ends_with(&OPEN[..l]))
            .filter(|_| may_call)
            .unwrap_or(0);
        let release = self.pending.len() - hold;
        if release > 0 {
            out.push(Piece::Text(self.pending.drain(..release).collect()));
        }
        false
    }

    /// Whatever is held back, once the reply has ended: an open call ends where it was
    /// cut off, a tag cut off before its call's arguments is dropped, and other held text
    /// is answer text.
    pub fn finish(&mut self) -> Vec<Piece> {
        let rest = std::mem::take(&mut self.pending);
        let state = std::mem::replace(&mut self.state, State::Text { line_start: false });
        let text = |text: String| {
            if text.is_empty() {
                Vec::new()
            } else {
                vec![Piece::Text(text)]
            }
        };
        match state {
            State::Text { line_start: true } if self.after_bare && rest.trim().is_empty() => {
                Vec::new()
            }
            State::Text { .. }
            | State::Head {
                form: Form::Bare { .. },
                ..
            } => text(rest),
            State::Arguments { .. } => vec![Piece::CallEnd],
            State::Head { .. } | State::Tail(_) | State::Fence => Vec::new(),
            State::Whole => self.whole_call(&rest).unwrap_or_else(|| text(rest)),
        }
    }

    /// A block read whole, as a call's pieces, if it is a call of a known function.
    fn whole_call(&mut self, body: &str) -> Option<Vec<Piece>> {
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
        self.calls += 1;
        Some(vec![
            Piece::CallStart(name.to_string()),
            Piece::Arguments(arguments),
            Piece::CallEnd,
        ])
    }
}

/// The largest char boundary of `text` at or below `at`.
fn floor_char_boundary(text: &str, at: usize) -> usize {
    (0..=at)
        .rev()
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(0)
}
