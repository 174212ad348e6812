//! Thinking models' thoughts kept apart from their answers.
//!
//! A template that thinks (Qwen3's, DeepSeek-R1's: it mentions `<think>`) has the model
//! write `<think>…</think>` before its answer, or opens the thought in the prompt itself
//! (the reply then starts inside it). [`ThoughtSplitter`] reads a reply as it streams
//! in and sends the thought one way ([`Piece::Reasoning`]: `reasoning_content`,
//! `thinking` blocks, `reasoning` items) and the answer the other (to the tool-call
//! parser). [`with_thought`] puts a free thought before a grammar, so a JSON schema or a
//! forced call constrains only the answer. `--reasoning-format none` turns both off and
//! keeps the raw text.

use pyramid_grammar::{json_layout, Grammar};
use serde_json::Value;

use crate::tools::{lark_string, Piece};

pub const THINK_OPEN: &str = "<think>";
pub const THINK_CLOSE: &str = "</think>";

/// Whether a server splits thoughts from answers (`--reasoning-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReasoningFormat {
    /// The thought apart, in each protocol's field for it.
    #[default]
    Split,
    /// The raw text, tags and all, as the answer.
    None,
}

/// Where a reply stands with respect to a thought when it begins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Thinking {
    /// The template does not think (or thoughts are not split): all answer.
    #[default]
    Off,
    /// The reply may open with `<think>`.
    MayOpen,
    /// The prompt opened the thought: the reply starts inside it.
    Open,
}

impl Thinking {
    /// For a prompt rendered by a template that thinks (or not) into `prompt`.
    pub fn of(template_thinks: bool, prompt: &str) -> Thinking {
        if !template_thinks {
            Thinking::Off
        } else if prompt.trim_end().ends_with(THINK_OPEN) {
            Thinking::Open
        } else {
            Thinking::MayOpen
        }
    }
}

/// Whether a chat template has its model think.
pub fn template_thinks(source: &str) -> bool {
    source.contains(THINK_OPEN)
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum State {
    /// Nothing but whitespace yet: a thought may open.
    Start,
    /// Inside the thought; `started`: some of its text was sent.
    Thought {
        started: bool,
    },
    /// The thought closed: whitespace before the answer is neither's.
    AfterThought,
    Answer,
}

/// Splits a streamed reply into thought and answer, the same way however it is cut.
#[derive(Debug)]
pub struct ThoughtSplitter {
    state: State,
    pending: String,
}

impl ThoughtSplitter {
    pub fn new(thinking: Thinking) -> Option<Self> {
        let state = match thinking {
            Thinking::Off => return None,
            Thinking::MayOpen => State::Start,
            Thinking::Open => State::Thought { started: false },
        };
        Some(Self {
            state,
            pending: String::new(),
        })
    }

    /// The thought's pieces `text` completes, and the answer's text.
    pub fn push(&mut self, text: &str) -> (Vec<Piece>, String) {
        self.pending.push_str(text);
        let mut thought = Vec::new();
        let mut answer = String::new();
        loop {
            match self.state {
                State::Start => {
                    let head = self.pending.trim_start();
                    if head.len() < THINK_OPEN.len() && THINK_OPEN.starts_with(head) {
                        break;
                    }
                    if let Some(rest) = head.strip_prefix(THINK_OPEN) {
                        self.pending = rest.to_string();
                        self.state = State::Thought { started: false };
                    } else {
                        self.state = State::Answer;
                    }
                }
                State::Thought { started } => {
                    if !started {
                        let blank = self.pending.len() - self.pending.trim_start().len();
                        self.pending.drain(..blank);
                    }
                    if let Some(end) = self.pending.find(THINK_CLOSE) {
                        let text = self.pending[..end].trim_end().to_string();
                        self.pending.drain(..end + THINK_CLOSE.len());
                        if !text.is_empty() {
                            thought.push(Piece::Reasoning(text));
                        }
                        self.state = State::AfterThought;
                        continue;
                    }
                    // Hold back trailing whitespace and what could start the closing tag.
                    let tag = (1..THINK_CLOSE.len().min(self.pending.len() + 1))
                        .rev()
                        .find(|&l| self.pending.ends_with(&THINK_CLOSE[..l]))
                        .unwrap_or(0);
                    let release = self.pending[..self.pending.len() - tag].trim_end().len();
                    if release > 0 {
                        thought.push(Piece::Reasoning(self.pending.drain(..release).collect()));
                        self.state = State::Thought { started: true };
                    }
                    break;
                }
                State::AfterThought => {
                    let blank = self.pending.len() - self.pending.trim_start().len();
                    self.pending.drain(..blank);
                    if self.pending.is_empty() {
                        break;
                    }
                    self.state = State::Answer;
                }
                State::Answer => {
                    answer.push_str(&self.pending);
                    self.pending.clear();
                    break;
                }
            }
        }
        (thought, answer)
    }

    /// What was held back once the reply has ended: a thought cut off is still thought.
    pub fn finish(&mut self) -> (Vec<Piece>, String) {
        let rest = std::mem::take(&mut self.pending);
        match self.state {
            State::Thought { .. } if !rest.trim().is_empty() => (
                vec![Piece::Reasoning(rest.trim_end().to_string())],
                String::new(),
            ),
            State::Start | State::Answer => (Vec::new(), rest),
            _ => (Vec::new(), String::new()),
        }
    }
}

/// `grammar` after a free thought: the thought's text is not constrained, the answer
/// after `</think>` is. The grammars of [`crate::tools`] name their body `reply`.
pub fn with_thought(grammar: Grammar, thinking: Thinking) -> Grammar {
    let thought = match thinking {
        Thinking::Off => return grammar,
        Thinking::MayOpen => format!("({} thought ANSWER_GAP)?", lark_string(THINK_OPEN)),
        Thinking::Open => "thought ANSWER_GAP".to_string(),
    };
    let body = match grammar {
        Grammar::JsonSchema(mut schema) => {
            if let Value::Object(fields) = &mut schema {
                fields.insert("x-guidance".to_string(), json_layout());
            }
            format!("start: reply\nreply: %json {schema}\n")
        }
        Grammar::Lark(lark) => lark,
    };
    let rest = body.strip_prefix("start: reply\n").unwrap_or(&body);
    Grammar::Lark(format!(
        "start: {thought} reply\nTHOUGHT: /(.|\\n)*/\nthought[lazy]: THOUGHT {close}\nANSWER_GAP: /[ \\t\\r\\n]*/\n{rest}",
        close = lark_string(THINK_CLOSE),
    ))
}

#[cfg(test)]
mod tests;
