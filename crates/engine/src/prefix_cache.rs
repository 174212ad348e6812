//! Finished conversations kept for reuse. A new request finds the cached session whose
//! tokens share the longest prefix with its prompt and prefills only the rest: it takes
//! a session its prompt extends, and forks (copies the shared prefix of) one it diverges
//! from, which stays cached whole. The least recently used sessions go first when limits
//! require.

use std::time::Instant;

use crate::session::Session;

struct Entry {
    session: Session,
    last_used: Instant,
    /// Names the entry to a watcher for as long as it is cached.
    key: u64,
    cached_at: Instant,
}

#[derive(Default)]
pub(crate) struct PrefixCache {
    entries: Vec<Entry>,
    next_key: u64,
}

/// Leading tokens `a` and `b` have in common.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl PrefixCache {
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// KV bytes the cached sessions reserve.
    pub fn bytes(&self) -> usize {
        self.entries.iter().map(|e| e.session.kv_bytes().0).sum()
    }

    /// KV bytes the cached sessions' live positions occupy.
    pub fn used_bytes(&self) -> usize {
        self.entries.iter().map(|e| e.session.kv_bytes().1).sum()
    }

    /// The session sharing the longest non-empty prefix with `prompt` (its index), with
    /// the length shared.
    pub fn longest(&self, prompt: &[u32]) -> Option<(usize, usize)> {
        self.entries
            .iter()
            .enumerate()
            .map(|(i, e)| (i, common_prefix(e.session.tokens(), prompt)))
            .max_by_key(|&(_, n)| n)
            .filter(|&(_, n)| n > 0)
    }

    pub fn session(&self, i: usize) -> &Session {
        &self.entries[i].session
    }

    /// Marks session `i` used now (a fork read it).
    pub fn touch(&mut self, i: usize) {
        self.entries[i].last_used = Instant::now();
    }

    pub fn take(&mut self, i: usize) -> Session {
        self.entries.swap_remove(i).session
    }

    /// Keeps `session` (an empty one is dropped); returns its key.
    pub fn insert(&mut self, session: Session) -> Option<u64> {
        if session.is_empty() {
            return None;
        }
        let key = self.next_key;
        self.next_key += 1;
        let now = Instant::now();
        self.entries.push(Entry {
            session,
            last_used: now,
            key,
            cached_at: now,
        });
        Some(key)
    }

    /// Every cached session with its key and since when it is cached.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &Session, Instant)> + '_ {
        self.entries
            .iter()
            .map(|e| (e.key, &e.session, e.cached_at))
    }

    /// Takes every session out, least recently used first.
    pub fn drain(&mut self) -> Vec<Session> {
        self.entries.sort_by_key(|e| e.last_used);
        self.entries.drain(..).map(|e| e.session).collect()
    }

    /// Evicts least recently used sessions until at most `max_entries` remain and their
    /// bytes are at most `max_bytes`; returns those that went, with their keys.
    pub fn evict_to(&mut self, max_entries: usize, max_bytes: usize) -> Vec<(u64, Session)> {
        self.entries.sort_by_key(|e| std::cmp::Reverse(e.last_used));
        let mut bytes = 0;
        let mut keep = 0;
        for e in &self.entries {
            let b = e.session.kv_bytes().0;
            if keep >= max_entries || bytes + b > max_bytes {
                break;
            }
            bytes += b;
            keep += 1;
        }
        self.entries
            .drain(keep..)
            .map(|e| (e.key, e.session))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn common_prefixes() {
        assert_eq!(common_prefix(&[1, 2, 3], &[1, 2, 4]), 2);
        assert_eq!(common_prefix(&[], &[1]), 0);
        assert_eq!(common_prefix(&[5], &[5, 6]), 1);
    }
}
