//! Anthropic's Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`), for
//! Claude Code and the Anthropic SDKs: the same engine requests as chat completions,
//! read from Anthropic's shapes ([`request`]) and answered in them ([`reply`]), errors
//! in Anthropic's body (`{"type": "error", "error": {"type", "message"}}`).

mod options;
pub mod reply;
pub mod request;

use axum::body::Body;
use axum::http::{header, StatusCode};
use axum::response::Response;
use serde_json::{json, Value};

use crate::error::ApiError;

/// Anthropic's error type for a status.
fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 | 405 | 408 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        _ => "api_error",
    }
}

/// An error in Anthropic's body.
pub fn error_body(err: &ApiError) -> Value {
    json!({"type": "error", "error": {"type": error_type(err.status), "message": err.message}})
}

/// Rewrites an error answered in OpenAI's body (by a handler, the authentication or the
/// limits, which all speak it) into Anthropic's, keeping its status and headers.
pub async fn restyle_error(response: Response) -> Response {
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    // Error bodies are a few hundred bytes; anything larger is passed on as it was.
    let Ok(bytes) = axum::body::to_bytes(body, 64 << 10).await else {
        return Response::from_parts(parts, Body::empty());
    };
    let message = serde_json::from_slice::<Value>(&bytes)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_string));
    let Some(message) = message else {
        return Response::from_parts(parts, Body::from(bytes));
    };
    let body = json!({"type": "error", "error": {"type": error_type(status), "message": message}});
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(body.to_string()))
}
