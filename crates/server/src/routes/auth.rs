//! Who may call: API keys from `Authorization: Bearer`, and the priority a key gives.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

use super::AppState;
use crate::error::ApiError;

/// An API key the server accepts, and the priority its requests take: the priority of
/// a request naming none, and the most urgent one a request may ask for (a request may
/// ask to be less urgent than its key, never more).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKey {
    pub key: String,
    pub priority: Option<i32>,
}

/// The accepted keys, kept as SHA-256 digests so that checking one takes the same time
/// whatever the key given, and however much of it matches.
#[derive(Default)]
pub(super) struct Keys(Vec<([u8; 32], Option<i32>)>);

impl Keys {
    pub(super) fn new(keys: &[ApiKey]) -> Self {
        Self(
            keys.iter()
                .map(|k| (Sha256::digest(k.key.as_bytes()).into(), k.priority))
                .collect(),
        )
    }

    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The key's priority if `given` is an accepted key (`Some(None)`: a key without
    /// one). Every key is compared in full, whichever matches.
    pub(super) fn check(&self, given: &str) -> Option<Option<i32>> {
        let digest: [u8; 32] = Sha256::digest(given.as_bytes()).into();
        let mut found = None;
        for (key, priority) in &self.0 {
            let differing = key
                .iter()
                .zip(&digest)
                .fold(0u8, |acc, (a, b)| acc | (a ^ b));
            if std::hint::black_box(differing) == 0 {
                found = Some(*priority);
            }
        }
        found
    }
}

/// The priority the request's API key gives, put in the request's extensions by
/// [`authenticate`].
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct KeyPriority(pub(super) Option<i32>);

impl KeyPriority {
    /// The priority a request runs at, given the one it asks for (body or header): the
    /// key's when it asks none, and never more urgent (lower) than the key's.
    pub(super) fn apply(self, asked: Option<i32>) -> i32 {
        match (asked, self.0) {
            (Some(asked), Some(floor)) => asked.max(floor),
            (Some(asked), None) => asked,
            (None, key) => key.unwrap_or(0),
        }
    }
}

/// The header Anthropic's clients send their key in.
const ANTHROPIC_KEY_HEADER: &str = "x-api-key";

/// With API keys set, every endpoint but `/health` (for load balancers and supervisors)
/// needs `Authorization: Bearer <key>` with one of them (the scheme is case-insensitive,
/// RFC 7235) or, as Anthropic's clients send it, `x-api-key: <key>`. The key's priority
/// goes to the handler.
pub(super) async fn authenticate(
    State(state): State<Arc<AppState>>,
    mut req: Request,
    next: Next,
) -> Response {
    let mut priority = KeyPriority::default();
    if !state.keys.is_empty() {
        let bearer = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                let (scheme, token) = v.split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
            });
        let given = bearer.or_else(|| {
            req.headers()
                .get(ANTHROPIC_KEY_HEADER)
                .and_then(|v| v.to_str().ok())
                .map(str::trim)
        });
        match given.and_then(|g| state.keys.check(g)) {
            Some(key) => priority = KeyPriority(key),
            None if req.uri().path() != "/health" => {
                return ApiError::unauthorized().into_response()
            }
            None => {}
        }
    }
    req.extensions_mut().insert(priority);
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_found_by_its_digest_and_its_priority_is_a_floor() {
        let keys = Keys::new(&[
            ApiKey {
                key: "alpha".into(),
                priority: None,
            },
            ApiKey {
                key: "batch".into(),
                priority: Some(10),
            },
        ]);
        assert_eq!(keys.check("alpha"), Some(None));
        assert_eq!(keys.check("batch"), Some(Some(10)));
        assert_eq!(keys.check("batc"), None);
        assert_eq!(keys.check("batchh"), None);
        assert_eq!(keys.check(""), None);
        // A request may ask to be less urgent than its key, never more.
        let batch = KeyPriority(Some(10));
        assert_eq!(batch.apply(None), 10);
        assert_eq!(batch.apply(Some(20)), 20);
        assert_eq!(batch.apply(Some(-5)), 10);
        assert_eq!(KeyPriority(None).apply(Some(-5)), -5);
        assert_eq!(KeyPriority(None).apply(None), 0);
    }
}
