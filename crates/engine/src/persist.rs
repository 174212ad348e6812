//! Conversations that survive a restart: the session writer.
//!
//! With a store ([`crate::Engine::open_session_store`]), a cached conversation that
//! leaves memory (evicted for the KV budget or the session limit, or still cached at
//! shutdown) is written to disk, and a request whose prompt shares a longer prefix with a
//! stored conversation than with any cached one has it read back into the prefix cache
//! instead of prefilling it. Files are tied to the model file, its precision and route,
//! and the KV type ([`SessionIdentity`]): a file from any other setup is skipped, never
//! resumed, so a resumed conversation gives the tokens an uninterrupted one would. A
//! file that cannot be read or is corrupt is a warning and a prefill, never an error for
//! the request. The scheduler never touches a file: it hands evicted conversations over,
//! and the engine asks here for stored ones before it schedules.

use std::path::Path;

use serde::Serialize;

use pyramid_model::KvCache;

use crate::session::Session;
use crate::session_store::{SessionIdentity, SessionStore, StoreError, StoredSession};

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

/// The session store and what it did; without a directory, conversations are dropped.
#[derive(Default)]
pub(crate) struct SessionWriter {
    store: Option<SessionStore>,
    stats: PersistStats,
    warnings: Vec<String>,
}

impl SessionWriter {
    /// Keeps conversations in `dir` (indexed now; files of other setups are skipped with
    /// a warning), within `disk_budget` bytes if given.
    pub fn open(
        &mut self,
        dir: &Path,
        identity: SessionIdentity,
        disk_budget: Option<u64>,
    ) -> Result<(), StoreError> {
        let (store, warnings) = SessionStore::open(dir, identity, disk_budget)?;
        self.warnings.extend(warnings);
        self.stats.stored_sessions = store.len();
        self.store = Some(store);
        Ok(())
    }

    pub fn stats(&self) -> PersistStats {
        self.stats
    }

    pub fn take_warnings(&mut self) -> Vec<String> {
        std::mem::take(&mut self.warnings)
    }

    pub fn warn(&mut self, warning: String) {
        self.warnings.push(warning);
    }

    /// Writes `session` to the store, if there is one and it does not hold exactly this
    /// conversation already.
    pub fn save(&mut self, session: &Session) {
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
                self.stats.n_saved += 1;
                self.stats.saved_bytes += report.bytes;
            }
            Ok(_) => self.warnings.push(format!(
                "a conversation of {} tokens is larger than the session disk budget: not kept",
                tokens.len()
            )),
            Err(e) => self
                .warnings
                .push(format!("cannot keep a conversation: {e}")),
        }
        self.stats.stored_sessions = store.len();
    }

    /// The stored conversation worth loading for `prompt`, whose longest cached prefix is
    /// `cached` tokens: its index and length, if it shares a longer usable prefix.
    pub fn wanted_for(&self, prompt: &[u32], cached: usize) -> Option<(usize, usize)> {
        let store = self.store.as_ref()?;
        let (i, shared) = store.longest(prompt)?;
        let usable = |n: usize| n.min(prompt.len().saturating_sub(1));
        (usable(shared) > usable(cached)).then(|| (i, store.tokens(i).len()))
    }

    /// Reads stored conversation `i` into `kv`; a failure is a warning.
    pub fn load(&mut self, i: usize, kv: KvCache) -> Option<StoredSession> {
        let store = self.store.as_mut()?;
        let loaded = store.load(i, kv);
        self.stats.stored_sessions = store.len();
        match loaded {
            Ok(stored) => {
                self.record_loaded(&stored);
                Some(stored)
            }
            Err(e) => {
                self.stats.n_load_failed += 1;
                self.warnings
                    .push(format!("skipping {e}; prefilling instead"));
                None
            }
        }
    }

    pub fn record_loaded(&mut self, stored: &StoredSession) {
        self.stats.n_loaded += 1;
        self.stats.loaded_tokens += stored.tokens.len();
    }
}
