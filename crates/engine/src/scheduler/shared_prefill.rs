//! One prompt prefilled once: requests that arrive together with a long common prefix
//! (the `n` choices of one request, agents on one system prompt) do not each prefill it.
//! A queued request whose prompt shares such a prefix with a running sequence still
//! prefilling it waits ([`Scheduler::waits_for_shared_prefill`]); once those positions
//! are in that sequence's cache, it is admitted on a copy of them
//! ([`Scheduler::fork_running`]), as it would be on a cached conversation's.

use super::Scheduler;
use crate::prefix_cache::common_prefix;
use crate::sequence::Sequence;
use crate::session::Session;

/// A shared prefix this long is worth waiting for (a whole shorter prompt always is).
pub(super) const SHARED_PREFILL_MIN: usize = 32;

/// The prompt positions `prompt` could take from `running`'s cache once it has them.
fn shareable(running: &Sequence, prompt: &[u32]) -> usize {
    let theirs = &running.input[..running.prompt_len.min(running.input.len())];
    common_prefix(theirs, prompt).min(prompt.len().saturating_sub(1))
}

impl Scheduler {
    /// Whether queued `prompt` should wait for a running sequence to finish prefilling
    /// the prefix they share, rather than prefill it a second time.
    pub(super) fn waits_for_shared_prefill(&self, prompt: &[u32]) -> bool {
        let worth = SHARED_PREFILL_MIN
            .min(prompt.len().saturating_sub(1))
            .max(1);
        // Only a sequence still prefilling can be waited for: most steps have none.
        let pending = self
            .running
            .iter()
            .filter(|s| s.prefilling())
            .map(|s| (shareable(s, prompt), s.session.len()))
            .filter(|&(shared, done)| shared >= worth && done < shared)
            .map(|(shared, _)| shared)
            .max();
        pending.is_some_and(|shared| shared > self.cache.longest(prompt).map_or(0, |(_, n)| n))
    }

    /// A copy of the longest prefix of `prompt` a running sequence's cache holds, if it
    /// is longer than what the prefix cache offers: the session and the positions it
    /// covers (never the prompt's last, which must run for the first sample's logits).
    pub(super) fn fork_running(
        &mut self,
        prompt: &[u32],
        max_tokens: usize,
    ) -> Option<(Session, usize)> {
        let cached = self.cache.longest(prompt).map_or(0, |(_, n)| n);
        let (parent, shared) = self
            .running
            .iter()
            .enumerate()
            .map(|(i, s)| (i, shareable(s, prompt).min(s.session.len())))
            .max_by_key(|&(_, n)| n)
            .filter(|&(_, n)| n > cached && n > 0)?;
        let session = &self.running[parent].session;
        if !session.resumable_at(shared) {
            return None;
        }
        let window = self.fork_window(session.window()?, prompt.len(), max_tokens);
        let kv = self.kv.new_cache(window);
        let (fork, copied) = self.running[parent].session.fork(shared, window, kv)?;
        self.artifacts.record_fork(copied);
        Some((fork, shared))
    }
}
