//! Engine events as OpenAI responses: one JSON body, or server-sent event chunks.

use axum::body::Bytes;
use axum::response::{IntoResponse, Response};
use axum::Json;
use pyramid_engine::{FinishReason, Usage};
use serde_json::{json, Value};
use tokio::sync::mpsc::Receiver;

use crate::api::{self, Endpoint, GenerationRequest};
use crate::error::ApiError;
use crate::sse::{event_stream, EventWriter};
use crate::tools::{Gathered, ParsedCall, Piece, ReplyReader};
use crate::worker::{Event, TokenLogprob};

/// The fixed parts of one response.
pub(super) struct Reply {
    pub(super) id: String,
    pub(super) created: u64,
    pub(super) model: String,
    pub(super) request: GenerationRequest,
}

impl Reply {
    fn is_chat(&self) -> bool {
        self.request.endpoint == Endpoint::Chat
    }

    /// The reader of the reply, for tool calls when they may be made.
    fn reader(&self) -> ReplyReader {
        ReplyReader::new(self.request.tools.as_ref(), self.request.thinking)
    }

    /// One streamed chunk around `choice` (or `usage` with no choice).
    fn chunk(&self, choice: Option<Value>, usage: Option<&Usage>) -> Value {
        let mut chunk = json!({
            "id": self.id,
            "object": if self.is_chat() { "chat.completion.chunk" } else { "text_completion" },
            "created": self.created,
            "model": self.model,
            "choices": choice.into_iter().collect::<Vec<_>>(),
        });
        if self.request.include_usage {
            chunk["usage"] = usage.map_or(Value::Null, usage_json);
        }
        chunk
    }

    fn delta_choice(&self, delta: Value, logprobs: &[TokenLogprob], finish: Option<&str>) -> Value {
        if self.is_chat() {
            json!({
                "index": 0,
                "delta": delta,
                "logprobs": self.logprobs_json(logprobs),
                "finish_reason": finish,
            })
        } else {
            let text = delta.get("content").cloned().unwrap_or(json!(""));
            json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish})
        }
    }

    fn logprobs_json(&self, logprobs: &[TokenLogprob]) -> Value {
        match self.request.logprobs {
            Some(_) if !logprobs.is_empty() => json!({"content": logprobs}),
            _ => Value::Null,
        }
    }
}

/// OpenAI's finish reason: `tool_calls` when the reply ended after calling tools.
fn finish_name(reason: FinishReason, n_calls: usize) -> &'static str {
    match reason {
        FinishReason::Stop if n_calls > 0 => "tool_calls",
        other => other.as_str(),
    }
}

/// A call as `message.tool_calls` (and, with `index`, a streamed delta) carries it.
fn call_json(call: &ParsedCall, index: Option<usize>) -> Value {
    let mut value = json!({
        "id": format!("call_{:016x}", api::random_seed()),
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    });
    if let Some(index) = index {
        value["index"] = json!(index);
    }
    value
}

/// OpenAI's usage; speculation's drafts are reported under OpenAI's names for predicted
/// tokens (`completion_tokens_details`), with pyramid's own counts in `speculative`.
fn usage_json(u: &Usage) -> Value {
    let s = &u.speculative;
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
        "completion_tokens_details": {
            "accepted_prediction_tokens": s.accepted_tokens,
            "rejected_prediction_tokens": s.drafted_tokens - s.accepted_tokens,
        },
        "speculative": {
            "drafted_tokens": s.drafted_tokens,
            "accepted_tokens": s.accepted_tokens,
            "acceptance_rate": s.acceptance_rate(),
            "decode_passes": s.decode_passes,
            "tokens_per_pass": s.tokens_per_pass(),
        },
    })
}

fn sse(value: &Value) -> Bytes {
    Bytes::from(format!("data: {value}\n\n"))
}

/// Server-sent events: a chunk per event, `data: [DONE]` at the end. A tool call's first
/// delta carries its index, id, type and name; its arguments follow in fragments as the
/// model writes them.
pub(super) fn stream_response(reply: Reply, rx: Receiver<Event>) -> Response {
    let first = reply.is_chat().then(|| {
        let role = json!({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null});
        sse(&reply.chunk(Some(role), None))
    });
    let writer = ChunkWriter {
        reader: reply.reader(),
        reply,
        pending: first.into_iter().collect(),
        calls_sent: 0,
    };
    event_stream(writer, rx)
}

/// A streamed OpenAI reply's chunks.
struct ChunkWriter {
    reader: ReplyReader,
    reply: Reply,
    pending: Vec<Bytes>,
    /// Tool calls sent so far: the next one's `index`.
    calls_sent: usize,
}

impl ChunkWriter {
    /// Chunks for `pieces`; `logprobs` go with the first (or alone, if none).
    fn send(&mut self, pieces: Vec<Piece>, logprobs: &[TokenLogprob]) {
        let mut logprobs = Some(logprobs).filter(|l| !l.is_empty());
        for piece in pieces {
            let delta = match piece {
                Piece::Reasoning(text) => json!({"reasoning_content": text}),
                Piece::Text(text) => json!({"content": text}),
                Piece::CallStart(name) => {
                    self.calls_sent += 1;
                    let call = ParsedCall {
                        name,
                        arguments: String::new(),
                    };
                    json!({"tool_calls": [call_json(&call, Some(self.calls_sent - 1))]})
                }
                Piece::Arguments(part) => json!({"tool_calls": [{
                    "index": self.calls_sent.saturating_sub(1),
                    "function": {"arguments": part},
                }]}),
                Piece::CallEnd => continue,
            };
            let choice = self
                .reply
                .delta_choice(delta, logprobs.take().unwrap_or(&[]), None);
            self.pending
                .push(sse(&self.reply.chunk(Some(choice), None)));
        }
        if let Some(logprobs) = logprobs {
            let choice = self
                .reply
                .delta_choice(json!({"content": ""}), logprobs, None);
            self.pending
                .push(sse(&self.reply.chunk(Some(choice), None)));
        }
    }
}

impl EventWriter for ChunkWriter {
    fn pending(&mut self) -> &mut Vec<Bytes> {
        &mut self.pending
    }

    fn write(&mut self, event: Option<Event>) -> bool {
        match event {
            Some(Event::Delta { text, logprobs }) => {
                let pieces = self.reader.push(text);
                self.send(pieces, &logprobs);
                return false;
            }
            Some(Event::Done {
                finish_reason,
                usage,
                ..
            }) => {
                let rest = self.reader.finish();
                self.send(rest, &[]);
                let finish = finish_name(finish_reason, self.reader.n_calls());
                let choice = self.reply.delta_choice(json!({}), &[], Some(finish));
                self.pending
                    .push(sse(&self.reply.chunk(Some(choice), None)));
                if self.reply.request.include_usage {
                    self.pending
                        .push(sse(&self.reply.chunk(None, Some(&usage))));
                }
                self.pending.push(Bytes::from_static(b"data: [DONE]\n\n"));
            }
            Some(Event::Failed(err)) => self.pending.push(sse(&err.body())),
            None => {
                let err = ApiError::internal("the engine stopped before finishing this request");
                self.pending.push(sse(&err.body()));
            }
        }
        true
    }
}

pub(super) async fn collect_response(
    reply: Reply,
    mut rx: Receiver<Event>,
    n_prompt: usize,
) -> Result<Response, ApiError> {
    let mut text = String::new();
    let mut logprobs = Vec::new();
    let (finish_reason, usage) = loop {
        match rx.recv().await {
            Some(Event::Delta {
                text: t,
                logprobs: l,
            }) => {
                text.push_str(&t);
                logprobs.extend(l);
            }
            Some(Event::Done {
                finish_reason,
                usage,
                ..
            }) => break (finish_reason, usage),
            Some(Event::Failed(err)) => return Err(err),
            None => {
                return Err(ApiError::internal(format!(
                    "the engine stopped before finishing this request ({n_prompt} prompt tokens)"
                )))
            }
        }
    };
    let choice = if reply.is_chat() {
        let mut reader = reply.reader();
        let mut gathered = Gathered::default();
        gathered.add(reader.push(text));
        gathered.add(reader.finish());
        let content = gathered.text;
        let calls: Vec<Value> = gathered.calls.iter().map(|c| call_json(c, None)).collect();
        let n_calls = calls.len();
        let mut message = json!({"role": "assistant", "content": content});
        if !gathered.reasoning.is_empty() {
            message["reasoning_content"] = json!(gathered.reasoning);
        }
        if !calls.is_empty() {
            // Only whitespace around the calls is no answer.
            message["content"] = if content.trim().is_empty() {
                Value::Null
            } else {
                json!(content.trim())
            };
            message["tool_calls"] = json!(calls);
        }
        json!({
            "index": 0,
            "message": message,
            "logprobs": reply.logprobs_json(&logprobs),
            "finish_reason": finish_name(finish_reason, n_calls),
        })
    } else {
        json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish_reason})
    };
    Ok(Json(json!({
        "id": reply.id,
        "object": if reply.is_chat() { "chat.completion" } else { "text_completion" },
        "created": reply.created,
        "model": reply.model,
        "choices": [choice],
        "usage": usage_json(&usage),
    }))
    .into_response())
}
