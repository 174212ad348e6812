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
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::Sleep;

use crate::routes::{router, AppState};
use crate::ui::WebPage;

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
    /// How long a write to a client may wait for it to read: beyond it the connection
    /// is dropped, and a request it was streaming is aborted.
    pub write_timeout: Duration,
    /// At shutdown, how long running requests may take to finish before they end with
    /// a shutting-down error.
    pub shutdown_grace: Duration,
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
            write_timeout: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(30),
        }
    }
}

/// Serves `state` on `listener` (with the web page at `/` unless `page` is off) until
/// `shutdown` resolves. Then new requests are refused (503) and in-flight ones get
/// [`Limits::shutdown_grace`] to finish (idle connections close at once); `again`
/// resolving (a second signal) cuts the grace short. Requests still running then end
/// with a shutting-down error event, which their connections get a moment to write, and
/// it returns. The engine thread keeps the conversations: the
/// caller shuts it down ([`crate::EngineThread::shutdown`]) to save them.
pub async fn serve(
    listener: TcpListener,
    state: Arc<AppState>,
    page: WebPage,
    shutdown: impl Future<Output = ()> + Send + 'static,
    again: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let limits = state.limits.clone();
    let app = router(Arc::clone(&state));
    // Merged after the API's layers, so the static page needs no key (see `ui`).
    let app = match page {
        WebPage::Served => app.merge(crate::ui::router()),
        WebPage::Off => app,
    };
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
        let io = TokioIo::new(WriteDeadline::new(stream, limits.write_timeout));
        let conn = http.serve_connection(io, TowerToHyperService::new(app.clone()));
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            let _ = conn.await;
            drop(permit);
        });
    }
    drop(listener);
    state.engine.stop_admitting();
    let drained = graceful.shutdown();
    tokio::pin!(drained);
    tokio::pin!(again);
    let finished = tokio::select! {
        () = &mut drained => true,
        () = tokio::time::sleep(limits.shutdown_grace) => false,
        () = &mut again => false,
    };
    if !finished {
        state.engine.end_all();
        // The final events go out to readers that read; a stalled one is not waited for.
        let _ = tokio::time::timeout(FINAL_WRITES, drained).await;
    }
    Ok(())
}

/// How long connections get to write their final events once the grace is over.
const FINAL_WRITES: Duration = Duration::from_secs(2);

/// A connection's socket whose writes fail once one has waited `limit` for the client
/// to read: hyper then drops the connection, the handler's event channel closes, and the
/// engine aborts the request. hyper sets no write timeout of its own, so without this a
/// client that stops reading holds its request (and a shutdown) for ever.
struct WriteDeadline<S> {
    stream: S,
    limit: Duration,
    /// Running while a write waits.
    waiting: Option<Pin<Box<Sleep>>>,
}

impl<S> WriteDeadline<S> {
    fn new(stream: S, limit: Duration) -> Self {
        Self {
            stream,
            limit,
            waiting: None,
        }
    }

    /// `poll` of a write: ready ends the wait; pending past the limit is an error.
    fn deadline<T>(
        &mut self,
        cx: &mut Context<'_>,
        poll: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if poll.is_ready() {
            self.waiting = None;
            return poll;
        }
        let limit = self.limit;
        let timer = self
            .waiting
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client read nothing for {} s", limit.as_secs_f64()),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteDeadline<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteDeadline<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.deadline(cx, poll)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.stream).poll_flush(cx);
        self.deadline(cx, poll)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
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

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_write_the_client_does_not_read_fails_after_the_limit() {
        let (near, mut far) = tokio::io::duplex(64);
        let mut io = WriteDeadline::new(near, Duration::from_secs(30));
        // Read, writes go through whatever their size.
        let reader = tokio::spawn(async move {
            let mut got = vec![0u8; 4096];
            far.read_exact(&mut got).await.unwrap();
            far
        });
        io.write_all(&[7u8; 4096]).await.unwrap();
        let mut far = reader.await.unwrap();
        // Unread, a write waits until the limit, then fails; the time is tokio's paused clock.
        let started = tokio::time::Instant::now();
        let err = io.write_all(&[7u8; 4096]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_secs(30));
        let mut some = [0u8; 8];
        far.read_exact(&mut some).await.unwrap();
    }
}
