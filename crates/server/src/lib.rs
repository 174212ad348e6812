//! `pyramid serve`: the OpenAI HTTP API over the engine.
//!
//! - [`api`]: request parsing and validation, every bad value a 400 naming its parameter.
//! - [`scheduler`]: the engine loop; one thread owns the model and runs continuous
//!   batching, chunked prefill, session reuse and window migration.
//! - [`routes`]: axum handlers, server-sent events, authentication.
//! - [`metrics`]: Prometheus text for `/metrics`.
//!
//! Data flow: a handler parses and tokenises the request, checks it against the largest
//! window, and submits a [`scheduler::Job`] with a channel; the engine loop streams
//! [`scheduler::Event`]s back; the handler renders them as one JSON response or as SSE
//! chunks. A client that goes away drops the channel, and the engine cancels the sequence
//! on its next step.

pub mod api;
pub mod error;
pub mod metrics;
pub mod routes;
pub mod scheduler;

use std::future::Future;
use std::sync::Arc;

pub use error::ApiError;
pub use routes::{router, AppState};
pub use scheduler::{Engine, EngineConfig};

/// Request bodies beyond this are refused with 413.
pub const DEFAULT_BODY_LIMIT: usize = 16 << 20;

/// Serves `state` on `listener` until `shutdown` resolves, then lets in-flight responses
/// finish and stops the engine.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await
}

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
