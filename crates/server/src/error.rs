//! Every failure a client can see, as OpenAI's error body with the right status.

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// An error answered to the client: `{"error": {"message", "type", "code", "param"}}`.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub code: Option<&'static str>,
    pub param: Option<String>,
    /// Seconds a client should wait before retrying (429 only).
    pub retry_after: Option<u64>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            kind,
            code: None,
            param: None,
            retry_after: None,
        }
    }

    pub fn invalid_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// A parameter with a bad value; `param` names it the way the request spelled it.
    pub fn bad_param(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            param: Some(param.into()),
            code: Some("invalid_value"),
            ..Self::invalid_request(message)
        }
    }

    /// A prompt that, with one generated token, needs `needed` positions of a largest
    /// window of `limit`: OpenAI's code and wording, which clients such as litellm match.
    pub fn context_length_exceeded(param: &str, needed: usize, limit: usize) -> Self {
        Self {
            code: Some("context_length_exceeded"),
            param: Some(param.into()),
            ..Self::invalid_request(format!(
                "This model's maximum context length is {limit} tokens. However, your {} \
                 resulted in {needed} tokens (the prompt and one generated token). Please \
                 reduce the length of the {}.",
                what(param),
                what(param)
            ))
        }
    }

    /// As [`ApiError::context_length_exceeded`] for a prompt whose tokenising stopped
    /// once it passed the limit, so only a lower bound of its length is known.
    pub fn prompt_beyond_context(param: &str, limit: usize) -> Self {
        Self {
            code: Some("context_length_exceeded"),
            param: Some(param.into()),
            ..Self::invalid_request(format!(
                "This model's maximum context length is {limit} tokens. However, your {} \
                 resulted in more than {limit} tokens (with one generated token). Please reduce \
                 the length of the {}.",
                what(param),
                what(param)
            ))
        }
    }

    pub fn model_not_found(model: &str, served: &str) -> Self {
        Self {
            code: Some("model_not_found"),
            param: Some("model".into()),
            ..Self::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                format!("the model '{model}' does not exist; this server serves '{served}'"),
            )
        }
    }

    pub fn unauthorized() -> Self {
        Self {
            code: Some("invalid_api_key"),
            ..Self::new(
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                "a valid API key is required: send 'Authorization: Bearer <key>'",
            )
        }
    }

    pub fn queue_full(retry_after: u64) -> Self {
        Self {
            code: Some("rate_limit_exceeded"),
            retry_after: Some(retry_after),
            ..Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                "the server's request queue is full; retry later",
            )
        }
    }

    pub fn not_found(path: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("no endpoint at '{path}'"),
        )
    }

    /// A stored response that is not (or no longer) kept.
    pub fn response_not_found(id: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("Response with id '{id}' not found."),
        )
    }

    pub fn method_not_allowed() -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            "this endpoint does not accept that HTTP method",
        )
    }

    pub fn body_too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("the request body exceeds the limit of {limit} bytes"),
        )
    }

    pub fn too_many_connections() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "the server has too many open connections: retry shortly",
        )
    }

    pub fn body_timeout(limit: std::time::Duration) -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request_error",
            format!(
                "the request body did not arrive within {} s",
                limit.as_secs_f64()
            ),
        )
    }

    pub fn shutting_down() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "the server is shutting down",
        )
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    pub fn body(&self) -> serde_json::Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "code": self.code,
            "param": self.param,
        }})
    }
}

/// What a request's `param` holds, in OpenAI's context-length wording.
fn what(param: &str) -> &'static str {
    match param {
        "prompt" => "prompt",
        _ => "messages",
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body())).into_response();
        if let Some(secs) = self.retry_after {
            response
                .headers_mut()
                .insert("retry-after", HeaderValue::from(secs));
        }
        response
    }
}
