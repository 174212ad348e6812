//! Engine events as a Responses reply: the response object, or its event stream
//! (`response.created`, `response.in_progress`, per output item `output_item.added`, its
//! deltas and `output_item.done`, then `response.completed`, `response.incomplete` or
//! `response.failed`), numbered by `sequence_number`. Both are built by one
//! [`OutputBuilder`] from the reply's pieces, so the stored and returned output is the
//! streamed one. A finished response kept by `store` goes to the [`ResponseStore`] with
//! its conversation before the last event is sent.

use std::sync::Arc;

use axum::body::Bytes;
use axum::response::{IntoResponse, Response};
use axum::Json;
use pyramid_engine::{FinishReason, Usage};
use pyramid_tokenizer::Tokenizer;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc::Receiver;

use super::store::{ResponseStore, Stored};
use crate::api::random_seed;
use crate::error::ApiError;
use crate::reasoning::Thinking;
use crate::sse::{event_stream, EventWriter};
use crate::tools::{Piece, ReplyReader, ToolSet};
use crate::worker::Event;

/// The fixed parts of one response.
pub struct ResponseReply {
    pub id: String,
    pub created_at: u64,
    pub model: String,
    /// The request's settings the response repeats.
    pub echo: Map<String, Value>,
    /// The conversation through the request's input.
    pub conversation: Vec<Value>,
    /// Where the finished response is kept (`store`), if anywhere.
    pub store: Option<Arc<ResponseStore>>,
    pub n_prompt: usize,
    /// Counts the thought's tokens for `reasoning_tokens`.
    pub tokenizer: Arc<Tokenizer>,
}

impl ResponseReply {
    /// The response object with `status`, `output` and the rest.
    fn object(&self, status: &str, output: &[Value], usage: Option<Value>) -> Value {
        let mut object = json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "model": self.model,
            "output": output,
            "usage": usage,
            "error": null,
            "incomplete_details": null,
            "background": false,
        });
        for (k, v) in &self.echo {
            object[k] = v.clone();
        }
        object
    }
}

/// Usage in the Responses names; cached tokens are the prefix cache's and session store's,
/// and the thought's tokens are counted by tokenising it again.
fn usage_json(u: &Usage, reasoning_tokens: usize) -> Value {
    json!({
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": {"cached_tokens": u.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": u.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens.min(u.completion_tokens)},
        "total_tokens": u.prompt_tokens + u.completion_tokens,
    })
}

fn hex_id(prefix: &str) -> String {
    format!("{prefix}_{:016x}{:016x}", random_seed(), random_seed())
}

/// The item being written.
enum Open {
    Reasoning {
        id: String,
        text: String,
    },
    Message {
        id: String,
        text: String,
    },
    Call {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
    },
}

/// Output items from a reply's pieces, and the events that announce them.
struct OutputBuilder {
    reader: ReplyReader,
    open: Option<Open>,
    /// Whitespace that would open a message: held until text follows.
    held: String,
    output: Vec<Value>,
    /// Events not yet sent, without their sequence numbers.
    events: Vec<Value>,
}

impl OutputBuilder {
    fn new(tools: Option<&ToolSet>, thinking: Thinking) -> Self {
        Self {
            reader: ReplyReader::new(tools, thinking),
            open: None,
            held: String::new(),
            output: Vec::new(),
            events: Vec::new(),
        }
    }

    fn index(&self) -> usize {
        self.output.len()
    }

    fn add(&mut self, pieces: Vec<Piece>) {
        for piece in pieces {
            match piece {
                Piece::Reasoning(text) => self.reasoning(text),
                Piece::Text(text) => self.text(text),
                Piece::CallStart(name) => {
                    self.close();
                    self.held.clear();
                    let (id, call_id) = (hex_id("fc"), hex_id("call"));
                    self.events.push(json!({
                        "type": "response.output_item.added", "output_index": self.index(),
                        "item": {"id": id, "type": "function_call", "status": "in_progress",
                                 "call_id": call_id, "name": name, "arguments": ""},
                    }));
                    self.open = Some(Open::Call {
                        id,
                        call_id,
                        name,
                        arguments: String::new(),
                    });
                }
                Piece::Arguments(part) => {
                    let index = self.index();
                    if let Some(Open::Call { id, arguments, .. }) = &mut self.open {
                        arguments.push_str(&part);
                        self.events.push(json!({
                            "type": "response.function_call_arguments.delta",
                            "item_id": id, "output_index": index, "delta": part,
                        }));
                    }
                }
                Piece::CallEnd => self.close(),
            }
        }
    }

    /// Thought text: into the open reasoning item, or a new one.
    fn reasoning(&mut self, text: String) {
        if !matches!(self.open, Some(Open::Reasoning { .. })) {
            self.close();
            let id = hex_id("rs");
            let index = self.index();
            self.events.push(json!({
                "type": "response.output_item.added", "output_index": index,
                "item": {"id": id, "type": "reasoning", "status": "in_progress", "summary": [], "content": []},
            }));
            self.events.push(json!({
                "type": "response.content_part.added", "item_id": id, "output_index": index,
                "content_index": 0, "part": {"type": "reasoning_text", "text": ""},
            }));
            self.open = Some(Open::Reasoning {
                id,
                text: String::new(),
            });
        }
        let index = self.index();
        if let Some(Open::Reasoning { id, text: all }) = &mut self.open {
            all.push_str(&text);
            self.events.push(json!({
                "type": "response.reasoning_text.delta", "item_id": id, "output_index": index,
                "content_index": 0, "delta": text,
            }));
        }
    }

    fn text(&mut self, text: String) {
        if matches!(self.open, Some(Open::Reasoning { .. })) {
            self.close();
        }
        let index = self.index();
        if let Some(Open::Message { id, text: all }) = &mut self.open {
            all.push_str(&text);
            self.events.push(json!({
                "type": "response.output_text.delta", "item_id": id, "output_index": index,
                "content_index": 0, "delta": text, "logprobs": [],
            }));
            return;
        }
        self.held.push_str(&text);
        if self.held.trim().is_empty() {
            return;
        }
        let text = std::mem::take(&mut self.held);
        let id = hex_id("msg");
        self.events.push(json!({
            "type": "response.output_item.added", "output_index": index,
            "item": {"id": id, "type": "message", "status": "in_progress", "role": "assistant", "content": []},
        }));
        self.events.push(json!({
            "type": "response.content_part.added", "item_id": id, "output_index": index,
            "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []},
        }));
        self.open = Some(Open::Message {
            id,
            text: String::new(),
        });
        self.text(text);
    }

    /// Ends the open item: its closing events, and the item in the output.
    fn close(&mut self) {
        let index = self.index();
        let item = match self.open.take() {
            None => return,
            Some(Open::Reasoning { id, text }) => {
                let part = json!({"type": "reasoning_text", "text": text});
                self.events.push(json!({
                    "type": "response.reasoning_text.done", "item_id": id, "output_index": index,
                    "content_index": 0, "text": text,
                }));
                self.events.push(json!({
                    "type": "response.content_part.done", "item_id": id, "output_index": index,
                    "content_index": 0, "part": part,
                }));
                json!({"id": id, "type": "reasoning", "status": "completed", "summary": [], "content": [part]})
            }
            Some(Open::Message { id, text }) => {
                let part =
                    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []});
                self.events.push(json!({
                    "type": "response.output_text.done", "item_id": id, "output_index": index,
                    "content_index": 0, "text": text, "logprobs": [],
                }));
                self.events.push(json!({
                    "type": "response.content_part.done", "item_id": id, "output_index": index,
                    "content_index": 0, "part": part,
                }));
                json!({"id": id, "type": "message", "status": "completed", "role": "assistant", "content": [part]})
            }
            Some(Open::Call {
                id,
                call_id,
                name,
                arguments,
            }) => {
                self.events.push(json!({
                    "type": "response.function_call_arguments.done", "item_id": id,
                    "output_index": index, "arguments": arguments,
                }));
                json!({"id": id, "type": "function_call", "status": "completed",
                       "call_id": call_id, "name": name, "arguments": arguments})
            }
        };
        self.events.push(
            json!({"type": "response.output_item.done", "output_index": index, "item": item}),
        );
        self.output.push(item);
    }

    /// The reply has ended: what was held back, and the last item closed.
    fn finish(&mut self) {
        let rest = self.reader.finish();
        self.add(rest);
        self.close();
    }
}

/// The finished response: `completed`, or `incomplete` when `max_output_tokens` cut it;
/// kept in the store when asked.
fn finished(reply: &ResponseReply, output: &[Value], finish: FinishReason, usage: &Usage) -> Value {
    let thought: String = output
        .iter()
        .filter(|item| item["type"] == "reasoning")
        .filter_map(|item| item["content"][0]["text"].as_str())
        .collect();
    let reasoning_tokens = reply
        .tokenizer
        .encode(&thought, false)
        .map_or(0, |ids| ids.len());
    let usage = usage_json(usage, reasoning_tokens);
    let mut response = if finish == FinishReason::Length {
        let mut r = reply.object("incomplete", output, Some(usage));
        r["incomplete_details"] = json!({"reason": "max_output_tokens"});
        r
    } else {
        reply.object("completed", output, Some(usage))
    };
    response["completed_at"] = json!(crate::routes::unix_now());
    if let Some(store) = &reply.store {
        let mut conversation = reply.conversation.clone();
        conversation.extend(output.iter().cloned());
        if let Err(e) = store.put(Stored {
            response: response.clone(),
            conversation,
        }) {
            tracing::warn!("response {} is kept in memory only: {e}", reply.id);
        }
    }
    response
}

/// The whole response, once the reply is done.
pub async fn collect(
    reply: ResponseReply,
    tools: Option<&ToolSet>,
    thinking: Thinking,
    mut rx: Receiver<Event>,
) -> Result<Response, ApiError> {
    let mut builder = OutputBuilder::new(tools, thinking);
    loop {
        match rx.recv().await {
            Some(Event::Delta { text, .. }) => {
                let pieces = builder.reader.push(text);
                builder.add(pieces);
            }
            Some(Event::Done {
                finish_reason,
                usage,
                ..
            }) => {
                builder.finish();
                let response = finished(&reply, &builder.output, finish_reason, &usage);
                return Ok(Json(response).into_response());
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

/// A streamed response's events.
struct EventsWriter {
    reply: ResponseReply,
    builder: OutputBuilder,
    sequence: u64,
    pending: Vec<Bytes>,
}

impl EventsWriter {
    fn push(&mut self, mut event: Value) {
        event["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        let kind = event["type"].as_str().unwrap_or("error").to_string();
        self.pending
            .push(Bytes::from(format!("event: {kind}\ndata: {event}\n\n")));
    }

    fn flush(&mut self) {
        for event in std::mem::take(&mut self.builder.events) {
            self.push(event);
        }
    }
}

impl EventWriter for EventsWriter {
    type Input = Event;

    fn pending(&mut self) -> &mut Vec<Bytes> {
        &mut self.pending
    }

    fn write(&mut self, event: Option<Event>) -> bool {
        match event {
            Some(Event::Delta { text, .. }) => {
                let pieces = self.builder.reader.push(text);
                self.builder.add(pieces);
                self.flush();
                return false;
            }
            Some(Event::Done {
                finish_reason,
                usage,
                ..
            }) => {
                self.builder.finish();
                self.flush();
                let response = finished(&self.reply, &self.builder.output, finish_reason, &usage);
                let kind = if finish_reason == FinishReason::Length {
                    "response.incomplete"
                } else {
                    "response.completed"
                };
                self.push(json!({"type": kind, "response": response}));
            }
            Some(Event::Failed(err)) => self.fail(&err),
            None => self.fail(&ApiError::internal(
                "the engine stopped before finishing this request",
            )),
        }
        true
    }
}

impl EventsWriter {
    fn fail(&mut self, err: &ApiError) {
        self.builder.close();
        self.flush();
        let mut response = self.reply.object("failed", &self.builder.output, None);
        response["error"] = json!({"code": "server_error", "message": err.message});
        self.push(json!({"type": "response.failed", "response": response}));
    }
}

/// Server-sent events in the Responses sequence.
pub fn stream(
    reply: ResponseReply,
    tools: Option<&ToolSet>,
    thinking: Thinking,
    rx: Receiver<Event>,
) -> Response {
    let mut writer = EventsWriter {
        builder: OutputBuilder::new(tools, thinking),
        sequence: 0,
        pending: Vec::new(),
        reply,
    };
    let start = writer.reply.object("in_progress", &[], None);
    writer.push(json!({"type": "response.created", "response": start}));
    writer.push(json!({"type": "response.in_progress", "response": start}));
    event_stream(writer, rx)
}
