//! Engine events as OpenAI responses: one JSON body, or server-sent event chunks.

use axum::body::Bytes;
use axum::response::{IntoResponse, Response};
use axum::Json;
use pyramid_engine::{FinishReason, Usage};
use serde_json::{json, Value};
use tokio::sync::mpsc::Receiver;

use crate::api::{self, Endpoint, GenerationRequest};
use crate::error::ApiError;
use crate::sse::{event_stream, merge_choices, EventWriter};
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

    fn delta_choice(
        &self,
        index: usize,
        delta: Value,
        logprobs: &[TokenLogprob],
        finish: Option<&str>,
    ) -> Value {
        if self.is_chat() {
            json!({
                "index": index,
                "delta": delta,
                "logprobs": self.logprobs_json(logprobs),
                "finish_reason": finish,
            })
        } else {
            let text = delta.get("content").cloned().unwrap_or(json!(""));
            json!({"index": index, "text": text, "logprobs": null, "finish_reason": finish})
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
        // `restored_tokens` (pyramid's): the cached ones read back from `--session-dir`.
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens, "restored_tokens": u.restored_tokens},
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

/// The usage of a request's choices together: its prompt once (prefilled once, the other
/// choices forked from it), every choice's tokens.
fn joint_usage(choices: &[Usage]) -> Usage {
    let mut all = choices.first().copied().unwrap_or_default();
    for u in choices.iter().skip(1) {
        all.completion_tokens += u.completion_tokens;
        let (s, t) = (&mut all.speculative, &u.speculative);
        s.drafted_tokens += t.drafted_tokens;
        s.accepted_tokens += t.accepted_tokens;
        s.decode_passes += t.decode_passes;
        s.verify_passes += t.verify_passes;
    }
    all
}

/// Server-sent events: a chunk per event (each choice's under its `index`), `data:
/// [DONE]` once every choice has finished. A tool call's first delta carries its index,
/// id, type and name; its arguments follow in fragments as the model writes them.
pub(super) fn stream_response(reply: Reply, choices: Vec<Receiver<Event>>) -> Response {
    let mut pending = Vec::new();
    if reply.is_chat() {
        for index in 0..choices.len() {
            let role = json!({"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null});
            pending.push(sse(&reply.chunk(Some(role), None)));
        }
    }
    let writer = ChunkWriter {
        choices: (0..choices.len())
            .map(|_| ChoiceState {
                reader: reply.reader(),
                calls_sent: 0,
                usage: None,
            })
            .collect(),
        reply,
        pending,
    };
    event_stream(writer, merge_choices(choices))
}

/// One streamed choice.
struct ChoiceState {
    reader: ReplyReader,
    /// Tool calls sent so far: the next one's `index`.
    calls_sent: usize,
    /// Once it has finished.
    usage: Option<Usage>,
}

/// A streamed OpenAI reply's chunks.
struct ChunkWriter {
    choices: Vec<ChoiceState>,
    reply: Reply,
    pending: Vec<Bytes>,
}

impl ChunkWriter {
    /// Chunks for choice `index`'s `pieces`; `logprobs` go with the first (or alone).
    fn send(&mut self, index: usize, pieces: Vec<Piece>, logprobs: &[TokenLogprob]) {
        let mut logprobs = Some(logprobs).filter(|l| !l.is_empty());
        for piece in pieces {
            let choice = &mut self.choices[index];
            let delta = match piece {
                Piece::Reasoning(text) => json!({"reasoning_content": text}),
                Piece::Text(text) => json!({"content": text}),
                Piece::CallStart(name) => {
                    choice.calls_sent += 1;
                    let call = ParsedCall {
                        name,
                        arguments: String::new(),
                    };
                    json!({"tool_calls": [call_json(&call, Some(choice.calls_sent - 1))]})
                }
                Piece::Arguments(part) => json!({"tool_calls": [{
                    "index": choice.calls_sent.saturating_sub(1),
                    "function": {"arguments": part},
                }]}),
                Piece::CallEnd => continue,
            };
            let choice =
                self.reply
                    .delta_choice(index, delta, logprobs.take().unwrap_or(&[]), None);
            self.pending
                .push(sse(&self.reply.chunk(Some(choice), None)));
        }
        if let Some(logprobs) = logprobs {
            let choice = self
                .reply
                .delta_choice(index, json!({"content": ""}), logprobs, None);
            self.pending
                .push(sse(&self.reply.chunk(Some(choice), None)));
        }
    }

    fn fail(&mut self, err: &ApiError) {
        self.pending.push(sse(&err.body()));
    }
}

impl EventWriter for ChunkWriter {
    type Input = (usize, Option<Event>);

    fn pending(&mut self) -> &mut Vec<Bytes> {
        &mut self.pending
    }

    fn write(&mut self, event: Option<(usize, Option<Event>)>) -> bool {
        let stopped = || ApiError::internal("the engine stopped before finishing this request");
        match event {
            Some((index, Some(Event::Delta { text, logprobs }))) => {
                let pieces = self.choices[index].reader.push(text);
                self.send(index, pieces, &logprobs);
                false
            }
            Some((
                index,
                Some(Event::Done {
                    finish_reason,
                    usage,
                    ..
                }),
            )) => {
                let rest = self.choices[index].reader.finish();
                self.send(index, rest, &[]);
                let finish = finish_name(finish_reason, self.choices[index].reader.n_calls());
                let choice = self.reply.delta_choice(index, json!({}), &[], Some(finish));
                self.pending
                    .push(sse(&self.reply.chunk(Some(choice), None)));
                self.choices[index].usage = Some(usage);
                let Some(all) = self
                    .choices
                    .iter()
                    .map(|c| c.usage)
                    .collect::<Option<Vec<Usage>>>()
                else {
                    return false;
                };
                if self.reply.request.include_usage {
                    let usage = joint_usage(&all);
                    self.pending
                        .push(sse(&self.reply.chunk(None, Some(&usage))));
                }
                self.pending.push(Bytes::from_static(b"data: [DONE]\n\n"));
                true
            }
            Some((_, Some(Event::Failed(err)))) => {
                self.fail(&err);
                true
            }
            Some((_, None)) | None => {
                self.fail(&stopped());
                true
            }
        }
    }
}

/// One choice's text, log-probabilities, finish reason and usage, once it is done.
async fn collect_choice(
    mut rx: Receiver<Event>,
    n_prompt: usize,
) -> Result<(String, Vec<TokenLogprob>, FinishReason, Usage), ApiError> {
    let mut text = String::new();
    let mut logprobs = Vec::new();
    loop {
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
            }) => return Ok((text, logprobs, finish_reason, usage)),
            Some(Event::Failed(err)) => return Err(err),
            None => {
                return Err(ApiError::internal(format!(
                    "the engine stopped before finishing this request ({n_prompt} prompt tokens)"
                )))
            }
        }
    }
}

pub(super) async fn collect_response(
    reply: Reply,
    choices: Vec<Receiver<Event>>,
    n_prompt: usize,
) -> Result<Response, ApiError> {
    let done =
        futures_util::future::join_all(choices.into_iter().map(|rx| collect_choice(rx, n_prompt)))
            .await;
    let mut rendered = Vec::with_capacity(done.len());
    let mut usages = Vec::with_capacity(done.len());
    for (index, choice) in done.into_iter().enumerate() {
        let (text, logprobs, finish_reason, usage) = choice?;
        rendered.push(render_choice(&reply, index, text, &logprobs, finish_reason));
        usages.push(usage);
    }
    Ok(Json(json!({
        "id": reply.id,
        "object": if reply.is_chat() { "chat.completion" } else { "text_completion" },
        "created": reply.created,
        "model": reply.model,
        "choices": rendered,
        "usage": usage_json(&joint_usage(&usages)),
    }))
    .into_response())
}

/// A finished choice as the response's `choices[index]`.
fn render_choice(
    reply: &Reply,
    index: usize,
    text: String,
    logprobs: &[TokenLogprob],
    finish_reason: FinishReason,
) -> Value {
    if !reply.is_chat() {
        return json!({"index": index, "text": text, "logprobs": null, "finish_reason": finish_reason});
    }
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
        "index": index,
        "message": message,
        "logprobs": reply.logprobs_json(logprobs),
        "finish_reason": finish_name(finish_reason, n_calls),
    })
}
