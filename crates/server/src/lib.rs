//! `pyramid serve`: the OpenAI HTTP API over the engine.
//!
//! - [`api`]: request parsing and validation, every bad value a 400 naming its parameter;
//!   [`extensions`]: the fields local servers accept beyond OpenAI's.
//! - [`worker`]: the engine thread; it owns the engine core (`pyramid_engine::Engine`:
//!   continuous batching, chunked prefill, session reuse, the window pyramid on any
//!   device route) and turns its tokens into text: detokenisation, stop strings,
//!   log-probabilities.
//! - [`routes`]: axum handlers, server-sent events, authentication.
//! - [`anthropic`]: Anthropic's Messages API in the same engine requests as chat.
//! - [`responses`]: OpenAI's Responses API likewise, with the responses it keeps.
//! - [`tools`]: tool calls read from replies and constrained by grammars;
//!   [`reasoning`]: thinking models' thoughts kept apart from their answers.
//! - [`listen`]: the accept loop with header and body timeouts and a connection limit.
//! - `stop`: stop strings matched across token boundaries, on the engine thread's text.
//! - [`outbox`]: each request's bounded event queue, merging text a slow reader has not
//!   taken yet.
//! - [`metrics`]: Prometheus text for `/metrics`.
//! - [`engine_view`]: the engine's sessions, ladder and timeline for
//!   `/v1/engine/snapshot` and `/v1/engine/events`, published by the engine thread.
//! - [`ui`]: the web page at `/` (chat and engine view), embedded in the binary.
//!
//! Data flow: a handler parses and tokenises the request, checks it against the largest
//! window, and submits a [`worker::Job`] with a channel; the engine thread streams
//! [`worker::Event`]s back; the handler renders them as one JSON response or as SSE
//! chunks. A client that goes away drops the channel, and the engine cancels the sequence
//! on its next step.

pub mod anthropic;
pub mod api;
pub mod embeddings;
pub mod engine_view;
pub mod error;
pub mod extensions;
pub mod listen;
pub mod metrics;
pub mod outbox;
pub mod reasoning;
pub mod responses;
pub mod routes;
mod sse;
mod stop;
#[cfg(test)]
mod test_vocab;
pub mod tools;
pub mod ui;
pub mod worker;

pub use error::ApiError;
pub use listen::{serve, Limits};
pub use routes::{router, ApiKey, AppState, EmbeddingSetup};
pub use worker::EngineThread;

/// Resolves on SIGINT (Ctrl-C) or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
}
