//! Fetching a model's files from the hub into the cache: the listing (which files, their
//! sizes and LFS SHA-256s, at which commit), then each missing file through `hf-hub`
//! (which resumes a `.part` file with a range request), then the check of its bytes.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use hf_hub::api::sync::{Api, ApiBuilder, ApiError, ApiRepo};
use hf_hub::{Cache, Repo};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::select::{self, Plan};
use super::{model_path, snapshot_dir, HfHub, HfModelId};
use crate::error::{io_err, RegistryError, Result};
use crate::fetch::hex;
use crate::progress::{FetchProgress, NoProgress};

/// `GET /api/models/{repo}/revision/main?blobs=true`: the commit and its files.
#[derive(Debug, Deserialize)]
struct Listing {
    sha: String,
    siblings: Vec<Sibling>,
}

#[derive(Debug, Deserialize)]
struct Sibling {
    rfilename: String,
    size: Option<u64>,
    lfs: Option<Lfs>,
}

/// A file kept in Git LFS; its SHA-256 is the content's, and its blob's name.
#[derive(Debug, Deserialize)]
struct Lfs {
    sha256: String,
}

/// The bytes hf-hub reports, passed on to the one bar of the whole fetch.
struct Advance<'a>(&'a dyn FetchProgress);

impl hf_hub::api::Progress for Advance<'_> {
    fn init(&mut self, _size: usize, _filename: &str) {}
    fn update(&mut self, size: usize) {
        self.0.advance(size as u64);
    }
    fn finish(&mut self) {}
}

/// One fetch: the hub, the repository at the listing's commit, and its snapshot.
struct Fetch<'a> {
    hub: &'a HfHub,
    id: &'a HfModelId,
    api: ApiRepo,
    listing: Listing,
    repo_dir: PathBuf,
    snapshot: PathBuf,
}

impl HfHub {
    /// Lists the repository, chooses the model's files and fetches those the snapshot of
    /// `main`'s commit lacks.
    pub(super) fn download(&self, id: &HfModelId, progress: &dyn FetchProgress) -> Result<PathBuf> {
        let api = self.api()?.repo(Repo::model(id.repo.clone()));
        let listing = self.listing(&api, &id.repo)?;
        let files: Vec<String> = listing
            .siblings
            .iter()
            .map(|s| s.rfilename.clone())
            .filter(|f| super::id::is_repo_path(f))
            .collect();
        let plan =
            select::plan(&files, &id.selector).map_err(|reason| RegistryError::HfNoModel {
                repo: id.repo.clone(),
                reason,
            })?;
        let repo_dir = self.repo_dir(&id.repo);
        let snapshot = snapshot_dir(&repo_dir, &listing.sha).ok_or_else(|| {
            self.hub_error(id, format!("the listing names commit {:?}", listing.sha))
        })?;
        let fetch = Fetch {
            hub: self,
            id,
            api,
            listing,
            repo_dir,
            snapshot,
        };
        let files = match &plan {
            Plan::Gguf { parts } => parts.clone(),
            Plan::Checkpoint { files, index } => {
                let mut all = files.clone();
                if let Some(index) = index {
                    // Small, and it says which shards to fetch: fetched before the bar.
                    let path = fetch.get(index, &NoProgress)?;
                    let json = std::fs::read(&path).map_err(io_err("read", &path))?;
                    let shards =
                        select::index_shards(&json).map_err(|reason| RegistryError::HfNoModel {
                            repo: id.repo.clone(),
                            reason: format!("{index} {reason}"),
                        })?;
                    all.extend(shards);
                }
                all
            }
        };
        fetch.all(&files, progress)?;
        fetch.point_main()?;
        Ok(model_path(&fetch.snapshot, &plan))
    }

    fn api(&self) -> Result<Api> {
        ApiBuilder::from_cache(Cache::new(self.cache_dir.clone()))
            .with_endpoint(self.endpoint.clone())
            .with_token(self.token.clone())
            .with_progress(false)
            .with_user_agent("pyramid", env!("CARGO_PKG_VERSION"))
            .build()
            .map_err(|e| RegistryError::HfHub {
                repo: String::new(),
                endpoint: self.endpoint.clone(),
                reason: e.to_string(),
            })
    }

    fn listing(&self, api: &ApiRepo, repo: &str) -> Result<Listing> {
        let response = api
            .info_request()
            .query("blobs", "true")
            .call()
            .map_err(|e| self.request_error(repo, e))?;
        serde_json::from_reader(response.into_reader()).map_err(|e| RegistryError::HfHub {
            repo: repo.to_string(),
            endpoint: self.endpoint.clone(),
            reason: format!("its listing is not what the hub sends: {e}"),
        })
    }

    /// What a failed request means to the user: no such model, a token to set, no
    /// network.
    fn request_error(&self, repo: &str, err: ureq::Error) -> RegistryError {
        let repo = repo.to_string();
        let endpoint = self.endpoint.clone();
        let has_token = self.token.is_some();
        match err {
            // Without a token the hub answers 401 for private, gated and missing
            // repositories alike.
            ureq::Error::Status(404, _) | ureq::Error::Status(401, _) if !has_token => {
                RegistryError::HfRepoNotFound {
                    repo,
                    endpoint,
                    hint: " (if it is private or gated, set HF_TOKEN to a token that may read it)",
                }
            }
            ureq::Error::Status(404, _) => RegistryError::HfRepoNotFound {
                repo,
                endpoint,
                hint: "",
            },
            ureq::Error::Status(401, _) => RegistryError::HfUnauthorized {
                repo,
                endpoint,
                hint: ": the token in HF_TOKEN was not accepted",
            },
            ureq::Error::Status(403, _) => RegistryError::HfUnauthorized {
                repo,
                endpoint,
                hint: if has_token {
                    ": if it is gated, accept its terms on its page with the account of HF_TOKEN"
                } else {
                    ": set HF_TOKEN to a token that may read it"
                },
            },
            ureq::Error::Status(code, response) => RegistryError::HfHub {
                repo,
                endpoint,
                reason: format!(
                    "HTTP {code} {} from {}",
                    response.status_text(),
                    response.get_url()
                ),
            },
            ureq::Error::Transport(transport) => RegistryError::HfUnreachable {
                endpoint,
                reason: transport.to_string(),
            },
        }
    }

    fn hub_error(&self, id: &HfModelId, reason: String) -> RegistryError {
        RegistryError::HfHub {
            repo: id.repo.clone(),
            endpoint: self.endpoint.clone(),
            reason,
        }
    }
}

impl Fetch<'_> {
    /// Fetches every file the snapshot lacks, on one bar of their total size.
    fn all(&self, files: &[String], progress: &dyn FetchProgress) -> Result<()> {
        let missing: Vec<&String> = files
            .iter()
            .filter(|f| !super::is_checked_file(&self.snapshot.join(f)))
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let n_bytes = missing
            .iter()
            .filter_map(|f| self.sibling(f).and_then(|s| s.size))
            .sum();
        progress.start(&self.id.to_string(), n_bytes);
        let result = missing.iter().try_for_each(|file| {
            progress.message(&format!("downloading {file}"));
            self.get(file, progress).map(|_| ())
        });
        progress.finish();
        result
    }

    /// One file into the snapshot: linked to a blob already in the cache, else
    /// downloaded; either way checked against the listing.
    fn get(&self, file: &str, progress: &dyn FetchProgress) -> Result<PathBuf> {
        let pointer = self.snapshot.join(file);
        let marker = self.unverified_marker(file);
        if pointer.is_file() {
            // A fetch was cut between hf-hub linking the file and its check: check it now.
            if let Some(marker) = marker.as_ref().filter(|m| m.exists()) {
                let verified = self.verify(file, &pointer);
                let _ = std::fs::remove_file(marker);
                verified?;
            }
            return Ok(pointer);
        }
        if self.link_cached_blob(file, &pointer)? {
            progress.advance(self.sibling(file).and_then(|s| s.size).unwrap_or(0));
            return Ok(pointer);
        }
        if let Some(marker) = &marker {
            // hf-hub links the file before it can be checked: until the check passes, the
            // marker keeps the cache from serving it.
            std::fs::create_dir_all(self.repo_dir.join("blobs"))
                .and_then(|()| std::fs::File::create(marker).map(drop))
                .map_err(io_err("write", marker))?;
        }
        let got = self
            .api
            .download_with_progress(file, Advance(progress))
            .map_err(|e| self.api_error(file, e))?;
        if got != pointer {
            // `main` moved between the listing and the download: the files would be of
            // two commits.
            let _ = std::fs::remove_file(&got);
            return Err(self.hub.hub_error(
                self.id,
                format!(
                    "the repository changed while it was being fetched ({file} came from \
                     another commit than {}); fetch it again",
                    self.listing.sha
                ),
            ));
        }
        let verified = self.verify(file, &pointer);
        if let Some(marker) = &marker {
            let _ = std::fs::remove_file(marker);
        }
        verified.map(|()| pointer)
    }

    /// Where an LFS file's blob (named by its SHA-256, as hf-hub names it by the ETag the
    /// hub gives) is marked unchecked; `None` for a small file kept in Git, which is
    /// checked by size only.
    fn unverified_marker(&self, file: &str) -> Option<PathBuf> {
        let sha256 = &self.sibling(file)?.lfs.as_ref()?.sha256;
        let blob = self.repo_dir.join("blobs").join(sha256);
        (!sha256.contains(['/', '.'])).then(|| super::unverified_marker(&blob))
    }

    /// Links `file` to `blobs/<sha256>` when another snapshot already brought those
    /// bytes; a blob that fails the check is removed and the file downloaded instead.
    fn link_cached_blob(&self, file: &str, pointer: &Path) -> Result<bool> {
        let Some(sha256) = self
            .sibling(file)
            .and_then(|s| s.lfs.as_ref())
            .map(|l| &l.sha256)
        else {
            return Ok(false);
        };
        let blob = self.repo_dir.join("blobs").join(sha256);
        if !blob.is_file() || sha256.contains(['/', '.']) {
            return Ok(false);
        }
        let checked = self.check(file, &blob);
        // Checked now, whatever a cut fetch left marked.
        let _ = std::fs::remove_file(super::unverified_marker(&blob));
        if checked.is_err() {
            let _ = std::fs::remove_file(&blob);
            return Ok(false);
        }
        let dir = pointer.parent().expect("a snapshot file has a directory");
        std::fs::create_dir_all(dir).map_err(io_err("create directory", dir))?;
        // Relative, as every Hugging Face tool links, so the cache can move.
        let up = "../".repeat(2 + file.matches('/').count());
        symlink(Path::new(&format!("{up}blobs/{sha256}")), pointer)
            .map_err(io_err("link", pointer))?;
        Ok(true)
    }

    /// Checks a downloaded file; on a mismatch removes its link and blob, so neither a
    /// later load nor a later fetch takes it for the model.
    fn verify(&self, file: &str, pointer: &Path) -> Result<()> {
        let blob = std::fs::canonicalize(pointer).map_err(io_err("read", pointer))?;
        let checked = self.check(file, &blob);
        if checked.is_err() {
            let _ = std::fs::remove_file(pointer);
            let _ = std::fs::remove_file(&blob);
        }
        checked
    }

    /// The file's size and, for an LFS file, its SHA-256 against the listing.
    fn check(&self, file: &str, path: &Path) -> Result<()> {
        let Some(sibling) = self.sibling(file) else {
            return Ok(());
        };
        let model = format!("{}/{file}", self.id.repo);
        let (n_bytes, sha256) = digest(path).map_err(io_err("read", path))?;
        if let Some(expected) = sibling.size.filter(|&s| s != n_bytes) {
            return Err(RegistryError::SizeMismatch {
                model,
                expected,
                actual: n_bytes,
            });
        }
        match &sibling.lfs {
            Some(lfs) if !lfs.sha256.eq_ignore_ascii_case(&sha256) => {
                Err(RegistryError::ChecksumMismatch {
                    model,
                    expected: lfs.sha256.clone(),
                    actual: sha256,
                })
            }
            _ => Ok(()),
        }
    }

    /// Points `refs/main` at the listing's commit (downloads already did, unless every
    /// file was linked from blobs in the cache).
    fn point_main(&self) -> Result<()> {
        let cache = Cache::new(self.hub.cache_dir.clone());
        cache
            .repo(Repo::model(self.id.repo.clone()))
            .create_ref(&self.listing.sha)
            .map_err(io_err("write", self.repo_dir.join("refs").join("main")))
    }

    fn sibling(&self, file: &str) -> Option<&Sibling> {
        self.listing.siblings.iter().find(|s| s.rfilename == file)
    }

    fn api_error(&self, file: &str, err: ApiError) -> RegistryError {
        match err {
            ApiError::RequestError(err) => self.hub.request_error(&self.id.repo, *err),
            ApiError::IoError(source) => RegistryError::Io {
                action: "download",
                path: self.snapshot.join(file),
                source,
            },
            ApiError::LockAcquisition(path) => RegistryError::HfBusy { path },
            other => self.hub.hub_error(self.id, format!("{file}: {other}")),
        }
    }
}

/// The size and lowercase hex SHA-256 of a file's bytes.
fn digest(path: &Path) -> std::io::Result<(u64, String)> {
    let mut file = File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut n_bytes = 0u64;
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        n_bytes += n as u64;
    }
    Ok((n_bytes, hex(&hasher.finalize())))
}

#[cfg(unix)]
fn symlink(target: &Path, link: &Path) -> std::io::Result<()> {
    std::os::unix::fs::symlink(target, link)
}

/// Where links need privileges, the blob is copied, as `huggingface_hub` does there.
#[cfg(not(unix))]
fn symlink(target: &Path, link: &Path) -> std::io::Result<()> {
    let blob = link
        .parent()
        .map_or_else(|| target.to_path_buf(), |d| d.join(target));
    std::fs::copy(blob, link).map(|_| ())
}
