//! Models split over several GGUF files, as llama.cpp's `gguf-split` and the `gguf`
//! Python package write them (Hugging Face caps files at 50 GB, so large models ship so).
//!
//! Part `k` of `n` (1-based) is named `PREFIX-0000k-of-0000n.gguf`. Every part is a whole
//! GGUF file with its own header and data section, and holds some of the tensors; every
//! part carries `split.no` (0-based), `split.count` and `split.tensors.count`, and only the
//! first carries the model's other metadata. [`GgufFile::open`](crate::GgufFile::open) on
//! the first part opens the others from beside it, so the rest of the engine sees one file.

use std::path::Path;

use crate::metadata::Metadata;
use crate::reader::{GgufFile, Parsed};
use crate::{GgufError, Result};

pub const KEY_SPLIT_NO: &str = "split.no";
pub const KEY_SPLIT_COUNT: &str = "split.count";
pub const KEY_SPLIT_TENSORS_COUNT: &str = "split.tensors.count";

/// The file name of part `split_idx` (0-based) of `n_split`, as llama.cpp's
/// `llama_split_path` writes it: `PREFIX-00001-of-00003.gguf` for the first of three.
pub fn split_file_name(prefix: &str, split_idx: usize, n_split: usize) -> String {
    format!("{prefix}-{:05}-of-{n_split:05}.gguf", split_idx + 1)
}

/// The prefix, part index (0-based) and part count a split file's name says, or `None`
/// for a name that is not a split part's.
pub fn parse_split_file_name(file_name: &str) -> Option<(&str, usize, usize)> {
    let stem = file_name.strip_suffix(".gguf")?;
    let (rest, n_split) = stem.rsplit_once("-of-")?;
    let (prefix, no) = rest.rsplit_once('-')?;
    let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(no) || !digits(n_split) {
        return None;
    }
    let (no, n_split): (usize, usize) = (no.parse().ok()?, n_split.parse().ok()?);
    (1..=n_split)
        .contains(&no)
        .then(|| (prefix, no - 1, n_split))
}

/// `split.count` when the file has one.
pub(crate) fn n_split(metadata: &Metadata) -> Result<Option<usize>> {
    metadata.opt(KEY_SPLIT_COUNT, Metadata::get_usize)
}

/// Opens parts 2..=n of the model whose first part, at `first_path`, is `first`, and joins
/// them into one file.
pub(crate) fn open_rest(first_path: &Path, first: Parsed, n_split: usize) -> Result<GgufFile> {
    let split_no = first.header.metadata.get_usize(KEY_SPLIT_NO)?;
    let file_name = first_path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    let Some((prefix, _, _)) = parse_split_file_name(file_name) else {
        return Err(GgufError::Invalid(format!(
            "{} is part {} of a split model but is not named like one \
             (PREFIX-{:05}-of-{n_split:05}.gguf), so its other parts cannot be found",
            first_path.display(),
            split_no + 1,
            split_no + 1
        )));
    };
    let path_of = |idx| first_path.with_file_name(split_file_name(prefix, idx, n_split));
    if split_no != 0 {
        return Err(GgufError::Invalid(format!(
            "{} is part {} of {n_split} of a split model: open its first part, {}",
            first_path.display(),
            split_no + 1,
            path_of(0).display()
        )));
    }
    let n_tensors = first
        .header
        .metadata
        .opt(KEY_SPLIT_TENSORS_COUNT, Metadata::get_usize)?;

    let mut paths = vec![first_path.to_path_buf()];
    let mut parts = vec![first.part];
    let mut header = first.header;
    for split_idx in 1..n_split {
        let path = path_of(split_idx);
        if !path.is_file() {
            return Err(GgufError::MissingSplit {
                path,
                split_idx: split_idx + 1,
                n_split,
            });
        }
        let parsed = Parsed::map(&path)?;
        check_part(&path, &parsed.header.metadata, split_idx, n_split)?;
        header
            .tensors
            .extend(parsed.header.tensors.into_iter().map(|mut t| {
                t.split_idx = split_idx;
                t
            }));
        parts.push(parsed.part);
        paths.push(path);
    }
    if let Some(n_tensors) = n_tensors.filter(|&n| n != header.tensors.len()) {
        return Err(GgufError::Corrupt(format!(
            "split model {} says it has {n_tensors} tensors, its {n_split} parts hold {}",
            first_path.display(),
            header.tensors.len()
        )));
    }
    GgufFile::join(parts, paths, header)
}

/// A part must say it is the part its name says, of the same model size.
fn check_part(path: &Path, metadata: &Metadata, split_idx: usize, n_split: usize) -> Result<()> {
    let no = metadata.get_usize(KEY_SPLIT_NO)?;
    let count = metadata.get_usize(KEY_SPLIT_COUNT)?;
    if no != split_idx || count != n_split {
        return Err(GgufError::Corrupt(format!(
            "{} says it is part {} of {count}, expected part {} of {n_split}",
            path.display(),
            no + 1,
            split_idx + 1
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_others_are_not_splits() {
        let name = split_file_name("Qwen3-8B-Q4_K_M", 1, 3);
        assert_eq!(name, "Qwen3-8B-Q4_K_M-00002-of-00003.gguf");
        assert_eq!(
            parse_split_file_name(&name),
            Some(("Qwen3-8B-Q4_K_M", 1, 3))
        );
        for other in [
            "model.gguf",
            "model-00004-of-00003.gguf",
            "model-00000-of-00003.gguf",
            "model-1-of-3.gguf",
            "model-00001-of-00003.safetensors",
        ] {
            assert_eq!(parse_split_file_name(other), None, "{other}");
        }
    }
}
