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
    /// What arrives: a reply's [`Event`]s, or several choices' tagged with their index.
    type Input: Send + 'static;
    /// Chunks ready to send, oldest first (the stream's opening chunks before any event).
    fn pending(&mut self) -> &mut Vec<Bytes>;
    /// Queues the chunks for `event` (`None`: the engine thread stopped); true once
    /// the reply has ended.
    fn write(&mut self, event: Option<Self::Input>) -> bool;
}

/// The events of several choices on one channel, each tagged with its index; a choice
/// whose channel closes sends `None` once. Dropping the merged receiver drops every
/// choice's, which cancels them.
pub fn merge_choices(choices: Vec<Receiver<Event>>) -> Receiver<(usize, Option<Event>)> {
    let (tx, merged) = tokio::sync::mpsc::channel(64);
    for (index, mut rx) in choices.into_iter().enumerate() {
        let tx = tx.clone();
        tokio::spawn(async move {
            loop {
                let event = rx.recv().await;
                let closed = event.is_none();
                let ended = matches!(event, Some(Event::Done { .. } | Event::Failed(_)));
                if tx.send((index, event)).await.is_err() || closed || ended {
                    return;
                }
            }
        });
    }
    merged
}

/// The response streaming `writer`'s chunks for the events on `rx`.
pub fn event_stream<W: EventWriter>(writer: W, rx: Receiver<W::Input>) -> Response {
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
