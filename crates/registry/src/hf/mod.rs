//! Models by Hugging Face id (`hf:ORG/REPO[:QUANT|/FILE]`), kept in the standard Hugging
//! Face cache so that files other tools downloaded are used here and the other way round.
//!
//! The cache is the hub's own layout under `$HF_HOME/hub` (default
//! `~/.cache/huggingface/hub`): `models--ORG--REPO/blobs/<etag>` holds each file's bytes,
//! `snapshots/<commit>/<path>` links to them, `refs/main` names the commit `main` was at.
//! The protocol and that layout are the `hf-hub` crate's; this module adds what it lacks:
//! choosing the files of a model ([`select`]), answering from the cache with no request,
//! checking every LFS file's SHA-256 and size against the hub's listing, reusing a blob
//! another snapshot already holds, and errors that say what to do.
//!
//! Invariants: a model whose files are all in the snapshot `refs/main` names is resolved
//! without any request, unless one of them is marked unchecked (`<blob>.unverified`,
//! written before a download and removed after its check, so a fetch killed in between
//! checks the file next time); a downloaded file whose size or SHA-256 is not the
//! listing's is removed, blob and link, before the error is returned; a download cut short stays as
//! hf-hub's `blobs/<etag>.part` and the next fetch resumes it with a range request.

mod download;
mod id;
mod select;

use std::path::{Path, PathBuf};

pub use id::{HfModelId, HfSelector, HF_PREFIX};
pub use select::DEFAULT_QUANT;

use crate::error::{RegistryError, Result};
use crate::progress::FetchProgress;

/// The public hub, when `HF_ENDPOINT` does not name another.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// Where models by Hugging Face id come from and are kept.
#[derive(Debug, Clone)]
pub struct HfHub {
    endpoint: String,
    cache_dir: PathBuf,
    token: Option<String>,
    offline: bool,
}

impl HfHub {
    /// A hub at `endpoint` (such as [`DEFAULT_ENDPOINT`]) with its cache at `cache_dir`
    /// (the `hub` directory itself), without a token. Reads no environment.
    pub fn new(endpoint: impl Into<String>, cache_dir: impl Into<PathBuf>) -> Self {
        Self {
            endpoint: endpoint.into().trim_end_matches('/').to_string(),
            cache_dir: cache_dir.into(),
            token: None,
            offline: false,
        }
    }

    /// Sends `token` with every request (private and gated repositories need one).
    pub fn with_token(mut self, token: Option<String>) -> Self {
        self.token = token.filter(|t| !t.is_empty());
        self
    }

    /// Answers from the cache only and never makes a request.
    pub fn with_offline(mut self, offline: bool) -> Self {
        self.offline = offline;
        self
    }

    /// The hub as the Hugging Face tools configure it: `HF_ENDPOINT`; the cache at
    /// `HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`; the token
    /// `HF_TOKEN`, else the file `huggingface-cli login` writes (`HF_TOKEN_PATH`, else
    /// `$HF_HOME/token`); `HF_HUB_OFFLINE=1` for no requests. Read here and nowhere else.
    pub fn from_env() -> Result<Self> {
        let var = |name| std::env::var_os(name).filter(|v| !v.is_empty());
        let hf_home = match var("HF_HOME") {
            Some(home) => PathBuf::from(home),
            None => {
                let cache = match var("XDG_CACHE_HOME") {
                    Some(cache) => PathBuf::from(cache),
                    None => {
                        PathBuf::from(var("HOME").ok_or(RegistryError::NoCacheDir)?).join(".cache")
                    }
                };
                cache.join("huggingface")
            }
        };
        let cache_dir = var("HF_HUB_CACHE").map_or_else(|| hf_home.join("hub"), PathBuf::from);
        let endpoint = std::env::var("HF_ENDPOINT")
            .ok()
            .filter(|e| !e.is_empty())
            .unwrap_or_else(|| DEFAULT_ENDPOINT.to_string());
        let token = std::env::var("HF_TOKEN").ok().or_else(|| {
            let path = var("HF_TOKEN_PATH").map_or_else(|| hf_home.join("token"), PathBuf::from);
            std::fs::read_to_string(path)
                .ok()
                .map(|t| t.trim().to_string())
        });
        let offline = std::env::var("HF_HUB_OFFLINE")
            .is_ok_and(|v| matches!(v.to_ascii_lowercase().as_str(), "1" | "on" | "yes" | "true"));
        Ok(Self::new(endpoint, cache_dir)
            .with_token(token)
            .with_offline(offline))
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    pub fn cache_dir(&self) -> &Path {
        &self.cache_dir
    }

    /// The model's path (a GGUF file, a split model's first part, or a checkpoint
    /// directory) in the cache: from the snapshot `refs/main` names when it holds every
    /// file, with no request; else downloaded from the hub, verified, into the snapshot
    /// of the commit `main` is at.
    pub fn resolve(&self, id: &HfModelId, progress: &dyn FetchProgress) -> Result<PathBuf> {
        if let Some(path) = self.cached(id) {
            return Ok(path);
        }
        if self.offline {
            return Err(RegistryError::HfNotCached {
                id: id.to_string(),
                cache_dir: self.cache_dir.clone(),
            });
        }
        self.download(id, progress)
    }

    /// The model's path if the snapshot `refs/main` names holds all of it. Reads only
    /// the cache.
    pub fn cached(&self, id: &HfModelId) -> Option<PathBuf> {
        let repo_dir = self.repo_dir(&id.repo);
        let commit = std::fs::read_to_string(repo_dir.join("refs").join("main")).ok()?;
        let snapshot = snapshot_dir(&repo_dir, commit.trim())?;
        let files = snapshot_files(&snapshot);
        let plan = select::plan(&files, &id.selector).ok()?;
        let needed = match &plan {
            select::Plan::Gguf { parts } => parts.clone(),
            select::Plan::Checkpoint { files, index } => {
                let mut needed = files.clone();
                if let Some(index) = index {
                    let json = std::fs::read(snapshot.join(index)).ok()?;
                    needed.extend(select::index_shards(&json).ok()?);
                } else if !needed.iter().any(|f| f.ends_with(".safetensors")) {
                    return None;
                }
                // Another tool may have fetched the configuration alone.
                for required in ["config.json", "tokenizer.json"] {
                    if !needed.iter().any(|f| f == required) {
                        return None;
                    }
                }
                needed
            }
        };
        needed
            .iter()
            .all(|f| is_checked_file(&snapshot.join(f)))
            .then(|| model_path(&snapshot, &plan))
    }

    /// `<cache>/models--ORG--REPO`, named as every Hugging Face tool names it.
    fn repo_dir(&self, repo: &str) -> PathBuf {
        self.cache_dir
            .join(hf_hub::Repo::model(repo.to_string()).folder_name())
    }
}

/// Beside a blob while it has not passed its check: a fetch cut between hf-hub linking
/// the file into the snapshot and the SHA-256 check leaves it, so the cache does not
/// serve the file until a fetch checks it.
fn unverified_marker(blob: &Path) -> PathBuf {
    let mut name = blob.as_os_str().to_owned();
    name.push(".unverified");
    PathBuf::from(name)
}

/// A snapshot file that is there and not marked unchecked.
fn is_checked_file(pointer: &Path) -> bool {
    pointer.is_file()
        && std::fs::canonicalize(pointer).is_ok_and(|blob| !unverified_marker(&blob).exists())
}

/// The snapshot of `commit`, if `commit` is a name and not a path.
fn snapshot_dir(repo_dir: &Path, commit: &str) -> Option<PathBuf> {
    let is_name = !commit.is_empty() && commit.bytes().all(|b| b.is_ascii_alphanumeric());
    is_name.then(|| repo_dir.join("snapshots").join(commit))
}

/// Where the model a plan fetched is, within its snapshot.
fn model_path(snapshot: &Path, plan: &select::Plan) -> PathBuf {
    match plan.target() {
        "" => snapshot.to_path_buf(),
        target => snapshot.join(target),
    }
}

/// How deep a snapshot's files are looked for: repositories keep quantisations in
/// subdirectories, rarely deeper.
const MAX_SNAPSHOT_DEPTH: usize = 3;

/// The repository paths of the files a snapshot holds (a link whose blob is gone does
/// not count).
fn snapshot_files(snapshot: &Path) -> Vec<String> {
    fn walk(dir: &Path, prefix: &str, depth: usize, out: &mut Vec<String>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let Some(name) = entry.file_name().to_str().map(str::to_string) else {
                continue;
            };
            let path = entry.path();
            let rel = format!("{prefix}{name}");
            if path.is_dir() && depth < MAX_SNAPSHOT_DEPTH {
                walk(&path, &format!("{rel}/"), depth + 1, out);
            } else if path.is_file() {
                out.push(rel);
            }
        }
    }
    let mut files = Vec::new();
    walk(snapshot, "", 0, &mut files);
    files.sort();
    files
}
