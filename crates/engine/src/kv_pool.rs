//! Compact KV caches whose memory is already committed, for backends that bind cache
//! memory as a graph input (OpenVINO) and so move a session to a larger window by copying
//! it.
//!
//! The copy itself runs at memory speed; what made it slow is the first touch of every
//! page of the new window (over 90 % of its time, docs/BENCHMARKS.md). So the pool takes
//! that off the crossing: when the predictor starts compiling a session's next window, a
//! background thread allocates that window's cache and faults its pages in while the
//! session still runs on its old one. Windows sessions leave behind are not kept: the
//! memory they would save is less than what keeping them idle costs. The pool keeps at
//! most two of the largest window's worth; its bytes count against the KV budget and go
//! first when it is short.

use std::sync::{Arc, Mutex, MutexGuard};

use pyramid_model::{KvCache, KvType, ModelConfig};

pub(crate) struct KvPool {
    config: ModelConfig,
    kind: KvType,
    /// The most the pool keeps, whatever the budget allows: what a window costs to keep
    /// idle is real memory.
    max_bytes: usize,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    free: Vec<KvCache>,
    /// Windows being faulted in on a background thread.
    pending: Vec<usize>,
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    // Every update is a push or a removal: a panic elsewhere leaves the lists usable.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl KvPool {
    /// A pool keeping at most `max_bytes`.
    pub fn new(config: ModelConfig, kind: KvType, max_bytes: usize) -> Arc<Self> {
        Arc::new(Self {
            config,
            kind,
            max_bytes,
            state: Mutex::default(),
        })
    }

    /// An empty compact cache of `window` positions: faulted in ahead when the pool has
    /// one (whether it did is the second value), else newly allocated.
    pub fn take(&self, window: usize) -> (KvCache, bool) {
        let mut state = lock(&self.state);
        match state.free.iter().position(|kv| kv.capacity() == window) {
            Some(i) => (state.free.swap_remove(i), true),
            None => (KvCache::new(&self.config, window, self.kind), false),
        }
    }

    /// Whether a cache of `window` positions is in the pool or on its way.
    pub fn has(&self, window: usize) -> bool {
        let state = lock(&self.state);
        state.pending.contains(&window) || state.free.iter().any(|kv| kv.capacity() == window)
    }

    /// Allocates a cache of `window` positions on a background thread, faults in the
    /// memory of its first `positions` (what a migration will copy into it; the rest
    /// commits as it is written, as in any cache), and puts it in the pool.
    pub fn prefault(self: &Arc<Self>, window: usize, positions: usize) {
        {
            let mut state = lock(&self.state);
            if state.pending.contains(&window) {
                return;
            }
            state.pending.push(window);
        }
        let pool = Arc::clone(self);
        std::thread::spawn(move || {
            let mut kv = KvCache::new(&pool.config, window, pool.kind);
            kv.prefault(positions);
            let mut state = lock(&pool.state);
            state.pending.retain(|&w| w != window);
            state.free.push(kv);
            drop(state);
            pool.shrink_to(pool.max_bytes);
        });
    }

    /// Bytes the pooled caches hold.
    pub fn bytes(&self) -> usize {
        lock(&self.state).free.iter().map(KvCache::bytes).sum()
    }

    /// Drops pooled caches, oldest first, until at most `max_bytes` remain.
    pub fn shrink_to(&self, max_bytes: usize) {
        let mut state = lock(&self.state);
        let mut bytes: usize = state.free.iter().map(KvCache::bytes).sum();
        while bytes > max_bytes && !state.free.is_empty() {
            bytes -= state.free.remove(0).bytes();
        }
    }
}
