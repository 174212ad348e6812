//! A directory of session files, indexed by their tokens, under a disk budget.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use pyramid_model::KvCache;

use super::file::{
    file_name, io_error, is_temp_name, load_session, read_header, save_session, SessionIdentity,
    StoreError, StoredSession, SESSION_EXT,
};
use crate::prefix_cache::common_prefix;

pub(super) struct Entry {
    pub(super) path: PathBuf,
    tokens: Vec<u32>,
    window: usize,
    bytes: u64,
    /// Larger is more recent (saved or loaded): the budget evicts the smallest.
    last_used: u64,
}

/// What [`SessionStore::save`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaveReport {
    /// Bytes written (0 when not kept).
    pub bytes: u64,
    /// False when the conversation alone is over the disk budget: nothing was written.
    pub kept: bool,
    /// Files of earlier states of this conversation (strict prefixes) removed.
    pub superseded: usize,
    /// Files removed, least recently used first, to stay within the budget.
    pub evicted: usize,
}

/// A directory of session files for one model setup, indexed by their tokens.
///
/// Indices from [`SessionStore::longest`] stay valid until the next call taking `&mut`.
pub struct SessionStore {
    dir: PathBuf,
    identity: SessionIdentity,
    disk_budget: Option<u64>,
    pub(super) entries: Vec<Entry>,
    clock: u64,
    /// Held open with an exclusive `flock` while the store is: one process per directory.
    _lock: fs::File,
}

impl SessionStore {
    /// Indexes `dir` (created if missing): every `*.pyrsession` file whose header reads
    /// and matches `identity` becomes an entry, oldest by modification time first;
    /// others are skipped and left alone (they may be another model's), each with a
    /// message returned for the caller to log. Temporary files of interrupted saves are
    /// removed, and the budget enforced. Fails only if the directory cannot be created
    /// or listed.
    pub fn open(
        dir: &Path,
        identity: SessionIdentity,
        disk_budget: Option<u64>,
    ) -> Result<(Self, Vec<String>), StoreError> {
        fs::create_dir_all(dir).map_err(io_error(dir))?;
        let lock = lock_dir(dir)?;
        let mut warnings = Vec::new();
        let mut found = Vec::new();
        for item in fs::read_dir(dir).map_err(io_error(dir))? {
            let item = match item {
                Ok(item) => item,
                Err(e) => {
                    warnings.push(format!("{}: listing failed: {e}", dir.display()));
                    continue;
                }
            };
            let path = item.path();
            if is_temp_name(&item.file_name().to_string_lossy()) {
                match fs::remove_file(&path) {
                    Ok(()) => warnings.push(format!(
                        "removed {}, left by an interrupted save",
                        path.display()
                    )),
                    Err(e) => warnings.push(format!("{}: {e}", path.display())),
                }
                continue;
            }
            if path.extension().is_none_or(|e| e != SESSION_EXT) {
                continue;
            }
            let header = read_header(&path).and_then(|h| match identity.mismatch(&h.identity) {
                Some(what) => Err(StoreError::OtherModel {
                    path: path.clone(),
                    what,
                }),
                None => Ok(h),
            });
            match header {
                Ok(h) => {
                    let modified = item
                        .metadata()
                        .and_then(|m| m.modified())
                        .unwrap_or(SystemTime::UNIX_EPOCH);
                    found.push((modified, h, path));
                }
                Err(e) => warnings.push(format!("skipping {e}")),
            }
        }
        found.sort_by(|a, b| (a.0, &a.2).cmp(&(b.0, &b.2)));
        let entries: Vec<Entry> = found
            .into_iter()
            .enumerate()
            .map(|(i, (_, h, path))| Entry {
                path,
                tokens: h.tokens,
                window: h.window,
                bytes: h.file_bytes,
                last_used: i as u64 + 1,
            })
            .collect();
        let mut store = Self {
            dir: dir.to_path_buf(),
            identity,
            disk_budget,
            clock: entries.len() as u64,
            entries,
            _lock: lock,
        };
        let evicted = store.enforce_budget(None);
        if evicted > 0 {
            warnings.push(format!(
                "removed {evicted} session files over the disk budget"
            ));
        }
        Ok((store, warnings))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn identity(&self) -> &SessionIdentity {
        &self.identity
    }

    /// Conversations indexed.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Bytes of the indexed files.
    pub fn bytes(&self) -> u64 {
        self.entries.iter().map(|e| e.bytes).sum()
    }

    /// The stored conversation sharing the longest non-empty prefix with `prompt`, and
    /// how many tokens it shares; between equals, the smaller file (less to read).
    pub fn longest(&self, prompt: &[u32]) -> Option<(usize, usize)> {
        self.entries
            .iter()
            .enumerate()
            .map(|(i, e)| (i, common_prefix(&e.tokens, prompt), e))
            .filter(|&(_, shared, _)| shared > 0)
            .max_by_key(|&(_, shared, e)| (shared, std::cmp::Reverse(e.bytes), e.last_used))
            .map(|(i, shared, _)| (i, shared))
    }

    /// Entry `i`'s tokens (panics if `i` is out of range, like a slice).
    pub fn tokens(&self, i: usize) -> &[u32] {
        &self.entries[i].tokens
    }

    /// The window entry `i` ran on: what to allocate the cache for before [`Self::load`].
    pub fn window(&self, i: usize) -> usize {
        self.entries[i].window
    }

    /// Loads entry `i` into `kv` (empty, allocated for [`Self::window`]). The returned
    /// tokens are the file's, re-read and checked. A corrupt or truncated file is deleted
    /// and dropped from the index: it is only a cache, so deleting it loses nothing a
    /// prefill cannot rebuild, whereas setting it aside (`*.corrupt`) would hold disk
    /// outside the budget for ever. A file that cannot be read, or that became another
    /// setup's or version's since indexing, is dropped from the index but left alone.
    /// Either way the caller warns and prefills; a cache that does not fit changes
    /// nothing.
    pub fn load(&mut self, i: usize, kv: KvCache) -> Result<StoredSession, StoreError> {
        let result = load_session(&self.entries[i].path, &self.identity, kv);
        match &result {
            Ok(stored) => {
                self.clock += 1;
                let e = &mut self.entries[i];
                e.last_used = self.clock;
                if e.tokens != stored.tokens {
                    // Rewritten behind our back (or a name collision): index what is there.
                    e.tokens.clone_from(&stored.tokens);
                    e.window = stored.window;
                }
            }
            Err(StoreError::BadCache { .. } | StoreError::Locked { .. }) => {}
            Err(
                StoreError::Io { .. } | StoreError::OtherModel { .. } | StoreError::Version { .. },
            ) => {
                self.entries.remove(i);
            }
            Err(StoreError::Corrupt { .. } | StoreError::NotASessionFile { .. }) => {
                let e = self.entries.remove(i);
                let _ = fs::remove_file(&e.path);
            }
        }
        result
    }

    /// Writes a conversation (`kv` holds exactly its tokens' positions) under a name
    /// from its tokens. Stored conversations whose tokens are a strict prefix of these are
    /// removed (a grown conversation replaces its earlier self); then files are evicted,
    /// least recently used first, to keep within the disk budget. A conversation over the
    /// budget on its own is not written (`kept` false).
    pub fn save(
        &mut self,
        tokens: &[u32],
        window: usize,
        kv: &KvCache,
    ) -> Result<SaveReport, StoreError> {
        let size = self.identity.file_bytes(tokens.len() as u64);
        if let (Some(budget), Some(size)) = (self.disk_budget, size) {
            if size > budget {
                return Ok(SaveReport {
                    bytes: 0,
                    kept: false,
                    superseded: 0,
                    evicted: 0,
                });
            }
        }
        let path = self.dir.join(file_name(&self.identity, tokens));
        let bytes = save_session(&path, &self.identity, tokens, window, kv, &[])?;
        let mut superseded = 0;
        self.entries.retain(|e| {
            if e.path == path {
                return false; // overwritten by the rename
            }
            let prefix = e.tokens.len() < tokens.len() && tokens.starts_with(&e.tokens);
            if prefix {
                let _ = fs::remove_file(&e.path);
                superseded += 1;
            }
            !prefix
        });
        self.clock += 1;
        self.entries.push(Entry {
            path: path.clone(),
            tokens: tokens.to_vec(),
            window,
            bytes,
            last_used: self.clock,
        });
        let evicted = self.enforce_budget(Some(&path));
        Ok(SaveReport {
            bytes,
            kept: true,
            superseded,
            evicted,
        })
    }

    /// Every stored conversation's tokens, in index order (a snapshot for a reader on
    /// another thread).
    pub fn index(&self) -> Vec<Vec<u32>> {
        self.entries.iter().map(|e| e.tokens.clone()).collect()
    }

    /// The entry holding exactly `tokens`.
    pub fn find(&self, tokens: &[u32]) -> Option<usize> {
        self.entries.iter().position(|e| e.tokens == tokens)
    }

    /// Forgets entry `i` and deletes its file.
    pub fn remove(&mut self, i: usize) {
        let e = self.entries.remove(i);
        let _ = fs::remove_file(&e.path);
    }

    /// Removes least recently used files (never `keep`) until the budget holds; returns
    /// how many.
    fn enforce_budget(&mut self, keep: Option<&Path>) -> usize {
        let Some(budget) = self.disk_budget else {
            return 0;
        };
        let mut evicted = 0;
        while self.bytes() > budget {
            let oldest = self
                .entries
                .iter()
                .enumerate()
                .filter(|(_, e)| Some(e.path.as_path()) != keep)
                .min_by_key(|(_, e)| e.last_used)
                .map(|(i, _)| i);
            let Some(i) = oldest else { break };
            self.remove(i);
            evicted += 1;
        }
        evicted
    }
}

/// Takes the directory's lock file (`.lock`) with an exclusive, non-blocking `flock`: a
/// second server on the same directory is refused instead of overwriting the first's
/// files. The lock goes with the process, even a killed one.
fn lock_dir(dir: &Path) -> Result<fs::File, StoreError> {
    let path = dir.join(".lock");
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(io_error(&path))?;
    #[cfg(unix)]
    {
        use std::os::unix::io::AsRawFd;
        // SAFETY: `flock` on a descriptor this function owns; it touches no memory.
        let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if locked != 0 {
            let error = std::io::Error::last_os_error();
            return Err(if error.kind() == std::io::ErrorKind::WouldBlock {
                StoreError::Locked {
                    path: dir.to_path_buf(),
                }
            } else {
                StoreError::Io {
                    path,
                    source: error,
                }
            });
        }
    }
    Ok(file)
}
