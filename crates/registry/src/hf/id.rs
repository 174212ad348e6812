//! What follows `hf:` on the command line: `ORG/REPO`, then optionally `:QUANT` or
//! `/FILE`, as llama.cpp's `-hf` takes it.

use std::fmt;

use crate::error::{RegistryError, Result};

/// The prefix that names a model by its Hugging Face repository.
pub const HF_PREFIX: &str = "hf:";

/// Which files of the repository make the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HfSelector {
    /// The transformers checkpoint if the repository has one, else its one GGUF model,
    /// else its `Q4_K_M` GGUF (llama.cpp's default).
    Auto,
    /// The GGUF model whose file name carries this quantisation (`Q4_K_M`, `q8_0`),
    /// in any case.
    Quant(String),
    /// One file by its path in the repository (a split GGUF's first part brings the rest).
    File(String),
}

/// A model named by Hugging Face id: `hf:ORG/REPO[:QUANT|/FILE]`, on the `main` branch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HfModelId {
    /// `ORG/REPO`.
    pub repo: String,
    pub selector: HfSelector,
}

impl HfModelId {
    /// Parses `hf:ORG/REPO`, `hf:ORG/REPO:QUANT` or `hf:ORG/REPO/FILE`.
    pub fn parse(text: &str) -> Result<Self> {
        let bad = |reason: &str| RegistryError::BadHfId {
            id: text.to_string(),
            reason: reason.to_string(),
        };
        let rest = text
            .strip_prefix(HF_PREFIX)
            .ok_or_else(|| bad("it does not start with hf:"))?;
        let (org, rest) = rest
            .split_once('/')
            .ok_or_else(|| bad("the repository has no organisation or user (ORG/REPO)"))?;
        let (repo, selector) = match rest.split_once('/') {
            Some((repo, file)) => (repo, HfSelector::File(file.to_string())),
            None => match rest.split_once(':') {
                Some((repo, quant)) => (repo, HfSelector::Quant(quant.to_string())),
                None => (rest, HfSelector::Auto),
            },
        };
        for name in [org, repo] {
            if !is_repo_name(name) {
                return Err(bad(&format!(
                    "`{name}` is not a repository name (letters, digits, '-', '_', '.')"
                )));
            }
        }
        match &selector {
            HfSelector::Quant(quant) if quant.is_empty() || quant.contains(['/', ':']) => {
                return Err(bad("the quantisation after ':' is empty or not a name"));
            }
            HfSelector::File(file) if !is_repo_path(file) => {
                return Err(bad("the file after the repository is not a path inside it"));
            }
            _ => {}
        }
        Ok(Self {
            repo: format!("{org}/{repo}"),
            selector,
        })
    }
}

impl fmt::Display for HfModelId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{HF_PREFIX}{}", self.repo)?;
        match &self.selector {
            HfSelector::Auto => Ok(()),
            HfSelector::Quant(quant) => write!(f, ":{quant}"),
            HfSelector::File(file) => write!(f, "/{file}"),
        }
    }
}

/// The hub's rule for user, organisation and repository names.
fn is_repo_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('.')
        && !name.contains("..")
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// A relative path that stays inside a snapshot directory: it becomes a path on disk, so
/// a name from the hub (or the user) must not climb out with `..` or start at `/`.
pub(crate) fn is_repo_path(path: &str) -> bool {
    !path.is_empty()
        && !path.contains('\\')
        && path
            .split('/')
            .all(|part| !part.is_empty() && part != "." && part != "..")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_parse_and_print_back() {
        for (text, repo, selector) in [
            ("hf:Qwen/Qwen3-0.6B", "Qwen/Qwen3-0.6B", HfSelector::Auto),
            (
                "hf:unsloth/Qwen3-8B-GGUF:q4_k_m",
                "unsloth/Qwen3-8B-GGUF",
                HfSelector::Quant("q4_k_m".into()),
            ),
            (
                "hf:org/repo/BF16/model-00001-of-00002.gguf",
                "org/repo",
                HfSelector::File("BF16/model-00001-of-00002.gguf".into()),
            ),
        ] {
            let id = HfModelId::parse(text).unwrap();
            assert_eq!((id.repo.as_str(), &id.selector), (repo, &selector));
            assert_eq!(id.to_string(), text);
        }
    }

    #[test]
    fn malformed_ids_are_refused_with_the_reason() {
        for (text, reason) in [
            ("hf:gpt2", "ORG/REPO"),
            ("hf:org/", "not a repository name"),
            ("hf:../repo", "not a repository name"),
            ("hf:org/re po", "not a repository name"),
            ("hf:org/repo:", "quantisation"),
            ("hf:org/repo/../../etc/passwd", "not a path inside it"),
            ("hf:org/repo/a//b.gguf", "not a path inside it"),
        ] {
            let err = HfModelId::parse(text).unwrap_err().to_string();
            assert!(err.contains(reason) && err.contains(text), "{text}: {err}");
        }
    }
}
