//! OpenAI's Responses endpoints over the engine (see [`crate::responses`]).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::{json, Value};

use super::auth::KeyPriority;
use super::{submit, unix_now, AppState, Submitted};
use crate::error::ApiError;
use crate::responses::reply::{self, ResponseReply};
use crate::responses::request::{parse, ResponsesRequest};

/// The header naming the request's tools of kinds this server does not run.
const SKIPPED_TOOLS_HEADER: &str = "x-pyramid-skipped-tools";

/// `POST /v1/responses`.
pub(super) async fn create(
    State(state): State<Arc<AppState>>,
    Extension(key): Extension<KeyPriority>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let answered = async {
        let task_state = Arc::clone(&state);
        let (submitted, read) = submit(&state, key, &headers, body, move |body| {
            let ResponsesRequest {
                generation,
                conversation,
                echo,
                store,
                skipped_tools,
            } = parse(body, task_state.limits.max_tools, &task_state.responses)?;
            Ok((generation, (conversation, echo, store, skipped_tools)))
        })
        .await?;
        let Submitted {
            request,
            events,
            n_prompt,
            ..
        } = submitted;
        let (conversation, echo, store, skipped_tools) = read;
        let reply = ResponseReply {
            id: format!(
                "resp_{:x}{:016x}",
                state.next_id.fetch_add(1, Ordering::Relaxed),
                crate::api::random_seed()
            ),
            created_at: unix_now(),
            model: state.model_id.clone(),
            echo,
            conversation,
            store: store.then(|| Arc::clone(&state.responses)),
            n_prompt,
            tokenizer: Arc::clone(&state.tokenizer),
        };
        let tools = request.tools.as_ref();
        let mut response = if request.stream {
            reply::stream(reply, tools, request.thinking, events)
        } else {
            reply::collect(reply, tools, request.thinking, events).await?
        };
        if !skipped_tools.is_empty() {
            if let Ok(value) = HeaderValue::from_str(&skipped_tools.join(", ")) {
                response.headers_mut().insert(SKIPPED_TOOLS_HEADER, value);
            }
        }
        Ok::<_, ApiError>(response)
    };
    answered.await.unwrap_or_else(IntoResponse::into_response)
}

/// `GET /v1/responses/{id}`: a kept response as it was returned.
pub(super) async fn retrieve(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let store = Arc::clone(&state.responses);
    let lookup = id.clone();
    let found = tokio::task::spawn_blocking(move || store.get(&lookup))
        .await
        .map_err(|e| ApiError::internal(format!("reading response {id} failed: {e}")))?;
    found
        .map(|stored| Json(stored.response.clone()))
        .ok_or_else(|| ApiError::response_not_found(&id))
}

/// `DELETE /v1/responses/{id}`.
pub(super) async fn delete(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let store = Arc::clone(&state.responses);
    let lookup = id.clone();
    let deleted = tokio::task::spawn_blocking(move || store.delete(&lookup))
        .await
        .map_err(|e| ApiError::internal(format!("deleting response {id} failed: {e}")))?;
    if !deleted {
        return Err(ApiError::response_not_found(&id));
    }
    Ok(Json(
        json!({"id": id, "object": "response", "deleted": true}),
    ))
}
