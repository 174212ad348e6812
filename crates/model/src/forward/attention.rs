//! How a layer's attention is dealt out to the threads: (block of rows, KV head, run of
//! query heads) items round-robin, with the items of a long cache left over after the
//! last whole round shared by the whole team.

use pyramid_kernels::attention::int8::attend_rows_int8;
use pyramid_kernels::attention::{
    attend_rows, attend_rows_shared, can_share, worth_sharing, KvRows, MAX_GROUP, MAX_ROWS,
};
use pyramid_kernels::{isa, Team};

use super::scratch::Pass;
use crate::kv_cache::KvCache;
use crate::{Attention, Model};

impl Model {
    /// Causal grouped-query attention for every real row, whose keys and values are already
    /// in its segment's cache; padding rows get zeros.
    ///
    /// # Safety
    /// `q` and the caches are complete and unwritten until the next barrier.
    pub(super) unsafe fn attend(&self, team: &Team, pass: &Pass<'_, '_>, layer_idx: usize) {
        let cfg = &self.config;
        let (n_head, head_dim) = (cfg.n_head, cfg.head_dim);
        let qd = n_head * head_dim;
        let group = n_head / cfg.n_head_kv;
        let scale = cfg.attention_scale;
        let window = cfg.layer_window(layer_idx);
        let blocks = if window.is_some() {
            pass.single_rows
        } else {
            pass.blocks
        };
        let q = pass.bufs.q.as_slice();
        // Each thread locks only its own buffer; an error here means a panic poisoned it.
        let mut scores = pass.scores[team.idx()]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let scores = &mut *scores;
        // Work items are (block of rows, KV head, run of that head's query heads), dealt
        // round-robin rather than in contiguous runs: a causal row's work grows with its
        // position, so contiguous runs would leave the last rows' thread with most of it.
        // A block's rows and a KV head's query heads go together so its cache is read
        // once for all of them. Items left over after the last whole round over a long
        // cache (a decoding sequence or verified draft whose heads do not divide among
        // the threads) are shared by the whole team instead, each thread reading part of
        // the cache; otherwise heads split into more runs where there would be fewer
        // items than threads.
        let n_threads = team.n_threads();
        let n_kv = cfg.n_head_kv;
        // The cached rows of `kv_head` block `b` attends to, and how many of them its first
        // row sees: causal, back to the layer's window (a windowed block is one row).
        let cached = |b: usize, kv_head: usize| {
            let (t0, n_rows) = blocks[b];
            let place = pass.places[t0];
            let last_pos = place.pos + n_rows;
            let start = window.map_or(0, |w| last_pos.saturating_sub(w));
            let kv: &KvCache = pass.segments.get(place.segment).kv;
            let rows = kv.head(layer_idx, kv_head, last_pos).skip(start, head_dim);
            (rows, place.pos + 1 - start)
        };
        // INT8 products over an INT8 cache run each (row, head) pair on one thread, in an
        // order of its own whatever the team: they are not shared.
        let int8 = |rows: &KvRows<'_>| {
            self.attention == Attention::Int8 && matches!(rows, KvRows::Int8 { .. })
        };
        let shareable = n_threads > 1 && can_share(isa::active(), head_dim);
        let shared = |b: usize| {
            let rows = cached(b, 0).0;
            shareable && !pass.places[blocks[b].0].padding && !int8(&rows) && worth_sharing(rows)
        };
        let min_runs = group.div_ceil(MAX_GROUP);
        let wanted = if (0..blocks.len()).all(shared) {
            min_runs
        } else {
            n_threads.div_ceil((blocks.len() * n_kv).max(1))
        };
        let runs = wanted.clamp(min_runs, group);
        let heads_per_run = group.div_ceil(runs);
        let runs = group.div_ceil(heads_per_run);
        let n_items = blocks.len() * n_kv * runs;
        let whole_rounds = n_items - n_items % n_threads;
        // Block, KV head and query heads of an item.
        let item_at = |item: usize| {
            let (b, rest) = (item / (n_kv * runs), item % (n_kv * runs));
            let (kv_head, run) = (rest / runs, rest % runs);
            let first = kv_head * group + run * heads_per_run;
            let last = (first + heads_per_run).min((kv_head + 1) * group);
            (b, kv_head, first..last)
        };
        let mut q_rows: [&[f32]; MAX_ROWS] = Default::default();
        let mut o_rows: [&mut [f32]; MAX_ROWS] = Default::default();
        for item in (team.idx()..n_items).step_by(n_threads) {
            let (b, kv_head, heads) = item_at(item);
            if item >= whole_rounds && shared(b) {
                continue;
            }
            let (t0, n_rows) = blocks[b];
            let place = pass.places[t0];
            for r in 0..n_rows {
                let t = t0 + r;
                let span = t * qd + heads.start * head_dim..t * qd + heads.end * head_dim;
                q_rows[r] = &q[span.clone()];
                o_rows[r] = pass.bufs.attn.range_mut(span);
            }
            let outs = &mut o_rows[..n_rows];
            if place.padding {
                outs.iter_mut().for_each(|o| o.fill(0.0));
                continue;
            }
            let (rows, first_len) = cached(b, kv_head);
            let attend = if int8(&rows) {
                attend_rows_int8
            } else {
                attend_rows
            };
            attend(
                &q_rows[..n_rows],
                head_dim,
                rows,
                first_len,
                scale,
                scores,
                outs,
            );
        }
        for item in whole_rounds..n_items {
            let (b, kv_head, heads) = item_at(item);
            if !shared(b) {
                continue;
            }
            let (t0, n_rows) = blocks[b];
            let mut out_at = [0; MAX_ROWS];
            for (r, at) in out_at.iter_mut().enumerate().take(n_rows) {
                *at = (t0 + r) * qd + heads.start * head_dim;
                q_rows[r] = &q[*at..*at + heads.len() * head_dim];
            }
            let (rows, first_len) = cached(b, kv_head);
            // Every thread takes every shared item, in the same order; the call returns
            // at a barrier, with its outputs complete.
            attend_rows_shared(
                team,
                isa::active(),
                &q_rows[..n_rows],
                head_dim,
                rows,
                first_len,
                scale,
                &pass.bufs.meeting,
                &pass.bufs.attn,
                &out_at[..n_rows],
            );
        }
    }
}
