//! Engine events as Anthropic's Messages replies: one message, or its event stream
//! (`message_start`, `content_block_start`/`_delta`/`_stop` per block, `message_delta`
//! with the stop reason and usage, `message_stop`, `ping` at the start).

use axum::body::Bytes;
use axum::response::{IntoResponse, Response};
use axum::Json;
use pyramid_engine::{FinishReason, Usage};
use serde_json::{json, Value};
use tokio::sync::mpsc::Receiver;

use super::error_body;
use crate::api::random_seed;
use crate::error::ApiError;
use crate::reasoning::Thinking;
use crate::sse::{event_stream, EventWriter};
use crate::tools::{Piece, ReplyReader, ToolSet};
use crate::worker::Event;

/// The fixed parts of one reply.
pub struct MessageReply {
    pub id: String,
    pub model: String,
    /// Tokens of the rendered prompt.
    pub n_prompt: usize,
    reader: ReplyReader,
}

impl MessageReply {
    /// A reply to a request with `tools` (read for calls when they may be made), whose
    /// model may think.
    pub fn new(
        model: String,
        n_prompt: usize,
        tools: Option<&ToolSet>,
        thinking: Thinking,
    ) -> Self {
        Self {
            id: format!("msg_{:016x}{:08x}", random_seed(), random_seed() as u32),
            model,
            n_prompt,
            reader: ReplyReader::new(tools, thinking),
        }
    }
}

/// A `tool_use` block calling `name`, its `input` empty until its arguments are in.
fn tool_use(name: &str) -> Value {
    json!({
        "type": "tool_use",
        "id": format!("toolu_{:016x}", random_seed()),
        "name": name,
        "input": {},
    })
}

/// Anthropic's stop reason: `tool_use` after calls, `stop_sequence` at a stop string,
/// `end_turn` at the model's end, `max_tokens` at the limit.
fn stop_reason(reason: FinishReason, n_calls: usize, stop_sequence: Option<&str>) -> &'static str {
    match reason {
        FinishReason::Stop if n_calls > 0 => "tool_use",
        FinishReason::Stop if stop_sequence.is_some() => "stop_sequence",
        FinishReason::Stop => "end_turn",
        FinishReason::Length => "max_tokens",
        FinishReason::Aborted => "end_turn",
    }
}

/// Anthropic's usage: `input_tokens` are the prompt's tokens not read from the cache,
/// `cache_read_input_tokens` those that were (pyramid's prefix cache is automatic, so
/// nothing is "created" on request).
fn usage_json(u: &Usage) -> Value {
    json!({
        "input_tokens": u.prompt_tokens - u.cached_tokens,
        "output_tokens": u.completion_tokens,
        "cache_read_input_tokens": u.cached_tokens,
        "cache_creation_input_tokens": 0,
    })
}

/// The whole message, once the reply is done.
pub async fn collect(
    mut reply: MessageReply,
    mut rx: Receiver<Event>,
) -> Result<Response, ApiError> {
    let mut content: Vec<Value> = Vec::new();
    // The open call's arguments so far.
    let mut arguments = String::new();
    let mut add = |pieces: Vec<Piece>, content: &mut Vec<Value>| {
        for piece in pieces {
            match piece {
                Piece::Reasoning(text) => match content.last_mut() {
                    Some(Value::Object(block)) if block["type"] == "thinking" => {
                        let joined = format!("{}{text}", block["thinking"].as_str().unwrap_or(""));
                        block.insert("thinking".into(), json!(joined));
                    }
                    _ => {
                        content.push(json!({"type": "thinking", "thinking": text, "signature": ""}))
                    }
                },
                Piece::Text(text) => match content.last_mut() {
                    Some(Value::Object(block)) if block["type"] == "text" => {
                        let joined = format!("{}{text}", block["text"].as_str().unwrap_or(""));
                        block.insert("text".into(), json!(joined));
                    }
                    _ if text.is_empty() => {}
                    _ => content.push(json!({"type": "text", "text": text})),
                },
                Piece::CallStart(name) => content.push(tool_use(&name)),
                Piece::Arguments(part) => arguments.push_str(&part),
                Piece::CallEnd => {
                    // Arguments cut off mid-object are no input.
                    let input = serde_json::from_str::<Value>(&std::mem::take(&mut arguments))
                        .unwrap_or_else(|_| json!({}));
                    if let Some(block) = content.last_mut() {
                        block["input"] = input;
                    }
                }
            }
        }
    };
    loop {
        match rx.recv().await {
            Some(Event::Delta { text, .. }) => {
                let pieces = reply.reader.push(text);
                add(pieces, &mut content);
            }
            Some(Event::Done {
                finish_reason,
                usage,
                stop_sequence,
                ..
            }) => {
                let pieces = reply.reader.finish();
                add(pieces, &mut content);
                let stop = stop_reason(
                    finish_reason,
                    reply.reader.n_calls(),
                    stop_sequence.as_deref(),
                );
                return Ok(Json(json!({
                    "id": reply.id,
                    "type": "message",
                    "role": "assistant",
                    "model": reply.model,
                    "content": content,
                    "stop_reason": stop,
                    "stop_sequence": stop_sequence,
                    "usage": usage_json(&usage),
                }))
                .into_response());
            }
            Some(Event::Failed(err)) => return Err(err),
            None => {
                return Err(ApiError::internal(format!(
                    "the engine stopped before finishing this request ({} prompt tokens)",
                    reply.n_prompt
                )))
            }
        }
    }
}

fn event(kind: &str, data: &Value) -> Bytes {
    Bytes::from(format!("event: {kind}\ndata: {data}\n\n"))
}

/// The kinds of content block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Block {
    Text,
    Thinking,
    ToolUse,
}

/// A streamed reply's events: which block is open, and what is ready to send.
struct EventsWriter {
    reply: MessageReply,
    pending: Vec<Bytes>,
    /// The open block's index and kind.
    open: Option<(usize, Block)>,
    next_index: usize,
}

impl EventsWriter {
    fn close_block(&mut self) {
        if let Some((index, _)) = self.open.take() {
            self.pending.push(event(
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": index}),
            ));
        }
    }

    fn start_block(&mut self, block: Value, kind: Block) -> usize {
        self.close_block();
        let index = self.next_index;
        self.next_index += 1;
        self.pending.push(event(
            "content_block_start",
            &json!({"type": "content_block_start", "index": index, "content_block": block}),
        ));
        self.open = Some((index, kind));
        index
    }

    /// A delta to the open block of `kind`, which is started first if need be.
    fn delta(&mut self, kind: Block, delta: Value) {
        let index = match self.open {
            Some((index, open)) if open == kind => index,
            _ => {
                let block = match kind {
                    Block::Text => json!({"type": "text", "text": ""}),
                    Block::Thinking => json!({"type": "thinking", "thinking": "", "signature": ""}),
                    Block::ToolUse => return,
                };
                self.start_block(block, kind)
            }
        };
        self.pending.push(event(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": index, "delta": delta}),
        ));
    }

    fn send(&mut self, pieces: Vec<Piece>) {
        for piece in pieces {
            match piece {
                Piece::Text(text) if text.is_empty() => {}
                Piece::Text(text) => {
                    self.delta(Block::Text, json!({"type": "text_delta", "text": text}));
                }
                Piece::Reasoning(text) => self.delta(
                    Block::Thinking,
                    json!({"type": "thinking_delta", "thinking": text}),
                ),
                Piece::CallStart(name) => {
                    self.start_block(tool_use(&name), Block::ToolUse);
                }
                Piece::Arguments(part) => self.delta(
                    Block::ToolUse,
                    json!({"type": "input_json_delta", "partial_json": part}),
                ),
                Piece::CallEnd => self.close_block(),
            }
        }
    }
}

impl EventWriter for EventsWriter {
    type Input = Event;

    fn pending(&mut self) -> &mut Vec<Bytes> {
        &mut self.pending
    }

    fn write(&mut self, event_in: Option<Event>) -> bool {
        match event_in {
            Some(Event::Delta { text, .. }) => {
                let pieces = self.reply.reader.push(text);
                self.send(pieces);
                return false;
            }
            Some(Event::Done {
                finish_reason,
                usage,
                stop_sequence,
                ..
            }) => {
                let pieces = self.reply.reader.finish();
                self.send(pieces);
                self.close_block();
                let stop = stop_reason(
                    finish_reason,
                    self.reply.reader.n_calls(),
                    stop_sequence.as_deref(),
                );
                self.pending.push(event(
                    "message_delta",
                    &json!({"type": "message_delta",
                            "delta": {"stop_reason": stop, "stop_sequence": stop_sequence},
                            "usage": usage_json(&usage)}),
                ));
                self.pending
                    .push(event("message_stop", &json!({"type": "message_stop"})));
            }
            Some(Event::Failed(err)) => self.pending.push(event("error", &error_body(&err))),
            None => {
                let err = ApiError::internal("the engine stopped before finishing this request");
                self.pending.push(event("error", &error_body(&err)));
            }
        }
        true
    }
}

/// Server-sent events in Anthropic's sequence.
pub fn stream(reply: MessageReply, rx: Receiver<Event>) -> Response {
    let start = json!({
        "type": "message_start",
        "message": {
            "id": reply.id, "type": "message", "role": "assistant", "model": reply.model,
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": reply.n_prompt, "output_tokens": 0},
        },
    });
    let writer = EventsWriter {
        pending: vec![
            event("message_start", &start),
            event("ping", &json!({"type": "ping"})),
        ],
        reply,
        open: None,
        next_index: 0,
    };
    event_stream(writer, rx)
}
