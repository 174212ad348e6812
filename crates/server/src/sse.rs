//! Server-sent events from a request's engine events: the one pump both protocols'
//! streams run on. Dropping the body (the client went away) drops the receiver, which
//! the engine thread sees as a cancellation.

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use futures_util::stream;
use tokio::sync::mpsc::Receiver;

use crate::worker::Event;

/// Turns engine events into a protocol's chunks.
pub trait EventWriter: Send + 'static {
    /// Chunks ready to send, oldest first (the stream's opening chunks before any event).
    fn pending(&mut self) -> &mut Vec<Bytes>;
    /// Queues the chunks for `event` (`None`: the engine thread stopped); true once
    /// the reply has ended.
    fn write(&mut self, event: Option<Event>) -> bool;
}

/// The response streaming `writer`'s chunks for the events on `rx`.
pub fn event_stream(writer: impl EventWriter, rx: Receiver<Event>) -> Response {
    let body = stream::unfold(
        (writer, rx, false),
        |(mut w, mut rx, mut done)| async move {
            loop {
                if !w.pending().is_empty() {
                    let next = w.pending().remove(0);
                    return Some((Ok::<_, std::convert::Infallible>(next), (w, rx, done)));
                }
                if done {
                    return None;
                }
                done = w.write(rx.recv().await);
            }
        },
    );
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(body),
    )
        .into_response()
}
