use std::path::PathBuf;

use crate::GgmlType;

/// Everything that can be wrong with a GGUF file or a request against it.
///
/// Variants carry the offending value so the message alone names the problem.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("cannot open GGUF file {path}: {source}")]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("not a GGUF file: magic bytes are {0:02x?}, expected \"GGUF\"")]
    BadMagic([u8; 4]),
    #[error("unsupported GGUF version {0} (supported: 2, 3)")]
    UnsupportedVersion(u32),
    #[error("GGUF file is truncated: needed {needed} bytes at offset {offset} while reading {what}, file has {len}")]
    Truncated {
        what: &'static str,
        offset: u64,
        needed: u64,
        len: u64,
    },
    #[error("GGUF file is corrupt: {0}")]
    Corrupt(String),
    #[error("unknown GGML tensor type id {id} for tensor '{tensor}'")]
    UnknownTensorType { tensor: String, id: u32 },
    #[error("tensor type {0:?} is not supported")]
    UnsupportedTensorType(GgmlType),
    #[error("tensor '{tensor}' has type {ty}, which pyramid cannot dequantise")]
    UnsupportedTensor { tensor: String, ty: GgmlType },
    #[error("metadata key '{0}' is missing")]
    MissingKey(String),
    #[error("metadata key '{key}' has type {found}, expected {expected}")]
    WrongType {
        key: String,
        expected: &'static str,
        found: &'static str,
    },
    #[error("tensor '{0}' is missing")]
    MissingTensor(String),
    #[error("part {split_idx} of {n_split} of this split model is missing: {path}")]
    MissingSplit {
        path: PathBuf,
        split_idx: usize,
        n_split: usize,
    },
    #[error("{0}")]
    Invalid(String),
    #[error("cannot write GGUF file: {0}")]
    Write(#[from] std::io::Error),
}

pub type Result<T, E = GgufError> = std::result::Result<T, E>;
