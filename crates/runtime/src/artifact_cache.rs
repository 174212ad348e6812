//! Compiled artifacts kept in memory under a byte budget.
//!
//! Artifacts are looked up by [`ArtifactKey`]. When an insertion would exceed the budget,
//! the least recently used artifacts that no session holds (nobody else owns an `Arc` to
//! them) are dropped; artifacts in use are never evicted, and if they alone exceed the
//! budget the insertion is refused rather than silently overcommitting.

use crate::artifact::{ArtifactKey, Compiled, Executable};
use crate::{Result, RuntimeError};
use std::collections::HashMap;
use std::sync::Arc;

struct Entry {
    executable: Arc<dyn Executable>,
    last_used: u64,
}

pub struct ArtifactCache {
    budget_bytes: usize,
    entries: HashMap<ArtifactKey, Entry>,
    clock: u64,
    n_evicted: usize,
}

impl std::fmt::Debug for ArtifactCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArtifactCache")
            .field("budget_bytes", &self.budget_bytes)
            .field("n_entries", &self.entries.len())
            .field("bytes", &self.bytes())
            .finish()
    }
}

impl ArtifactCache {
    pub fn new(budget_bytes: usize) -> Self {
        Self {
            budget_bytes,
            entries: HashMap::new(),
            clock: 0,
            n_evicted: 0,
        }
    }

    /// The artifact for `key`, marked as just used.
    pub fn get(&mut self, key: &ArtifactKey) -> Option<Arc<dyn Executable>> {
        self.clock += 1;
        let clock = self.clock;
        self.entries.get_mut(key).map(|e| {
            e.last_used = clock;
            Arc::clone(&e.executable)
        })
    }

    pub fn contains(&self, key: &ArtifactKey) -> bool {
        self.entries.contains_key(key)
    }

    /// Adds a compiled artifact, evicting unused ones as the budget requires.
    pub fn insert(&mut self, key: ArtifactKey, compiled: Compiled) -> Result<Arc<dyn Executable>> {
        let bytes = compiled.executable.bytes();
        self.entries.remove(&key);
        while self.bytes() + bytes > self.budget_bytes {
            let victim = self
                .entries
                .iter()
                .filter(|(_, e)| Arc::strong_count(&e.executable) == 1)
                .min_by_key(|(_, e)| e.last_used)
                .map(|(k, _)| k.clone());
            match victim {
                Some(k) => {
                    self.entries.remove(&k);
                    self.n_evicted += 1;
                }
                None => {
                    return Err(RuntimeError::OverBudget {
                        shape: key.shape,
                        bytes,
                        budget: self.budget_bytes,
                    })
                }
            }
        }
        self.clock += 1;
        let executable = Arc::clone(&compiled.executable);
        self.entries.insert(
            key,
            Entry {
                executable: compiled.executable,
                last_used: self.clock,
            },
        );
        Ok(executable)
    }

    /// Every artifact's shape and bytes, in no particular order.
    pub fn entries(&self) -> impl Iterator<Item = (crate::ArtifactShape, usize)> + '_ {
        self.entries
            .iter()
            .map(|(k, e)| (k.shape, e.executable.bytes()))
    }

    pub fn bytes(&self) -> usize {
        self.entries.values().map(|e| e.executable.bytes()).sum()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Artifacts dropped to stay within the budget so far.
    pub fn n_evicted(&self) -> usize {
        self.n_evicted
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::artifact::ArtifactShape;
    use pyramid_kernels::ThreadPool;
    use pyramid_model::{KvType, Precision, Segment};
    use std::time::Duration;

    struct Fake {
        shape: ArtifactShape,
        bytes: usize,
    }

    impl Executable for Fake {
        fn shape(&self) -> ArtifactShape {
            self.shape
        }
        fn bytes(&self) -> usize {
            self.bytes
        }
        fn executing_device(&self) -> String {
            "fake".to_string()
        }
        fn run(&self, _: &ThreadPool, _: &mut [Segment<'_>], _: &mut Vec<f32>) -> Result<()> {
            Ok(())
        }
    }

    fn key(window: usize) -> ArtifactKey {
        ArtifactKey {
            model_id: 7,
            device: "fake".to_string(),
            precision: Precision::Int8,
            kv_type: KvType::F32,
            shape: ArtifactShape::Decode { batch: 1, window },
        }
    }

    fn compiled(window: usize, bytes: usize) -> Compiled {
        Compiled {
            executable: Arc::new(Fake {
                shape: key(window).shape,
                bytes,
            }),
            compile_time: Duration::from_millis(window as u64),
        }
    }

    #[test]
    fn evicts_least_recently_used_unheld_artifacts_within_the_budget() {
        let mut cache = ArtifactCache::new(250);
        cache.insert(key(1), compiled(1, 100)).unwrap();
        let held = cache.insert(key(2), compiled(2, 100)).unwrap();
        cache.get(&key(1)); // 1 is now more recent than 2, but 2 is held
        cache.insert(key(3), compiled(3, 100)).unwrap();
        assert!(cache.contains(&key(2)), "held artifacts stay");
        assert!(!cache.contains(&key(1)), "the unheld one goes");
        assert_eq!((cache.len(), cache.n_evicted()), (2, 1));

        // Everything left is held: a new artifact that does not fit is refused.
        let also_held = cache.get(&key(3)).unwrap();
        let refused = cache.insert(key(4), compiled(4, 100));
        assert!(
            matches!(refused, Err(RuntimeError::OverBudget { .. })),
            "an over-budget insertion is refused"
        );
        drop((held, also_held));
        cache.insert(key(4), compiled(4, 100)).unwrap();
        assert!(cache.bytes() <= 250);
    }
}
