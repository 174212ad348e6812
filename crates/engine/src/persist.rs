//! Conversations that survive a restart: the session writer.
//!
//! With a store ([`crate::Engine::open_session_store`]), a cached conversation that
//! leaves memory (evicted for the KV budget or the session limit, or still cached at
//! shutdown) is written to disk, and a request whose prompt shares a longer prefix with a
//! stored conversation than with any cached one has it read back instead of prefilling
//! it. Files are tied to the model file, its precision and route, and the KV type
//! ([`SessionIdentity`]): a file from any other setup is skipped, never resumed, so a
//! resumed conversation gives the tokens an uninterrupted one would. A file that cannot
//! be read or is corrupt is a warning and a prefill, never an error for the request.
//!
//! The files are written and read on a thread of their own (`pyramid-sessions`), behind
//! a bounded queue: writing a 4,000-token conversation of a 0.5B model is a few hundred
//! megabytes and an fsync, which on the engine thread stalled every stream for as long.
//! A conversation handed over stays resumable from memory until its write completes
//! (a request copies what it shares from it); a request resuming from a file waits in
//! the queue (`Loading`) while the others keep stepping. The engine thread keeps a
//! snapshot of the store's index, refreshed by every reply from the thread.

use std::path::Path;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use serde::Serialize;

use pyramid_model::KvCache;

use crate::prefix_cache::common_prefix;
use crate::pyramid::{lock, ArtifactPair};
use crate::reclaim::{lower_priority, Reclaimer};
use crate::request::RequestId;
use crate::session::{Placement, Session};
use crate::session_store::{SessionIdentity, SessionStore, StoreError, StoredSession};

/// Conversations handed to the thread and not written yet, at most.
pub const WRITE_QUEUE: usize = 4;

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
    /// Conversations handed to the writer and not written yet.
    pub pending_writes: usize,
}

/// Work for the session thread.
enum Command {
    Save(Arc<Session>),
    /// Read the file holding exactly `tokens` into `kv`, for request `id`.
    Load {
        id: RequestId,
        tokens: Vec<u32>,
        kv: Box<KvCache>,
    },
    /// Reply once everything before it is done.
    Flush,
    /// Block until the sender is dropped or sends (a test holds a write back with it).
    #[cfg(test)]
    Hold(Receiver<()>),
}

/// What the session thread did; each reply carries the store's index after it.
enum Reply {
    Saved {
        n_tokens: usize,
        result: Result<crate::session_store::SaveReport, String>,
        index: Vec<Vec<u32>>,
    },
    Loaded {
        id: RequestId,
        result: Result<Box<StoredSession>, String>,
        index: Vec<Vec<u32>>,
    },
    Flushed,
}

/// A stored conversation a request asked for, on its way back.
struct Load {
    id: RequestId,
    tokens: Vec<u32>,
    window: usize,
    artifacts: Option<ArtifactPair>,
}

/// What [`SessionWriter::longer_prefix`] found for a prompt.
pub(crate) enum Found {
    /// Nothing longer than the prefix cache has.
    Nothing,
    /// A conversation still waiting to be written, copied back from memory.
    InMemory(Box<Session>),
    /// A file, being read for the request.
    Loading,
}

/// The session thread's handle, and the store's index as the thread last reported it.
struct Thread {
    commands: SyncSender<Command>,
    replies: Receiver<Reply>,
    handle: Option<JoinHandle<()>>,
    /// Conversations handed over and not written yet, shared with the thread.
    pending: Arc<Mutex<Vec<Arc<Session>>>>,
    index: Vec<Vec<u32>>,
    loads: Vec<Load>,
}

/// The session store on its thread, and what it did; without a directory,
/// conversations leaving memory are dropped.
#[derive(Default)]
pub(crate) struct SessionWriter {
    thread: Option<Thread>,
    stats: PersistStats,
    warnings: Vec<String>,
    /// Conversations read back since the last call, for the requests that asked.
    loaded: Vec<(RequestId, Option<Session>)>,
    /// Where conversations not written are freed.
    reclaimer: Reclaimer,
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
        let index = store.index();
        let (commands, inbox) = mpsc::sync_channel(WRITE_QUEUE);
        let (outbox, replies) = mpsc::channel();
        let pending: Arc<Mutex<Vec<Arc<Session>>>> = Arc::default();
        let shared = Arc::clone(&pending);
        let handle = std::thread::Builder::new()
            .name("pyramid-sessions".into())
            .spawn(move || serve(store, inbox, outbox, shared))
            .map_err(|e| StoreError::Io {
                path: dir.to_path_buf(),
                source: e,
            })?;
        self.thread = Some(Thread {
            commands,
            replies,
            handle: Some(handle),
            pending,
            index,
            loads: Vec::new(),
        });
        Ok(())
    }

    pub fn stats(&self) -> PersistStats {
        let mut stats = self.stats;
        stats.pending_writes = self.thread.as_ref().map_or(0, |t| lock(&t.pending).len());
        stats
    }

    pub fn take_warnings(&mut self) -> Vec<String> {
        std::mem::take(&mut self.warnings)
    }

    /// A conversation of `n_tokens` read back some other way (a session file named
    /// by the caller), counted with the store's.
    pub fn record_loaded(&mut self, n_tokens: usize) {
        self.stats.n_loaded += 1;
        self.stats.loaded_tokens += n_tokens;
    }

    /// Hands `session` to the thread to write, if there is a store and it does not hold
    /// exactly this conversation already; otherwise it is freed off the engine thread.
    /// Blocks while [`WRITE_QUEUE`] writes wait.
    pub fn save(&mut self, session: Session) {
        let Some(t) = self.thread.as_mut() else {
            return self.reclaimer.release(session);
        };
        let tokens = session.tokens();
        if tokens.is_empty() || session.placement().is_none() || t.index.iter().any(|s| s == tokens)
        {
            return self.reclaimer.release(session);
        }
        let session = Arc::new(session);
        lock(&t.pending).push(Arc::clone(&session));
        if t.commands.send(Command::Save(session)).is_err() {
            self.thread_gone();
        }
    }

    /// A conversation sharing a longer prefix with `prompt` than the `cached` tokens of
    /// the prefix cache, for request `id`: copied from one waiting to be written, or read
    /// from its file (`restore` gives the window, artifacts and empty cache a
    /// conversation of so many tokens goes to).
    pub fn longer_prefix(
        &mut self,
        id: RequestId,
        prompt: &[u32],
        cached: usize,
        restore: impl FnOnce(usize) -> Result<(usize, Option<ArtifactPair>, KvCache), String>,
        new_cache: impl FnOnce(usize) -> KvCache,
    ) -> Found {
        let Some(t) = self.thread.as_mut() else {
            return Found::Nothing;
        };
        let usable = |n: usize| n.min(prompt.len().saturating_sub(1));
        if t.loads.iter().any(|l| l.id == id) {
            return Found::Loading;
        }
        let writing = {
            let pending = lock(&t.pending);
            pending
                .iter()
                .map(|s| (common_prefix(s.tokens(), prompt), Arc::clone(s)))
                .max_by_key(|(n, _)| *n)
        };
        if let Some((shared, session)) = writing.filter(|(n, _)| usable(*n) > usable(cached)) {
            let n = usable(shared);
            if let Some(window) = session.window() {
                if let Some((copy, _)) = session.fork(n, window, new_cache(window)) {
                    return Found::InMemory(Box::new(copy));
                }
            }
        }
        let best = t
            .index
            .iter()
            .map(|tokens| (common_prefix(tokens, prompt), tokens))
            .max_by_key(|(n, _)| *n);
        let Some(tokens) = best
            .filter(|(n, _)| usable(*n) > usable(cached))
            .map(|(_, tokens)| tokens.clone())
        else {
            return Found::Nothing;
        };
        let (window, artifacts, kv) = match restore(tokens.len()) {
            Ok(target) => target,
            Err(reason) => {
                self.warnings
                    .push(format!("cannot resume a stored conversation: {reason}"));
                return Found::Nothing;
            }
        };
        let command = Command::Load {
            id,
            tokens: tokens.clone(),
            kv: Box::new(kv),
        };
        if t.commands.send(command).is_err() {
            self.thread_gone();
            return Found::Nothing;
        }
        t.loads.push(Load {
            id,
            tokens,
            window,
            artifacts,
        });
        Found::Loading
    }

    /// Whether a file is being read for some request.
    pub fn is_loading(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.loads.is_empty())
    }

    /// Takes in what the thread has done; with `wait`, blocks (up to a second) for at
    /// least one reply first. Conversations read back go to [`Self::take_loaded`].
    pub fn poll(&mut self, wait: bool) {
        let Some(t) = self.thread.as_ref() else {
            return;
        };
        let mut replies = Vec::new();
        if wait {
            match t.replies.recv_timeout(Duration::from_secs(1)) {
                Ok(reply) => replies.push(reply),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return self.thread_gone(),
            }
        }
        loop {
            match t.replies.try_recv() {
                Ok(reply) => replies.push(reply),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => return self.thread_gone(),
            }
        }
        for reply in replies {
            self.take_reply(reply);
        }
    }

    /// Conversations read back since the last call, each for the request that asked
    /// (`None`: the read failed, and it prefills).
    pub fn take_loaded(&mut self) -> Vec<(RequestId, Option<Session>)> {
        std::mem::take(&mut self.loaded)
    }

    /// Waits until every conversation handed over is written.
    pub fn flush(&mut self) {
        let Some(t) = self.thread.as_ref() else {
            return;
        };
        if t.commands.send(Command::Flush).is_err() {
            return self.thread_gone();
        }
        loop {
            let Some(t) = self.thread.as_ref() else {
                return;
            };
            match t.replies.recv() {
                Ok(Reply::Flushed) => return,
                Ok(reply) => self.take_reply(reply),
                Err(_) => return self.thread_gone(),
            }
        }
    }

    fn take_reply(&mut self, reply: Reply) {
        let Some(t) = self.thread.as_mut() else {
            return;
        };
        match reply {
            Reply::Saved {
                n_tokens,
                result,
                index,
            } => {
                t.index = index;
                match result {
                    Ok(report) if report.kept => {
                        self.stats.n_saved += 1;
                        self.stats.saved_bytes += report.bytes;
                    }
                    Ok(_) => self.warnings.push(format!(
                        "a conversation of {n_tokens} tokens is larger than the session disk budget: not kept"
                    )),
                    Err(e) => self.warnings.push(format!("cannot keep a conversation: {e}")),
                }
            }
            Reply::Loaded { id, result, index } => {
                t.index = index;
                let Some(at) = t.loads.iter().position(|l| l.id == id) else {
                    return;
                };
                let load = t.loads.swap_remove(at);
                let session = match result {
                    Ok(stored) => {
                        let stored = *stored;
                        self.stats.n_loaded += 1;
                        self.stats.loaded_tokens += stored.tokens.len();
                        debug_assert_eq!(stored.tokens, load.tokens);
                        let placement = Placement {
                            window: load.window,
                            kv: stored.kv,
                            artifacts: load.artifacts,
                        };
                        Some(Session::restored(stored.tokens, placement))
                    }
                    Err(e) => {
                        self.stats.n_load_failed += 1;
                        self.warnings
                            .push(format!("skipping {e}; prefilling instead"));
                        None
                    }
                };
                self.loaded.push((id, session));
            }
            Reply::Flushed => {}
        }
        if let Some(t) = self.thread.as_ref() {
            self.stats.stored_sessions = t.index.len();
        }
    }

    /// The thread ended (it panicked): conversations are no longer kept, and requests
    /// waiting for a file prefill instead.
    fn thread_gone(&mut self) {
        if let Some(t) = self.thread.take() {
            for load in t.loads {
                self.loaded.push((load.id, None));
            }
            self.warnings
                .push("the session store stopped: conversations are no longer kept".into());
        }
    }
}

impl Drop for SessionWriter {
    /// Lets the thread finish what it was handed, then ends it.
    fn drop(&mut self) {
        if let Some(mut t) = self.thread.take() {
            drop(t.commands);
            if let Some(handle) = t.handle.take() {
                let _ = handle.join();
            }
        }
    }
}

/// The session thread: writes and reads in the order they were handed over, until the
/// engine drops its end of the queue.
fn serve(
    mut store: SessionStore,
    inbox: Receiver<Command>,
    outbox: mpsc::Sender<Reply>,
    pending: Arc<Mutex<Vec<Arc<Session>>>>,
) {
    lower_priority();
    for command in inbox {
        let reply = match command {
            Command::Save(session) => {
                let result = match session.placement() {
                    Some(p) => store
                        .save(session.tokens(), p.window, &p.kv)
                        .map_err(|e| e.to_string()),
                    None => Err("the conversation has no cache".to_string()),
                };
                // Written (or not): no longer resumable from memory.
                lock(&pending).retain(|s| !Arc::ptr_eq(s, &session));
                Reply::Saved {
                    n_tokens: session.len(),
                    result,
                    index: store.index(),
                }
            }
            Command::Load { id, tokens, kv } => {
                let result = match store.find(&tokens) {
                    Some(i) => store.load(i, *kv).map(Box::new).map_err(|e| e.to_string()),
                    None => Err("a stored conversation that is gone".to_string()),
                };
                Reply::Loaded {
                    id,
                    result,
                    index: store.index(),
                }
            }
            Command::Flush => Reply::Flushed,
            #[cfg(test)]
            Command::Hold(gate) => {
                let _ = gate.recv();
                continue;
            }
        };
        if outbox.send(reply).is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use pyramid_model::{KvCache, KvType};

    use super::*;
    use crate::test_harness::tiny;

    /// A conversation of `tokens` on a 32-position window, its cache filled.
    fn conversation(tokens: Vec<u32>) -> Session {
        let config = &tiny().config;
        let mut kv = KvCache::new(config, 32, KvType::F32);
        for layer in 0..config.n_layer {
            for h in 0..config.n_head_kv {
                let keys: Vec<f32> = (0..tokens.len() * config.head_dim)
                    .map(|i| (layer * 100 + h * 10) as f32 + i as f32 * 0.5)
                    .collect();
                kv.write_head_rows(layer, h, 0, &keys, &keys).unwrap();
            }
        }
        kv.commit(tokens.len()).unwrap();
        let placement = Placement {
            window: 32,
            kv,
            artifacts: None,
        };
        Session::restored(tokens, placement)
    }

    #[test]
    fn a_conversation_resumes_from_memory_while_its_write_waits_and_from_its_file_after() {
        let dir = std::env::temp_dir().join(format!("pyramid-writer-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let model = tiny();
        let identity = SessionIdentity::new(7, "f32@test", KvType::F32, &model.config);
        let mut writer = SessionWriter::default();
        writer.open(&dir, identity, None).unwrap();
        let (release, gate) = mpsc::channel();
        let t = writer.thread.as_ref().unwrap();
        t.commands.send(Command::Hold(gate)).unwrap();
        let tokens: Vec<u32> = (1..=20).collect();
        writer.save(conversation(tokens.clone()));
        assert_eq!(writer.stats().pending_writes, 1);
        let mut prompt = tokens.clone();
        prompt.push(99);
        let new_cache = |w| KvCache::new(&model.config, w, KvType::F32);
        let no_restore = |_| Err("not expected".to_string());
        // The write is held back: the request copies the conversation from memory.
        let found = writer.longer_prefix(1, &prompt, 0, no_restore, new_cache);
        let Found::InMemory(copy) = found else {
            panic!("not resumed from memory");
        };
        assert_eq!(copy.tokens(), &tokens[..]);
        let original = conversation(tokens.clone());
        let bytes = |s: &Session| {
            let mut out = Vec::new();
            s.placement().unwrap().kv.write_live(&mut out).unwrap();
            out
        };
        assert_eq!(bytes(&copy), bytes(&original), "the same keys and values");
        // Once written, a request reads it from its file, on the thread.
        release.send(()).unwrap();
        writer.flush();
        let stats = writer.stats();
        assert_eq!(
            (stats.n_saved, stats.pending_writes, stats.stored_sessions),
            (1, 0, 1)
        );
        let restore = |n| -> Result<(usize, Option<ArtifactPair>, KvCache), String> {
            assert_eq!(n, 20);
            Ok((32, None, KvCache::new(&model.config, 32, KvType::F32)))
        };
        let found = writer.longer_prefix(1, &prompt, 0, restore, new_cache);
        assert!(matches!(found, Found::Loading));
        assert!(writer.is_loading());
        let mut loaded = Vec::new();
        while loaded.is_empty() {
            writer.poll(true);
            loaded = writer.take_loaded();
        }
        let (id, session) = loaded.pop().unwrap();
        let session = session.expect("read back");
        assert_eq!((id, session.tokens()), (1, &tokens[..]));
        assert_eq!(bytes(&session), bytes(&original));
        assert_eq!(writer.stats().n_loaded, 1);
        // A prompt sharing no more than the cache holds asks for nothing.
        let found = writer.longer_prefix(2, &prompt, 20, no_restore, new_cache);
        assert!(matches!(found, Found::Nothing));
        drop(writer);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
