//! Accepting connections with limits: how long a client may take to send its headers and
//! its body, and how many connections are open at once.
//!
//! `axum::serve` sets no timer, so hyper's header timeout never fires and a client sending
//! one header byte a second (or nothing after connecting) holds its socket forever; enough
//! of them exhaust the descriptors and every other client times out. Here each connection
//! is served by hyper directly with a timer. hyper starts the header timeout whenever a
//! connection waits for a request, on connect and again after each response, so the same
//! limit closes idle keep-alive connections. Bodies are read under their own deadline in
//! [`crate::routes`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use crate::routes::{router, AppState};

/// What a connection may take; defaults suit a local server with a few clients.
#[derive(Debug, Clone)]
pub struct Limits {
    /// From connecting (or the end of the last response) to the end of a request's
    /// headers: closes slow-header clients and idle keep-alive connections alike.
    pub header_timeout: Duration,
    /// Reading a request's whole body.
    pub body_timeout: Duration,
    /// Open connections; one more is answered 503 and closed, the others unaffected.
    pub max_connections: usize,
    /// Request bodies beyond this are refused with 413.
    pub body_limit: usize,
    /// Prompts tokenised at once; others wait their turn (tokenising is CPU work).
    pub max_tokenizing: usize,
    /// Tools a chat request may define; more is a 400.
    pub max_tools: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            max_connections: 256,
            body_limit: 16 << 20,
            max_tokenizing: 2,
            max_tools: crate::api::DEFAULT_MAX_TOOLS,
        }
    }
}

/// Serves `state` on `listener` until `shutdown` resolves, then lets in-flight responses
/// finish (idle connections close at once) and returns.
pub async fn serve(
    listener: TcpListener,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let limits = state.limits.clone();
    let app = router(state);
    let open = Arc::new(Semaphore::new(limits.max_connections));
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                // Out of descriptors or a connection reset before accept: keep serving.
                Err(err) => {
                    tracing::warn!("accept failed: {err}");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Ok(permit) = Arc::clone(&open).try_acquire_owned() else {
            tokio::spawn(refuse(stream));
            continue;
        };
        let mut http = hyper::server::conn::http1::Builder::new();
        http.timer(TokioTimer::new())
            .header_read_timeout(limits.header_timeout);
        let conn =
            http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app.clone()));
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            let _ = conn.await;
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// The answer to a connection beyond the limit: 503 with a JSON error, then close.
async fn refuse(mut stream: TcpStream) {
    let body = crate::ApiError::too_many_connections().body().to_string();
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\nretry-after: 1\r\n\r\n{body}",
        body.len()
    );
    let write = async {
        stream.write_all(response.as_bytes()).await?;
        stream.shutdown().await
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), write).await;
}
