//! `POST /v1/embeddings`: each input tokenised, submitted as an embedding request (the
//! engine batches their prefills like any others), and the vectors returned in order.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use pyramid_tokenizer::TokenizerError;

use super::auth::KeyPriority;
use super::{header_priority, on_blocking_thread, AppState, EmbeddingSetup};
use crate::embeddings::{self, EmbeddingRequest, Input};
use crate::error::ApiError;
use crate::outbox::outbox;
use crate::worker::{Event, Job};

pub(super) async fn embeddings(
    State(state): State<Arc<AppState>>,
    Extension(key): Extension<KeyPriority>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    create(state, key, &headers, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn create(
    state: Arc<AppState>,
    key: KeyPriority,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let setup = state
        .embedding
        .ok_or_else(|| ApiError::invalid_request("this server was started without embeddings"))?;
    let header_priority = header_priority(headers)?;
    let (request, prompts) = on_blocking_thread(&state, body, move |state, body| {
        let mut request = embeddings::parse(body, state.engine.max_queue())?;
        let prompts = tokenize(state, &setup, &mut request)?;
        Ok((request, prompts))
    })
    .await?;
    let priority = key.apply(request.priority.or(header_priority));
    // Every input is queued before any is read, so the engine batches them; dropping
    // the receivers (an error below, or a client gone) aborts the rest.
    let mut receivers = Vec::with_capacity(prompts.len());
    for prompt in prompts {
        let (events, rx) = outbox();
        state
            .engine
            .submit(Job::embedding(prompt, setup.pooling, priority, events))?;
        receivers.push(rx);
    }
    let mut vectors = Vec::with_capacity(receivers.len());
    let mut prompt_tokens = 0;
    for mut rx in receivers {
        loop {
            match rx.recv().await {
                Some(Event::Done {
                    usage,
                    embedding: Some(vector),
                    ..
                }) => {
                    prompt_tokens += usage.prompt_tokens;
                    vectors.push(vector);
                    break;
                }
                Some(Event::Failed(err)) => return Err(err),
                Some(Event::Delta { .. }) => continue,
                Some(Event::Done { .. }) | None => {
                    return Err(ApiError::internal(
                        "the engine ended an embedding without its vector",
                    ))
                }
            }
        }
    }
    Ok(Json(embeddings::response(
        &state.model_id,
        &vectors,
        request.encoding,
        prompt_tokens,
    ))
    .into_response())
}

/// Checks `request` against the model and the route and turns its inputs into ids
/// within the largest window (text as a plain prompt: BOS and EOS as the model's
/// tokenizer adds them).
fn tokenize(
    state: &AppState,
    setup: &EmbeddingSetup,
    request: &mut EmbeddingRequest,
) -> Result<Vec<Vec<u32>>, ApiError> {
    if request.model != state.model_id {
        return Err(ApiError::model_not_found(&request.model, &state.model_id));
    }
    if !state.engine.embeds() {
        return Err(ApiError::invalid_request(
            "embeddings run on the native route (--device cpu): this route's compiled \
             artifacts return logits, not hidden states",
        ));
    }
    if let Some(asked) = request.dimensions.filter(|&d| d != setup.width) {
        return Err(ApiError::bad_param(
            "dimensions",
            format!(
                "this model's embeddings have {} dimensions; shortening them to {asked} is \
                 right only for models trained for it, which this model file does not declare",
                setup.width
            ),
        ));
    }
    let limit = state.max_context;
    let n_vocab = state.tokenizer.n_vocab();
    let too_long = |i: usize| ApiError {
        code: Some("context_length_exceeded"),
        ..ApiError::bad_param(
            "input",
            format!("input {i} is longer than the model's maximum context length ({limit} tokens)"),
        )
    };
    std::mem::take(&mut request.inputs)
        .into_iter()
        .enumerate()
        .map(|(i, input)| match input {
            Input::Text(text) => {
                let ids = state
                    .tokenizer
                    .encode_prompt_within(&text, limit)
                    .map_err(|e| match e {
                        TokenizerError::TooManyTokens { .. } => too_long(i),
                        e => ApiError::bad_param(
                            "input",
                            format!("input {i} cannot be tokenized: {e}"),
                        ),
                    })?;
                if ids.is_empty() {
                    return Err(ApiError::bad_param(
                        "input",
                        format!("input {i} has no tokens"),
                    ));
                }
                Ok(ids)
            }
            Input::Ids(ids) => {
                if let Some(id) = ids.iter().find(|&&id| id as usize >= n_vocab) {
                    return Err(ApiError::bad_param(
                        "input",
                        format!(
                            "input {i}: token id {id} is out of range (vocabulary has {n_vocab} tokens)"
                        ),
                    ));
                }
                if ids.len() > limit {
                    return Err(too_long(i));
                }
                Ok(ids)
            }
        })
        .collect()
}
