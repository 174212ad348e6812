//! The HTTP surface: routing and the request handlers.
//!
//! - [`state`]: what every handler shares ([`AppState`]).
//! - [`auth`]: API keys and the priority they give.
//! - [`prepare`]: the body read, the prompt tokenised and the grammar compiled.
//! - [`render`]: engine events as one JSON response or as server-sent events.
//! - [`messages`]: Anthropic's Messages endpoints (`crate::anthropic` reads and writes
//!   their shapes).
//! - [`embeddings`]: `/v1/embeddings` (`crate::embeddings` reads and writes its shapes).
//! - [`engine`]: the engine view, `/v1/engine/snapshot` and `/v1/engine/events`.
//! - [`responses`]: OpenAI's Responses endpoints (`crate::responses` reads, writes and
//!   keeps them).

mod auth;
mod embeddings;
mod engine;
mod messages;
mod prepare;
mod render;
mod responses;
mod state;
#[cfg(test)]
mod tests;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use serde_json::{json, Value};

use self::auth::{authenticate, KeyPriority};
use self::prepare::{prepare, read_body, Prepared};
use self::render::{collect_response, stream_response, Reply};
use crate::api::GenerationRequest;
use crate::api::{self, Endpoint};
use crate::error::ApiError;
use crate::outbox::outbox;
use crate::tools;
use crate::worker::{Event, Job};
use tokio::sync::mpsc::Receiver;

pub use auth::ApiKey;
pub use state::{AppState, EmbeddingSetup};

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/messages", post(messages::messages))
        .route("/v1/messages/count_tokens", post(messages::count_tokens))
        .route("/v1/responses", post(responses::create))
        .route("/v1/embeddings", post(embeddings::embeddings))
        .route("/v1/engine/snapshot", get(engine::snapshot))
        .route("/v1/engine/events", get(engine::events))
        .route(
            "/v1/responses/{id}",
            get(responses::retrieve).delete(responses::delete),
        )
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

pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Gives axum's own bodiless errors (405) OpenAI's error body, and Anthropic's paths
/// Anthropic's, and counts every response.
async fn finish_response(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let anthropic = req.uri().path().starts_with("/v1/messages");
    let response = next.run(req).await;
    let response = if response.status() == StatusCode::METHOD_NOT_ALLOWED {
        ApiError::method_not_allowed().into_response()
    } else {
        response
    };
    let response = if anthropic {
        crate::anthropic::restyle_error(response).await
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
        "embedding": state.embedding.filter(|_| state.engine.embeds()).map(|e| json!({
            "pooling": e.pooling.name(),
            "dimensions": e.width,
            "only": e.only,
        })),
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
/// the body's `priority` wins over it; either may make a request less urgent than its
/// API key's priority, never more.
pub const PRIORITY_HEADER: &str = "x-priority";

/// The priority the X-Priority header asks, if it is there.
pub(super) fn header_priority(headers: &HeaderMap) -> Result<Option<i32>, ApiError> {
    match headers.get(PRIORITY_HEADER) {
        None => Ok(None),
        Some(v) => {
            let text = v.to_str().unwrap_or("not text");
            api::opt_priority(Some(&Value::String(text.to_string())), "X-Priority")
        }
    }
}

/// A request taken in: parsed, prepared and submitted to the engine thread, whose
/// events for it arrive on `events`.
pub(super) struct Submitted {
    pub(super) request: GenerationRequest,
    /// The first choice's events.
    pub(super) events: Receiver<Event>,
    /// The other choices' events, in order (`n` > 1, chat and text completions only).
    pub(super) more_choices: Vec<Receiver<Event>>,
    /// Tokens of the prompt as rendered.
    pub(super) n_prompt: usize,
}

/// Reads `body` within the limits and runs `work` on it on a blocking thread. Parsing,
/// rendering, tokenising and compiling a grammar are CPU work that grows with the body:
/// kept off the async workers, a few at a time. The blocking task holds its permit to
/// the end, so a client that leaves frees its slot only once its work stops.
pub(super) async fn on_blocking_thread<T: Send + 'static>(
    state: &Arc<AppState>,
    body: Body,
    work: impl FnOnce(&AppState, &[u8]) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    let body = read_body(&state.limits, body).await?;
    let permit = Arc::clone(&state.tokenizing)
        .acquire_owned()
        .await
        .map_err(|_| ApiError::shutting_down())?;
    let task_state = Arc::clone(state);
    tokio::task::spawn_blocking(move || {
        let _permit = permit;
        work(&task_state, &body)
    })
    .await
    .map_err(|e| ApiError::internal(format!("preparing the request failed: {e}")))?
}

/// Reads `body` with `parse` (a protocol's reader) and submits the request, parsed and
/// prepared on a blocking thread ([`on_blocking_thread`]). `parse` may read more than
/// the engine's request: what else it returns comes back beside the submission.
pub(super) async fn submit<T: Send + 'static>(
    state: &Arc<AppState>,
    key: KeyPriority,
    headers: &HeaderMap,
    body: Body,
    parse: impl FnOnce(&[u8]) -> Result<(GenerationRequest, T), ApiError> + Send + 'static,
) -> Result<(Submitted, T), ApiError> {
    if state.embedding.is_some_and(|e| e.only) {
        return Err(ApiError::invalid_request(
            "this server serves embeddings only (--embedding): use /v1/embeddings",
        ));
    }
    let header_priority = header_priority(headers)?;
    let (
        Prepared {
            request,
            prompt,
            prompt_param,
            constraints,
            prediction,
            priority,
            speculation,
        },
        extra,
    ) = on_blocking_thread(state, body, move |state, body| {
        let (request, extra) = parse(body)?;
        Ok((prepare(state, request, key, header_priority)?, extra))
    })
    .await?;
    let n_prompt = prompt.len();
    let single_call = request
        .tools
        .as_ref()
        .is_some_and(|t| t.parses_calls() && !t.parallel);
    let mut receivers = Vec::with_capacity(constraints.len());
    for (choice, constraint) in constraints.into_iter().enumerate() {
        let (events, rx) = outbox();
        let mut sampler = request.sampler.clone();
        // Each choice samples on its own; one seed still repeats them all.
        sampler.seed = sampler.seed.wrapping_add(choice as u64);
        state.engine.submit(Job {
            prompt: prompt.clone(),
            max_tokens: request.max_tokens,
            sampler,
            stop: request.stop.clone(),
            end_after: if single_call {
                vec![tools::CLOSE.to_string()]
            } else {
                Vec::new()
            },
            ignore_eos: request.extensions.ignore_eos,
            stop_token_ids: request.extensions.stop_token_ids.clone(),
            min_tokens: request.extensions.min_tokens,
            logprobs: request.logprobs,
            constraint,
            prompt_param,
            events,
            submitted: Instant::now(),
            priority,
            speculation,
            prediction: prediction.clone(),
            pooling: None,
        })?;
        receivers.push(rx);
    }
    let mut receivers = receivers.into_iter();
    let rx = receivers.next().expect("a request has at least one choice");
    Ok((
        Submitted {
            request,
            events: rx,
            more_choices: receivers.collect(),
            n_prompt,
        },
        extra,
    ))
}

async fn generate(
    state: Arc<AppState>,
    endpoint: Endpoint,
    key: KeyPriority,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let max_tools = state.limits.max_tools;
    let (
        Submitted {
            request,
            events,
            more_choices,
            n_prompt,
        },
        (),
    ) = submit(&state, key, headers, body, move |body| {
        Ok((api::parse(endpoint, body, max_tools)?, ()))
    })
    .await?;
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
    let choices: Vec<Receiver<Event>> = std::iter::once(events).chain(more_choices).collect();
    if reply.request.stream {
        Ok(stream_response(reply, choices))
    } else {
        collect_response(reply, choices, n_prompt).await
    }
}
