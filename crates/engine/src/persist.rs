//! Conversations that survive a restart: the engine's side of the session store.
//!
//! With a store ([`Engine::open_session_store`]), a cached conversation that leaves
//! memory (evicted for the KV budget or the session limit, or still cached at shutdown:
//! [`Engine::save_cached`]) is written to disk, and a request whose prompt shares a
//! longer prefix with a stored conversation than with any cached one loads it into the
//! prefix cache instead of prefilling it. Files are tied to the model file, its
//! precision and route, and the KV type ([`Engine::session_identity`]): a file from any
//! other setup is skipped, never resumed, so a resumed conversation gives the tokens an
//! uninterrupted one would. A file that cannot be read or is corrupt is a warning
//! ([`Engine::take_warnings`]) and a prefill, never an error for the request.

use std::path::Path;

use serde::Serialize;

use pyramid_model::KvCache;

use crate::engine::Engine;
use crate::pyramid::ArtifactPair;
use crate::session::{Placement, Session};
use crate::session_store::{
    load_session, read_header, save_session, SessionIdentity, SessionStore, StoreError,
    StoredSession,
};

/// What the session store did, for `/metrics` and reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct PersistStats {
    /// Conversations written to disk, and their bytes.
    pub n_saved: usize,
    pub saved_bytes: u64,
    /// Conversations resumed from disk, and the tokens they brought.
    pub n_loaded: usize,
    pub loaded_tokens: usize,
    /// Files skipped as unreadable, corrupt or another setup's when a request wanted them.
    pub n_load_failed: usize,
    /// Conversations on disk now.
    pub stored_sessions: usize,
}

impl Engine {
    /// What a session file must match to be resumed here: the model file, the weights'
    /// precision and the route that computes the KV, the KV type and shape.
    pub fn session_identity(&self) -> SessionIdentity {
        let backend = self.pyramid.backend();
        let model = backend.model();
        let precision = format!("{}@{}", model.precision.name(), backend.device());
        SessionIdentity::new(
            self.model_id,
            &precision,
            self.pyramid.kv_type(),
            &model.config,
        )
    }

    /// Keeps conversations in `dir` (indexed now; files of other setups are skipped with
    /// a warning), within `disk_budget` bytes if given.
    pub fn open_session_store(
        &mut self,
        dir: &Path,
        disk_budget: Option<u64>,
    ) -> Result<(), StoreError> {
        let (store, warnings) = SessionStore::open(dir, self.session_identity(), disk_budget)?;
        self.warnings.extend(warnings);
        self.persisted.stored_sessions = store.len();
        self.store = Some(store);
        Ok(())
    }

    /// Messages about skipped or unwritable session files since the last call, for the
    /// driver to show.
    pub fn take_warnings(&mut self) -> Vec<String> {
        std::mem::take(&mut self.warnings)
    }

    /// Writes every cached conversation to the store (at shutdown); returns how many
    /// were written.
    pub fn save_cached(&mut self) -> usize {
        let sessions = self.cache.drain();
        let before = self.persisted.n_saved;
        for session in &sessions {
            self.persist(session);
        }
        self.persisted.n_saved - before
    }

    /// Writes `session` to the store, if there is one and it does not hold exactly this
    /// conversation already.
    pub(crate) fn persist(&mut self, session: &Session) {
        let (Some(store), Some(placement)) = (self.store.as_mut(), session.placement()) else {
            return;
        };
        let tokens = session.tokens();
        if tokens.is_empty()
            || store
                .longest(tokens)
                .is_some_and(|(i, n)| n == tokens.len() && store.tokens(i).len() == n)
        {
            return;
        }
        match store.save(tokens, placement.window, &placement.kv) {
            Ok(report) if report.kept => {
                self.persisted.n_saved += 1;
                self.persisted.saved_bytes += report.bytes;
            }
            Ok(_) => self.warnings.push(format!(
                "a conversation of {} tokens is larger than the session disk budget: not kept",
                tokens.len()
            )),
            Err(e) => self
                .warnings
                .push(format!("cannot keep a conversation: {e}")),
        }
        self.persisted.stored_sessions = store.len();
    }

    /// Loads into the prefix cache the stored conversation sharing a longer prefix with
    /// `prompt` than any cached one, if there is one.
    pub(crate) fn load_stored_prefix(&mut self, prompt: &[u32]) {
        let Some(store) = self.store.as_ref() else {
            return;
        };
        let Some((i, shared)) = store.longest(prompt) else {
            return;
        };
        let cached = self.cache.longest(prompt).map_or(0, |(_, n)| n);
        let usable = |n: usize| n.min(prompt.len().saturating_sub(1));
        if usable(shared) <= usable(cached) {
            return;
        }
        let n_tokens = store.tokens(i).len();
        let (window, artifacts, kv) = match self.restore_target(n_tokens) {
            Ok(target) => target,
            Err(reason) => {
                self.warnings
                    .push(format!("cannot resume a stored conversation: {reason}"));
                return;
            }
        };
        let Some(store) = self.store.as_mut() else {
            return;
        };
        let loaded = store.load(i, kv);
        self.persisted.stored_sessions = store.len();
        match loaded {
            Ok(stored) => self.cache_restored(stored, window, artifacts),
            Err(e) => {
                self.persisted.n_load_failed += 1;
                self.warnings
                    .push(format!("skipping {e}; prefilling instead"));
            }
        }
    }

    /// Where a restored conversation of `n_tokens` goes: the smallest rung of this
    /// engine's ladder holding it (the file's own window may not be one), that window's
    /// artifacts on a static route, and an empty cache for it.
    fn restore_target(
        &self,
        n_tokens: usize,
    ) -> Result<(usize, Option<ArtifactPair>, KvCache), String> {
        let ladder = &self.config.pyramid.ladder;
        let rung = ladder.rung_for(n_tokens.max(1)).map_err(|_| {
            format!(
                "its {n_tokens} tokens exceed the largest window ({})",
                ladder.largest()
            )
        })?;
        let window = ladder.windows()[rung];
        let artifacts = match self.mixed {
            Some(_) => None,
            None => Some(
                self.pyramid
                    .acquire_window(window)
                    .map_err(|e| e.to_string())?
                    .0,
            ),
        };
        Ok((window, artifacts, self.new_cache(window)))
    }

    /// Puts a conversation read from disk into the prefix cache (an admission taking it
    /// next makes room for it by its own rules).
    fn cache_restored(
        &mut self,
        stored: StoredSession,
        window: usize,
        artifacts: Option<ArtifactPair>,
    ) {
        self.persisted.n_loaded += 1;
        self.persisted.loaded_tokens += stored.tokens.len();
        let placement = Placement {
            window,
            kv: stored.kv,
            artifacts,
        };
        self.cache
            .insert(Session::restored(stored.tokens, placement));
    }

    /// Puts the conversation in the session file at `path` (`pyramid chat --session`)
    /// into the prefix cache; returns its tokens and the note saved with it.
    pub fn import_session_file(&mut self, path: &Path) -> Result<(Vec<u32>, Vec<u8>), StoreError> {
        let header = read_header(path)?;
        let (window, artifacts, kv) =
            self.restore_target(header.tokens.len())
                .map_err(|reason| StoreError::BadCache {
                    path: path.to_path_buf(),
                    reason,
                })?;
        let mut stored = load_session(path, &self.session_identity(), kv)?;
        let tokens = stored.tokens.clone();
        let note = std::mem::take(&mut stored.note);
        self.cache_restored(stored, window, artifacts);
        self.fit_budget(self.running_bytes(), self.max_cached());
        Ok((tokens, note))
    }

    /// Writes the cached conversation sharing the longest prefix with `tokens` to the
    /// session file at `path`, with `note`; returns how many tokens it holds, or `None`
    /// when nothing is cached.
    pub fn export_session_file(
        &self,
        tokens: &[u32],
        path: &Path,
        note: &[u8],
    ) -> Result<Option<usize>, StoreError> {
        let Some((i, _)) = self.cache.longest(tokens) else {
            return Ok(None);
        };
        let session = self.cache.session(i);
        let Some(placement) = session.placement() else {
            return Ok(None);
        };
        save_session(
            path,
            &self.session_identity(),
            session.tokens(),
            placement.window,
            &placement.kv,
            note,
        )?;
        Ok(Some(session.len()))
    }
}
