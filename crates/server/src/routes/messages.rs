//! Anthropic's Messages endpoints over the engine (see [`crate::anthropic`]); errors are
//! answered in Anthropic's body by the router's last layer.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::{json, Value};

use super::auth::KeyPriority;
use super::prepare::tokenize;
use super::{on_blocking_thread, submit, AppState, Submitted};
use crate::anthropic::reply::{self, MessageReply};
use crate::anthropic::request::{parse, Purpose};
use crate::error::ApiError;

/// `POST /v1/messages`.
pub(super) async fn messages(
    State(state): State<Arc<AppState>>,
    Extension(key): Extension<KeyPriority>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let max_tools = state.limits.max_tools;
    let answered = async {
        let (
            Submitted {
                request,
                events,
                n_prompt,
                ..
            },
            (),
        ) = submit(&state, key, &headers, body, move |body| {
            Ok((parse(body, Purpose::Generate, max_tools)?, ()))
        })
        .await?;
        let reply = MessageReply::new(
            state.model_id.clone(),
            n_prompt,
            request.tools.as_ref(),
            request.thinking,
        );
        if request.stream {
            Ok(reply::stream(reply, events))
        } else {
            reply::collect(reply, events).await
        }
    };
    answered.await.unwrap_or_else(IntoResponse::into_response)
}

/// `POST /v1/messages/count_tokens`: the prompt's tokens as the model's template renders
/// it, tools included.
pub(super) async fn count_tokens(
    State(state): State<Arc<AppState>>,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    // Rendering and tokenising are CPU work: off the async workers, as for generation.
    let n: usize = on_blocking_thread(&state, body, |state, body| {
        let request = parse(body, Purpose::CountTokens, state.limits.max_tools)?;
        if request.model != state.model_id {
            return Err(ApiError::model_not_found(&request.model, &state.model_id));
        }
        let (ids, _) = tokenize(
            state,
            &request.prompt,
            request.tools.as_ref(),
            &request.extensions.template_kwargs,
        )?;
        Ok(ids.len())
    })
    .await?;
    Ok(Json(json!({"input_tokens": n})))
}
