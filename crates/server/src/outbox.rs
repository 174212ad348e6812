//! A request's events on their way from the engine thread to its handler, in a bounded
//! queue.
//!
//! The engine thread must never block on a client, and a client that reads slowly must
//! not make the server hold an event per token for it. So the queue holds at most
//! [`QUEUE_EVENTS`] events; when it is full, new text waits in the outbox merged into one
//! delta (text and log-probabilities appended in order, nothing lost), followed by the
//! final event. What a slow reader costs is then its reply's text, as for a reader that
//! keeps up, and the write timeout drops a reader that stops altogether.

use std::collections::VecDeque;

use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::mpsc::{channel, Receiver, Sender};

use crate::worker::Event;

/// Events queued for one request's handler at most.
pub const QUEUE_EVENTS: usize = 64;

/// The engine thread's end of a request's queue.
pub struct Outbox {
    tx: Sender<Event>,
    /// What did not fit in the queue, oldest first: at most one merged delta, then the
    /// final event.
    held: VecDeque<Event>,
}

/// A request's queue: the outbox the engine thread sends into, and the handler's end.
pub fn outbox() -> (Outbox, Receiver<Event>) {
    let (tx, rx) = channel(QUEUE_EVENTS);
    (
        Outbox {
            tx,
            held: VecDeque::new(),
        },
        rx,
    )
}

impl Outbox {
    /// Queues `event` behind everything sent before it, without waiting.
    pub fn send(&mut self, event: Event) {
        if self.held.is_empty() {
            match self.tx.try_send(event) {
                Ok(()) | Err(TrySendError::Closed(_)) => return,
                Err(TrySendError::Full(event)) => return self.held.push_back(event),
            }
        }
        match (self.held.back_mut(), event) {
            (
                Some(Event::Delta { text, logprobs }),
                Event::Delta {
                    text: more,
                    logprobs: more_logprobs,
                },
            ) => {
                text.push_str(&more);
                logprobs.extend(more_logprobs);
            }
            (_, event) => self.held.push_back(event),
        }
    }

    /// Moves what waits in the outbox into the queue as far as it has room. True when
    /// nothing is left to deliver (all sent, or the handler is gone).
    pub fn flush(&mut self) -> bool {
        while let Some(event) = self.held.pop_front() {
            match self.tx.try_send(event) {
                Ok(()) => {}
                Err(TrySendError::Closed(_)) => self.held.clear(),
                Err(TrySendError::Full(event)) => {
                    self.held.push_front(event);
                    return false;
                }
            }
        }
        true
    }

    /// The handler dropped its end: its client went away.
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::TokenLogprob;
    use pyramid_engine::{FinishReason, Usage};

    fn delta(i: usize) -> Event {
        Event::Delta {
            text: format!("{i} "),
            logprobs: vec![TokenLogprob {
                token: i.to_string(),
                logprob: -(i as f32),
                bytes: Vec::new(),
                top_logprobs: Vec::new(),
            }],
        }
    }

    #[test]
    fn a_reader_that_falls_behind_gets_every_token_in_order_from_a_bounded_queue() {
        let (mut out, mut rx) = outbox();
        for i in 0..1000 {
            out.send(delta(i));
            assert!(rx.len() <= QUEUE_EVENTS);
        }
        out.send(Event::Done {
            finish_reason: FinishReason::Length,
            usage: Usage::default(),
            stop_sequence: None,
            embedding: None,
        });
        assert_eq!(rx.len(), QUEUE_EVENTS);
        assert_eq!(out.held.len(), 2, "one merged delta and the final event");
        let (mut text, mut logprobs, mut done) = (String::new(), Vec::new(), false);
        loop {
            let all_queued = out.flush();
            while let Ok(event) = rx.try_recv() {
                assert!(!done, "nothing follows the final event");
                match event {
                    Event::Delta {
                        text: t,
                        logprobs: l,
                    } => {
                        text.push_str(&t);
                        logprobs.extend(l.into_iter().map(|l| l.token));
                    }
                    Event::Done { .. } => done = true,
                    Event::Failed(e) => panic!("{e:?}"),
                }
            }
            if all_queued {
                break;
            }
        }
        assert!(done);
        let expected: String = (0..1000).map(|i| format!("{i} ")).collect();
        assert_eq!(text, expected);
        let tokens: Vec<String> = (0..1000).map(|i| i.to_string()).collect();
        assert_eq!(logprobs, tokens);
    }

    #[test]
    fn a_closed_queue_takes_nothing_and_leaves_nothing_to_deliver() {
        let (mut out, rx) = outbox();
        for i in 0..QUEUE_EVENTS {
            out.send(delta(i));
        }
        out.send(delta(QUEUE_EVENTS));
        assert!(!out.flush());
        drop(rx);
        assert!(out.is_closed());
        out.send(delta(0));
        assert!(out.flush());
    }
}
