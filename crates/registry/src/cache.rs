//! Where models live on disk, and turning what the user typed into a model file path.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::error::{RegistryError, Result};
use crate::known::{known_names, KnownModel};
use crate::progress::FetchProgress;

/// The local model cache: `<root>/models/<file_name>` per known model, plus `<root>/tmp/` for
/// fetches in flight.
///
/// Invariant: a file at [`path_of`](Self::path_of) is only ever created by an atomic rename of
/// a fully written, checksum-verified download, so readers never see a half-written model.
#[derive(Debug, Clone)]
pub struct ModelCache {
    root: PathBuf,
    python: OsString,
}

impl ModelCache {
    /// A cache rooted at `root`, fetching with `python3` from `PATH`. Reads no environment.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            python: OsString::from("python3"),
        }
    }

    /// The user's cache: `$PYRAMID_HOME`, else `~/.cache/pyramid`; the Python that runs pip is
    /// `$PYRAMID_PYTHON`, else `python3`. The environment is read here and nowhere else.
    pub fn from_env() -> Result<Self> {
        let root = match std::env::var_os("PYRAMID_HOME").filter(|v| !v.is_empty()) {
            Some(home) => PathBuf::from(home),
            None => {
                let home = std::env::var_os("HOME")
                    .filter(|v| !v.is_empty())
                    .ok_or(RegistryError::NoCacheDir)?;
                PathBuf::from(home).join(".cache").join("pyramid")
            }
        };
        let cache = Self::new(root);
        Ok(
            match std::env::var_os("PYRAMID_PYTHON").filter(|v| !v.is_empty()) {
                Some(python) => cache.with_python(python),
                None => cache,
            },
        )
    }

    /// Uses `python` (a name on `PATH` or a path) to run `python -m pip download`.
    pub fn with_python(mut self, python: impl Into<OsString>) -> Self {
        self.python = python.into();
        self
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub(crate) fn python(&self) -> &OsString {
        &self.python
    }

    pub fn models_dir(&self) -> PathBuf {
        self.root.join("models")
    }

    /// Scratch space for fetches; on the cache's file system so wheels never fill a small /tmp.
    pub(crate) fn tmp_dir(&self) -> PathBuf {
        self.root.join("tmp")
    }

    /// Where `model` lives once fetched (whether or not it is there now).
    pub fn path_of(&self, model: &KnownModel) -> PathBuf {
        self.models_dir().join(model.file_name)
    }

    /// Where a fetch leaves `model`'s terms of use (`<file>.terms.<ext>`), if it has any.
    pub fn terms_path(&self, model: &KnownModel) -> Option<PathBuf> {
        let terms = model.terms?;
        let ext = Path::new(terms.wheel.member_path)
            .extension()
            .and_then(|e| e.to_str())
            .unwrap_or("txt");
        Some(
            self.models_dir()
                .join(format!("{}.terms.{ext}", model.file_name)),
        )
    }

    /// True if the model file exists with the expected size. The full hash is checked only when
    /// fetching, so that startup does not read hundreds of megabytes.
    pub fn is_cached(&self, model: &KnownModel) -> bool {
        std::fs::metadata(self.path_of(model))
            .map(|meta| meta.is_file() && meta.len() == model.n_bytes)
            .unwrap_or(false)
    }

    /// Turns a model name or a path into a model file path: an existing file is returned as
    /// is; a known name is fetched first if it is not cached; anything else is an error that
    /// lists the known names.
    pub fn resolve(&self, name_or_path: &str, progress: &dyn FetchProgress) -> Result<PathBuf> {
        let path = Path::new(name_or_path);
        // A Hugging Face model directory; a directory that is not one is passed on too, so
        // the loader can say what it lacks (unless the name is a known model's).
        let model_dir = path.is_dir()
            && (path.join("config.json").is_file() || KnownModel::by_name(name_or_path).is_none());
        if path.is_file() || model_dir {
            return Ok(path.to_path_buf());
        }
        if let Some(model) = KnownModel::by_name(name_or_path) {
            if self.is_cached(model) {
                return Ok(self.path_of(model));
            }
            return self.fetch(model, progress);
        }
        if looks_like_path(name_or_path) {
            return Err(RegistryError::ModelFileNotFound {
                path: path.to_path_buf(),
                known: known_names(),
            });
        }
        Err(RegistryError::UnknownModel {
            name: name_or_path.to_string(),
            known: known_names(),
        })
    }
}

/// Whether the user evidently meant a file, so the error can say "does not exist" rather than
/// "unknown model".
fn looks_like_path(s: &str) -> bool {
    s.contains(std::path::MAIN_SEPARATOR) || s.contains('/') || s.ends_with(".gguf")
}
