//! One `*.safetensors` file, mapped: its tensor directory (parsed and bounds-checked by
//! the `safetensors` crate) and f32 reads of F32, F16 and BF16 tensors.

use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};

use crate::{ModelError, Result};

/// Where one tensor's bytes are in its file.
#[derive(Debug, Clone)]
pub(super) struct TensorEntry {
    pub dtype: Dtype,
    /// Hugging Face's shape, slowest-varying first.
    pub shape: Vec<usize>,
    /// Absolute byte range in the file.
    start: usize,
    end: usize,
}

impl TensorEntry {
    /// GGML's order of the same dims: fastest-varying first.
    pub fn ggml_dims(&self) -> Vec<u64> {
        self.shape.iter().rev().map(|&d| d as u64).collect()
    }
}

pub(super) struct Shard {
    path: PathBuf,
    map: Mmap,
    entries: Vec<(String, TensorEntry)>,
}

impl Shard {
    pub fn open(path: &Path) -> Result<Shard> {
        let problem = |reason: String| ModelError::Checkpoint {
            path: path.to_path_buf(),
            reason,
        };
        let file = std::fs::File::open(path).map_err(|e| problem(e.to_string()))?;
        // SAFETY: the mapping is read-only and private to this process; a file truncated
        // or rewritten underneath a running model is outside what any mmap reader (this
        // one, GGUF's, llama.cpp's) can defend against.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| problem(e.to_string()))?;
        let (header_len, metadata) = SafeTensors::read_metadata(&map)
            .map_err(|e| problem(format!("not a valid safetensors file: {e}")))?;
        // read_metadata checked that the offsets tile the data after the header exactly.
        let data_start = 8 + header_len;
        let mut entries: Vec<(String, TensorEntry)> = metadata
            .tensors()
            .into_iter()
            .map(|(name, info)| {
                let (s, e) = info.data_offsets;
                let entry = TensorEntry {
                    dtype: info.dtype,
                    shape: info.shape.clone(),
                    start: data_start + s,
                    end: data_start + e,
                };
                (name, entry)
            })
            .collect();
        entries.sort_by_key(|(_, e)| e.start);
        Ok(Shard {
            path: path.to_path_buf(),
            map,
            entries,
        })
    }

    /// Whether [`Shard::read_f32`] reads tensors of `dtype`.
    pub fn readable(dtype: Dtype) -> bool {
        matches!(dtype, Dtype::F32 | Dtype::F16 | Dtype::BF16)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn entries(&self) -> impl Iterator<Item = (&str, &TensorEntry)> {
        self.entries.iter().map(|(n, e)| (n.as_str(), e))
    }

    /// The tensor widened to f32, in the file's (row-major) order.
    pub fn read_f32(&self, entry: &TensorEntry) -> Result<Vec<f32>> {
        let bytes = &self.map[entry.start..entry.end];
        let out = match entry.dtype {
            Dtype::F32 => bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            Dtype::F16 => bytes
                .chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            Dtype::BF16 => bytes
                .chunks_exact(2)
                .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            other => {
                return Err(ModelError::Checkpoint {
                    path: self.path.clone(),
                    reason: format!("a {other:?} tensor: weights load from F32, F16 or BF16"),
                })
            }
        };
        Ok(out)
    }

    /// Gives back the mapped pages of a tensor already read.
    pub fn release(&self, entry: &TensorEntry) {
        // SAFETY: a read-only private file mapping: dropped pages are read from the file
        // again if touched, so no data is lost. Failure only leaves them resident.
        let _ = unsafe {
            self.map.unchecked_advise_range(
                memmap2::UncheckedAdvice::DontNeed,
                entry.start,
                entry.end - entry.start,
            )
        };
    }
}
