//! The HTTP surface: routing, authentication, request handlers and response shapes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use futures_util::stream;
use pyramid_grammar::{Constraint, GrammarVocab};
use pyramid_tokenizer::{ChatTemplate, Tokenizer, TokenizerError};
use serde_json::{json, Value};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};
use tokio::sync::Semaphore;

use crate::api::{self, Endpoint, GenerationRequest, Prompt};
use crate::error::ApiError;
use crate::listen::Limits;
use crate::metrics::Metrics;
use crate::tools::{self, ParsedCall, Piece, ToolCallParser, ToolSet};
use crate::worker::{EngineThread, Event, Job, TokenLogprob};
use pyramid_engine::{FinishReason, Speculation, Usage};

/// An API key the server accepts, and the priority its requests take when they name
/// none (for clients that cannot add a field or a header).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKey {
    pub key: String,
    pub priority: Option<i32>,
}

/// The priority the request's API key gives, put in the request's extensions by
/// [`authenticate`].
#[derive(Debug, Clone, Copy, Default)]
struct KeyPriority(Option<i32>);

/// What every handler shares.
pub struct AppState {
    pub engine: EngineThread,
    pub tokenizer: Arc<Tokenizer>,
    pub template: Option<ChatTemplate>,
    pub model_id: String,
    /// Positions of the largest window: prompt plus generation must fit.
    pub max_context: usize,
    /// Keys a request may authenticate with; none: no authentication.
    pub api_keys: Vec<ApiKey>,
    pub limits: Limits,
    pub metrics: Arc<Metrics>,
    pub started: u64,
    next_id: AtomicU64,
    /// One permit per prompt being tokenised ([`Limits::max_tokenizing`]).
    tokenizing: Semaphore,
    /// The vocabulary prepared for grammars (half a second for a 150k vocabulary), built
    /// in the background at start; a request needing it earlier waits for it.
    grammar_vocab: OnceLock<Result<GrammarVocab, String>>,
}

impl AppState {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        engine: EngineThread,
        tokenizer: Arc<Tokenizer>,
        template: Option<ChatTemplate>,
        model_id: String,
        max_context: usize,
        api_keys: Vec<ApiKey>,
        limits: Limits,
        metrics: Arc<Metrics>,
    ) -> Self {
        let started = unix_now();
        Self {
            engine,
            tokenizer,
            template,
            model_id,
            max_context,
            api_keys,
            tokenizing: Semaphore::new(limits.max_tokenizing.max(1)),
            limits,
            metrics,
            started,
            next_id: AtomicU64::new(started << 20),
            grammar_vocab: OnceLock::new(),
        }
    }

    /// The vocabulary prepared for grammars, built on first use.
    fn grammar_vocab(&self) -> Result<&GrammarVocab, &str> {
        self.grammar_vocab
            .get_or_init(|| {
                GrammarVocab::new(Arc::clone(&self.tokenizer)).map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(String::as_str)
    }

    /// Starts preparing the grammar vocabulary on a thread of its own, so the first
    /// constrained request does not pay for it.
    pub fn prepare_grammars(self: &Arc<Self>) {
        let state = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name("pyramid-grammar".into())
            .spawn(move || {
                if let Err(e) = state.grammar_vocab() {
                    tracing::warn!("constrained decoding is unavailable: {e}");
                }
            });
        if let Err(e) = spawned {
            tracing::warn!("cannot prepare grammars in the background: {e}");
        }
    }
}

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .fallback(|req: Request| async move { ApiError::not_found(req.uri().path()) })
        .layer(middleware::from_fn_with_state(
            Arc::clone(&state),
            authenticate,
        ))
        .layer(middleware::from_fn_with_state(
            Arc::clone(&state),
            finish_response,
        ))
        .with_state(state)
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// With API keys set, every endpoint but `/health` (for load balancers and supervisors)
/// needs `Authorization: Bearer <key>` with one of them; the scheme is case-insensitive
/// (RFC 7235). The key's priority goes to the handler.
async fn authenticate(
    State(state): State<Arc<AppState>>,
    mut req: Request,
    next: Next,
) -> Response {
    let mut priority = KeyPriority::default();
    if !state.api_keys.is_empty() {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                let (scheme, token) = v.split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
            });
        match state
            .api_keys
            .iter()
            .find(|k| Some(k.key.as_str()) == given)
        {
            Some(key) => priority = KeyPriority(key.priority),
            None if req.uri().path() != "/health" => {
                return ApiError::unauthorized().into_response()
            }
            None => {}
        }
    }
    req.extensions_mut().insert(priority);
    next.run(req).await
}

/// Gives axum's own bodiless errors (405) OpenAI's error body, and counts every response.
async fn finish_response(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let response = next.run(req).await;
    let response = if response.status() == StatusCode::METHOD_NOT_ALLOWED {
        ApiError::method_not_allowed().into_response()
    } else {
        response
    };
    state.metrics.record_request(response.status().as_u16());
    response
}

async fn health(State(state): State<Arc<AppState>>) -> Response {
    if state.engine.is_alive() {
        Json(json!({"status": "ok"})).into_response()
    } else {
        let body = json!({"status": "error", "message": "the engine thread has stopped"});
        (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
    }
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.metrics.render(),
    )
        .into_response()
}

/// The one model served, as `/v1/models` lists it and `/v1/models/{id}` returns it.
fn model_card(state: &AppState) -> Value {
    json!({
        "id": state.model_id,
        "object": "model",
        "created": state.started,
        "owned_by": "pyramid",
        "max_model_len": state.max_context,
        "route": state.metrics.route_audit(),
    })
}

async fn models(State(state): State<Arc<AppState>>) -> Json<Value> {
    Json(json!({"object": "list", "data": [model_card(&state)]}))
}

async fn model(
    State(state): State<Arc<AppState>>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Result<Json<Value>, ApiError> {
    if id != state.model_id {
        return Err(ApiError::model_not_found(&id, &state.model_id));
    }
    Ok(Json(model_card(&state)))
}

async fn chat_completions(
    State(state): State<Arc<AppState>>,
    Extension(key): Extension<KeyPriority>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    generate(state, Endpoint::Chat, key, &headers, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn completions(
    State(state): State<Arc<AppState>>,
    Extension(key): Extension<KeyPriority>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    generate(state, Endpoint::Completion, key, &headers, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// The header that sets a request's priority for clients that cannot add a body field:
/// the body's `priority` wins over it, and it over the API key's.
pub const PRIORITY_HEADER: &str = "x-priority";

async fn generate(
    state: Arc<AppState>,
    endpoint: Endpoint,
    key: KeyPriority,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let header_priority = match headers.get(PRIORITY_HEADER) {
        None => None,
        Some(v) => {
            let text = v.to_str().unwrap_or("not text");
            api::opt_priority(Some(&Value::String(text.to_string())), "X-Priority")?
        }
    };
    let body = read_body(&state.limits, body).await?;
    let mut request = api::parse(endpoint, &body)?;
    drop(body);
    let priority = request.priority.or(header_priority).or(key.0).unwrap_or(0);
    if request.model != state.model_id {
        return Err(ApiError::model_not_found(&request.model, &state.model_id));
    }
    request
        .sampler
        .check_vocab(state.tokenizer.n_vocab())
        .map_err(|e| ApiError::bad_param("logit_bias", e.to_string()))?;
    let speculation = match (request.speculation, state.engine.speculates()) {
        (Some(Speculation::Ngram), false) => {
            return Err(ApiError::bad_param(
                "speculative",
                "speculative decoding is off on this server: it runs with --speculative off, or on a route whose artifacts return one row of logits per sequence (static OpenVINO shapes)",
            ))
        }
        (Some(asked), _) => asked,
        (None, true) => Speculation::Ngram,
        (None, false) => Speculation::Off,
    };
    if request.prediction.is_some() && speculation == Speculation::Off {
        return Err(ApiError::bad_param(
            "prediction",
            "'prediction' is read by speculative decoding, which is off for this request or server",
        ));
    }
    // Tokenising a long prompt (and compiling a grammar) is real work: keep it off the
    // async workers, a few at a time. The permit is dropped with the request if the
    // client leaves while waiting.
    let prompt_param = request.prompt.param();
    let (prompt, constraint, prediction) = {
        let _permit = state
            .tokenizing
            .acquire()
            .await
            .map_err(|_| ApiError::shutting_down())?;
        let state = Arc::clone(&state);
        // The prompt's text is needed only to tokenise it: moved, not copied.
        let prompt = std::mem::replace(&mut request.prompt, Prompt::Text(String::new()));
        let tools = request.tools.clone();
        let format = request.response_format.clone();
        let predicted = request.prediction.take();
        tokio::task::spawn_blocking(move || {
            let ids = tokenize(&state, &prompt, tools.as_ref())?;
            let constraint = constrain(&state, tools.as_ref(), format.as_ref())?;
            // Plain text, as the reply would be written: no special tokens.
            let prediction = match predicted {
                Some(text) => state
                    .tokenizer
                    .encode(&text, false)
                    .map_err(|e| ApiError::bad_param("prediction", e.to_string()))?,
                None => Vec::new(),
            };
            Ok::<_, ApiError>((ids, constraint, prediction))
        })
        .await
        .map_err(|e| ApiError::internal(format!("tokenizer task failed: {e}")))??
    };
    let (events, rx) = unbounded_channel();
    let n_prompt = prompt.len();
    let single_call = request
        .tools
        .as_ref()
        .is_some_and(|t| t.parses_calls() && !t.parallel);
    state.engine.submit(Job {
        prompt,
        max_tokens: request.max_tokens,
        sampler: request.sampler.clone(),
        stop: request.stop.clone(),
        end_after: if single_call {
            vec![tools::CLOSE.to_string()]
        } else {
            Vec::new()
        },
        logprobs: request.logprobs,
        constraint,
        prompt_param,
        events,
        submitted: Instant::now(),
        priority,
        speculation,
        prediction,
    })?;
    let id = format!(
        "{}-{:x}",
        match endpoint {
            Endpoint::Chat => "chatcmpl",
            Endpoint::Completion => "cmpl",
        },
        state.next_id.fetch_add(1, Ordering::Relaxed)
    );
    let reply = Reply {
        id,
        created: unix_now(),
        model: state.model_id.clone(),
        request,
    };
    if reply.request.stream {
        Ok(stream_response(reply, rx))
    } else {
        collect_response(reply, rx, n_prompt).await
    }
}

/// The whole body, within the size limit and the body timeout.
async fn read_body(limits: &Limits, body: Body) -> Result<Vec<u8>, ApiError> {
    let read = axum::body::to_bytes(body, limits.body_limit);
    match tokio::time::timeout(limits.body_timeout, read).await {
        Err(_) => Err(ApiError::body_timeout(limits.body_timeout)),
        Ok(Ok(bytes)) => Ok(bytes.into()),
        Ok(Err(err)) => {
            let too_large = std::error::Error::source(&err)
                .is_some_and(|e| e.is::<http_body_util::LengthLimitError>());
            Err(if too_large {
                ApiError::body_too_large(limits.body_limit)
            } else {
                ApiError::invalid_request(format!("cannot read the request body: {err}"))
            })
        }
    }
}

/// The grammar a chat reply must follow, compiled: `None` when nothing constrains it.
fn constrain(
    state: &AppState,
    tools: Option<&ToolSet>,
    format: Option<&pyramid_grammar::Grammar>,
) -> Result<Option<Constraint>, ApiError> {
    let Some(grammar) = tools::reply_grammar(tools, format) else {
        return Ok(None);
    };
    let vocab = state
        .grammar_vocab()
        .map_err(|e| ApiError::internal(e.to_string()))?;
    // The grammar comes from a forced call's tools, else from the format if there is one.
    let param = match tools {
        Some(t) if t.forces_calls() => "tools",
        _ if format.is_some() => "response_format",
        _ => "tools",
    };
    vocab
        .compile(&grammar)
        .map(Some)
        .map_err(|e| ApiError::bad_param(param, format!("'{param}' cannot be enforced: {e}")))
}

/// The prompt's ids; tokenising stops once the prompt and one generated token no longer
/// fit the largest window, so an oversized prompt costs little.
fn tokenize(
    state: &AppState,
    prompt: &Prompt,
    tools: Option<&ToolSet>,
) -> Result<Vec<u32>, ApiError> {
    let limit = state.max_context.saturating_sub(1);
    let param = prompt.param();
    let ids = match prompt {
        Prompt::Chat(messages) => {
            let template = state.template.as_ref().ok_or_else(|| {
                ApiError::invalid_request("this model has no chat template: use /v1/completions")
            })?;
            let definitions = tools.map_or(&[][..], ToolSet::prompt_tools);
            let uses_tools = !definitions.is_empty()
                || messages
                    .iter()
                    .any(|m| !m.tool_calls.is_empty() || m.role == "tool");
            let rendered = if uses_tools && !template.takes_tools() {
                template.render(&tools::fallback_messages(messages, definitions), true)
            } else {
                template.render_with_tools(messages, definitions, true)
            };
            let text = rendered.map_err(|e| {
                ApiError::bad_param(
                    "messages",
                    format!("the chat template rejected the messages: {e}"),
                )
            })?;
            // The template carries its own BOS if it wants one; nothing is added on top.
            state.tokenizer.encode_within(&text, true, limit)
        }
        Prompt::Text(text) => state.tokenizer.encode_prompt_within(text, limit),
        Prompt::Ids(ids) => {
            let n_vocab = state.tokenizer.n_vocab();
            if let Some(id) = ids.iter().find(|&&id| id as usize >= n_vocab) {
                return Err(ApiError::bad_param(
                    "prompt",
                    format!("token id {id} is out of range (vocabulary has {n_vocab} tokens)"),
                ));
            }
            if ids.len() > limit {
                return Err(ApiError::prompt_beyond_context(param, state.max_context));
            }
            Ok(ids.clone())
        }
    }
    .map_err(|e| match e {
        TokenizerError::TooManyTokens { .. } => {
            ApiError::prompt_beyond_context(param, state.max_context)
        }
        e => ApiError::invalid_request(format!("the prompt cannot be tokenized: {e}")),
    })?;
    if ids.is_empty() {
        return Err(ApiError::bad_param(param, "the prompt is empty"));
    }
    Ok(ids)
}

/// The fixed parts of one response.
struct Reply {
    id: String,
    created: u64,
    model: String,
    request: GenerationRequest,
}

impl Reply {
    fn is_chat(&self) -> bool {
        self.request.endpoint == Endpoint::Chat
    }

    /// A parser for the reply's tool calls, when it is read for them.
    fn call_parser(&self) -> Option<ToolCallParser> {
        self.request
            .tools
            .as_ref()
            .filter(|t| t.parses_calls())
            .map(ToolCallParser::new)
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

/// Server-sent events: a chunk per event, `data: [DONE]` at the end. Dropping the body
/// (the client went away) drops the receiver, which the engine sees as a cancellation.
/// A tool call is sent as one `tool_calls` delta once its closing tag is in.
fn stream_response(reply: Reply, rx: UnboundedReceiver<Event>) -> Response {
    let first = reply.is_chat().then(|| {
        let role = json!({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null});
        sse(&reply.chunk(Some(role), None))
    });
    struct StreamState {
        parser: Option<ToolCallParser>,
        reply: Reply,
        rx: UnboundedReceiver<Event>,
        pending: Vec<Bytes>,
        /// Tool calls sent so far: the next one's `index`.
        calls_sent: usize,
        done: bool,
    }
    impl StreamState {
        /// Chunks for `pieces`; `logprobs` go with the first (or alone, if none).
        fn send(&mut self, pieces: Vec<Piece>, logprobs: &[TokenLogprob]) {
            let mut logprobs = Some(logprobs).filter(|l| !l.is_empty());
            for piece in pieces {
                let delta = match piece {
                    Piece::Text(text) => json!({"content": text}),
                    Piece::Call(call) => {
                        self.calls_sent += 1;
                        json!({"tool_calls": [call_json(&call, Some(self.calls_sent - 1))]})
                    }
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
    let state = StreamState {
        parser: reply.call_parser(),
        reply,
        rx,
        pending: first.into_iter().collect(),
        calls_sent: 0,
        done: false,
    };
    let body = stream::unfold(state, |mut s| async move {
        loop {
            if !s.pending.is_empty() {
                let next = s.pending.remove(0);
                return Some((Ok::<_, std::convert::Infallible>(next), s));
            }
            if s.done {
                return None;
            }
            match s.rx.recv().await {
                Some(Event::Delta { text, logprobs }) => {
                    let pieces = match s.parser.as_mut() {
                        Some(parser) => parser.push(&text),
                        None if text.is_empty() => Vec::new(),
                        None => vec![Piece::Text(text)],
                    };
                    s.send(pieces, &logprobs);
                }
                Some(Event::Done {
                    finish_reason,
                    usage,
                }) => {
                    let rest = s
                        .parser
                        .as_mut()
                        .map(ToolCallParser::finish)
                        .unwrap_or_default();
                    s.send(rest, &[]);
                    let n_calls = s.parser.as_ref().map_or(0, ToolCallParser::n_calls);
                    let finish = finish_name(finish_reason, n_calls);
                    let choice = s.reply.delta_choice(json!({}), &[], Some(finish));
                    s.pending.push(sse(&s.reply.chunk(Some(choice), None)));
                    if s.reply.request.include_usage {
                        s.pending.push(sse(&s.reply.chunk(None, Some(&usage))));
                    }
                    s.pending.push(Bytes::from_static(b"data: [DONE]\n\n"));
                    s.done = true;
                }
                Some(Event::Failed(err)) => {
                    s.pending.push(sse(&err.body()));
                    s.done = true;
                }
                None => {
                    let err =
                        ApiError::internal("the engine stopped before finishing this request");
                    s.pending.push(sse(&err.body()));
                    s.done = true;
                }
            }
        }
    });
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(body),
    )
        .into_response()
}

async fn collect_response(
    reply: Reply,
    mut rx: UnboundedReceiver<Event>,
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
        let mut message = json!({"role": "assistant", "content": text});
        let mut n_calls = 0;
        if let Some(mut parser) = reply.call_parser() {
            let mut pieces = parser.push(&text);
            pieces.extend(parser.finish());
            let mut content = String::new();
            let mut calls = Vec::new();
            for piece in pieces {
                match piece {
                    Piece::Text(t) => content.push_str(&t),
                    Piece::Call(call) => calls.push(call_json(&call, None)),
                }
            }
            n_calls = calls.len();
            if !calls.is_empty() {
                // Only whitespace around the calls is no answer.
                message["content"] = if content.trim().is_empty() {
                    Value::Null
                } else {
                    json!(content.trim())
                };
                message["tool_calls"] = json!(calls);
            }
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
