//! OpenAI's Responses API (`POST /v1/responses`, `GET` and `DELETE /v1/responses/{id}`),
//! for Codex CLI and the OpenAI SDKs' `responses` client: the same engine requests as chat
//! completions, read from the Responses shapes ([`request`], [`items`]) and answered in
//! them ([`reply`]); `previous_response_id` continues a conversation the server kept
//! ([`store`]).

mod items;
pub mod reply;
pub mod request;
pub mod store;

pub use store::ResponseStore;
