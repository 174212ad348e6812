//! KV memory as the scheduler budgets it and the executor allocates it.

use pyramid_model::{KvCache, KvFootprint, KvType, ModelConfig};

/// Sizes and allocates KV caches: a session's bytes on a window, and empty caches.
#[derive(Clone)]
pub(crate) struct KvAllocator {
    config: ModelConfig,
    kv_type: KvType,
    /// The ladder's largest window, reserved as address space by every cache.
    largest: usize,
    footprint: KvFootprint,
}

impl KvAllocator {
    pub fn new(config: &ModelConfig, kv_type: KvType, largest: usize) -> Self {
        Self {
            footprint: KvFootprint::of(config, kv_type),
            config: config.clone(),
            kv_type,
            largest,
        }
    }

    /// KV bytes a session on `window` reserves.
    pub fn bytes(&self, window: usize) -> usize {
        self.footprint.bytes(window)
    }

    /// An empty cache for `window` reserving the ladder's largest (address space only),
    /// so every crossing on every backend is a new bound with no copy at all.
    pub fn new_cache(&self, window: usize) -> KvCache {
        KvCache::with_reserve(&self.config, window, self.largest, self.kv_type)
    }

    /// A cache of no positions, to stand in for one moved out.
    pub fn placeholder(&self) -> KvCache {
        KvCache::new(&self.config, 0, self.kv_type)
    }
}
