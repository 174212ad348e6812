//! The panic boundary around one request's work.
//!
//! Sampling, grammar masks and a grammar's advance run per request, on state the request
//! brought (its sampler settings, its compiled grammar). A defect hit there must fail
//! that request alone: the engine thread carries every other request, and a panic that
//! unwound through it would end them all. [`isolate`] turns such a panic into an
//! [`EngineError::Internal`] for the request whose work it was. What the work left half
//! done belongs to that request only, which ends here.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::EngineError;

/// Runs `work` for one request; a panic in it becomes an error naming `what` failed.
pub(crate) fn isolate<T>(what: &str, work: impl FnOnce() -> T) -> Result<T, EngineError> {
    // Unwind safety: the state `work` reaches is one request's, and the caller fails
    // that request on an error, so nothing reads it half-updated.
    catch_unwind(AssertUnwindSafe(work)).map_err(|payload| {
        EngineError::Internal(format!("{what} failed: {}", panic_message(&*payload)))
    })
}

/// The text a panic carried, when it carried text.
pub fn panic_message(payload: &(dyn Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic without a message")
}

/// A test hook: a panic injected into one request's sampling, on the thread that steps
/// the engine.
#[cfg(test)]
pub(crate) mod inject {
    use std::cell::Cell;

    use crate::RequestId;

    thread_local! {
        static PANIC_SAMPLING: Cell<Option<RequestId>> = const { Cell::new(None) };
    }

    pub(crate) fn panic_when_sampling(id: RequestId) {
        PANIC_SAMPLING.set(Some(id));
    }

    pub(crate) fn check_sampling(id: RequestId) {
        if PANIC_SAMPLING.get() == Some(id) {
            panic!("injected panic while sampling request {id}");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use pyramid_kernels::ThreadPool;

    use super::*;
    use crate::test_harness::{config, engine, Fake};
    use crate::{Arm, Event, FinishReason, Request};

    #[test]
    fn a_panic_in_one_requests_sampling_fails_it_alone() {
        let fake = Fake::new(Duration::ZERO, true);
        let mut engine = engine(&fake, config(Arm::OnDemand, &[64], 16, 4));
        let pool = ThreadPool::new(1).unwrap();
        for id in 0..4u64 {
            let prompt = (1..=5 + id as u32).collect();
            engine.add_request(Request::greedy(id, prompt, 6));
        }
        inject::panic_when_sampling(2);
        let mut events = Vec::new();
        while engine.has_work() {
            events.extend(engine.step(&pool));
        }
        for id in [0, 1, 3] {
            assert!(
                events.iter().any(|e| matches!(e, Event::Finished { id: i, reason: FinishReason::Length, .. } if *i == id)),
                "request {id} did not finish: {events:?}"
            );
        }
        let failure = events.iter().find_map(|e| match e {
            Event::Failed { id: 2, error } => Some(error.to_string()),
            _ => None,
        });
        let failure = failure.expect("request 2 fails");
        assert!(
            failure.starts_with("internal error: sampling failed: injected panic"),
            "{failure}"
        );
        // The engine goes on serving.
        inject::panic_when_sampling(u64::MAX);
        engine.add_request(Request::greedy(9, vec![1, 2, 3], 4));
        let done = engine.generate(&pool, Request::greedy(10, vec![4, 5], 3), &mut |_| true);
        assert_eq!(done.unwrap().tokens.len(), 3);
    }
}
