//! Sliding-window release: a local layer (Gemma 3) reads only its last `window` positions,
//! so the pages of its older rows go back to the kernel in steps, keeping the layout and
//! every index; and the checks of where a released cache may resume from.

use super::store::row_bytes;
use super::KvCache;
use crate::config::ModelConfig;

/// Positions kept behind the window of a sliding-window layer, so that what the engine
/// takes back after a step (a rejected speculative draft) is still there.
const KEEP_BEHIND: usize = 256;
/// Sliding-window rows are given back in steps of this many positions: whole pages, few
/// system calls.
const RELEASE_STEP: usize = 256;

/// Which layers slide, and how far their rows have been given back.
#[derive(Debug, Clone)]
pub(super) struct Sliding {
    pub(super) window: usize,
    /// Per layer: whether it attends only to its last `window` positions.
    pub(super) local: Vec<bool>,
    /// Local layers' rows below this position may have been given back (read as zeros).
    pub(super) released: usize,
}

impl Sliding {
    pub(super) fn of(cfg: &ModelConfig) -> Option<Self> {
        let window = cfg.sliding_window?.size;
        Some(Self {
            window,
            local: (0..cfg.n_layer)
                .map(|l| cfg.layer_window(l).is_some())
                .collect(),
            released: 0,
        })
    }

    /// Rows a local layer holds after a release, at most: its window, what is kept behind
    /// it, and a step not yet given back. Until the next release, the rows of the engine
    /// step in between (one prefill chunk) come on top; budgets count this figure.
    pub(super) fn local_rows(&self) -> usize {
        self.window + KEEP_BEHIND + RELEASE_STEP
    }
}

impl KvCache {
    /// First row of each (layer, head) run still held: local layers' rows below the
    /// released position are gone.
    pub(super) fn run_starts(&self) -> Vec<usize> {
        let released = |l: usize| match &self.sliding {
            Some(s) if s.local[l] => s.released,
            _ => 0,
        };
        (0..self.n_layer)
            .flat_map(|l| std::iter::repeat_n(released(l), self.n_head_kv))
            .collect()
    }

    /// Gives back the pages of sliding-window layers' rows older than their window (and
    /// what is kept behind it), in steps; returns the bytes given back. The engine calls
    /// it between steps, never inside a pass, so a pass that fails and rolls the cache back
    /// finds its rows where they were.
    pub fn release_out_of_window(&mut self) -> usize {
        let Some(s) = &self.sliding else {
            return 0;
        };
        let keep_from =
            self.len.saturating_sub(s.window + KEEP_BEHIND) / RELEASE_STEP * RELEASE_STEP;
        if keep_from <= s.released {
            return 0;
        }
        let (from, hd, stride) = (s.released, self.head_dim, self.stride);
        let local: Vec<usize> = (0..self.n_layer).filter(|&l| s.local[l]).collect();
        for &l in &local {
            for h in 0..self.n_head_kv {
                let r = l * self.n_head_kv + h;
                self.k.release_rows(r, stride, from..keep_from, hd);
                self.v.release_rows(r, stride, from..keep_from, hd);
            }
        }
        if let Some(s) = &mut self.sliding {
            s.released = keep_from;
        }
        2 * local.len() * self.n_head_kv * (keep_from - from) * row_bytes(self.kind, hd)
    }

    /// Whether the cache can go on from length `len` (after [`KvCache::truncate`]): every
    /// row a sliding-window layer reads from there on is still held.
    pub fn resumable_at(&self, len: usize) -> bool {
        match &self.sliding {
            Some(s) if s.released > 0 => len + 1 >= s.released + s.window,
            _ => true,
        }
    }
}
