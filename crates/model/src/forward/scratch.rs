//! A pass's memory: [`Scratch`], the buffers reused from pass to pass and sized up front
//! so a pass of at most the planned shape never allocates, and the views one pass's threads
//! share of them ([`Pass`], [`Buffers`], [`Segments`]), with each row's place in the batch.

use std::sync::Mutex;

use pyramid_kernels::attention::{meeting_len, scratch_len, MAX_ROWS};
use pyramid_kernels::{SharedSlice, Team};

use super::Segment;
use crate::block::BlockPart;
use crate::linear::{Calibration, LinearScratch, PreparedInput, Site};
use crate::Model;

/// Where a row of the batch belongs.
#[derive(Debug, Clone, Copy)]
pub(super) struct RowPlace {
    pub(super) token: u32,
    pub(super) segment: usize,
    pub(super) pos: usize,
    /// Padding rows are computed but neither cached nor attended.
    pub(super) padding: bool,
}

/// Activations of one forward pass, reused between calls. [`Scratch::for_shape`] sizes
/// every buffer up front, after which passes of at most that shape never allocate.
#[derive(Debug, Default)]
pub struct Scratch {
    pub(super) places: Vec<RowPlace>, // [n_tokens]
    /// Runs of consecutive rows of one segment, all real or all padding, at most
    /// `MAX_ROWS` each: `(first row, rows)`. Attention takes a run at a time.
    pub(super) blocks: Vec<(usize, usize)>,
    /// Every row as a block of its own: what sliding-window layers attend by, since each
    /// row's window starts at a different position.
    pub(super) single_rows: Vec<(usize, usize)>,
    pub(super) logit_rows: Vec<usize>, // [n_rows] rows whose logits are wanted
    /// Rows of pooled segments, in order: their final-normed states go to `h`.
    pub(super) pooled_rows: Vec<usize>,
    pub(super) normed: Vec<f32>, // [n_rows, n_embd]
    pub(super) logits: Vec<f32>, // [n_rows, n_vocab]
    /// One attention-score buffer per pool thread: `[rows of a block, window, MAX_GROUP]`
    /// each (a block is at most `MAX_ROWS` rows of one segment).
    pub(super) scores: Vec<Mutex<Vec<f32>>>,
    /// Where a team sharing a block's attention meets (`meeting_len` floats).
    pub(super) meeting: Vec<f32>,
    pub(super) x: Vec<f32>,    // [n_tokens, n_embd] residual stream
    pub(super) h: Vec<f32>,    // [n_tokens, n_embd] normed input of a block
    pub(super) q: Vec<f32>,    // [n_tokens, q_dim]
    pub(super) k: Vec<f32>,    // [n_tokens, kv_dim]
    pub(super) v: Vec<f32>,    // [n_tokens, kv_dim]
    pub(super) attn: Vec<f32>, // [n_tokens, q_dim]
    pub(super) o: Vec<f32>,    // [n_tokens, n_embd]
    /// `[n_tokens, n_ff]`, or a routed block's `[n_tokens · n_used, n_ff of an expert]`.
    pub(super) gate: Vec<f32>,
    pub(super) up: Vec<f32>,
    /// Routed experts (all empty for a dense model): the router's scores
    /// `[n_tokens, n_expert]`, each row's experts and weights `[n_tokens, n_used]`, the
    /// routes grouped by expert (`[n_tokens · n_used]`, `[n_expert + 1]` starts, and each
    /// route's slot), and the grouped rows' inputs and outputs `[n_tokens · n_used, n_embd]`.
    pub(super) router: Vec<f32>,
    pub(super) route_experts: Vec<u32>,
    pub(super) route_weights: Vec<f32>,
    pub(super) grouped: Vec<u32>,
    pub(super) expert_starts: Vec<u32>,
    pub(super) route_slots: Vec<u32>,
    pub(super) expert_in: Vec<f32>,
    pub(super) expert_out: Vec<f32>,
    pub(super) linear: LinearScratch,
    /// When set, every projection input's per-channel peaks are recorded here.
    pub calibration: Option<Calibration>,
}

pub(super) fn sized<T: Default + Clone>(buf: &mut Vec<T>, len: usize) -> &mut [T] {
    buf.resize(len, T::default());
    &mut buf[..len]
}

/// The shapes a pass's buffers are sized from besides its rows.
pub(super) struct Widths {
    /// Rows a projection may take: the pass's rows, or its routed rows.
    pub(super) max_rows: usize,
    /// The widest projection input.
    pub(super) max_in: usize,
    /// Values per row of `gate` and `up`.
    pub(super) ffn: usize,
    pub(super) n_expert: usize,
    /// Experts per token.
    pub(super) n_used: usize,
}

impl Widths {
    pub(super) fn of(model: &Model, n_tokens: usize) -> Self {
        let cfg = &model.config;
        let (n_expert, n_used, expert_ff) = cfg
            .experts
            .as_ref()
            .map_or((0, 0, 0), |x| (x.n_expert, x.n_used, x.n_ff));
        Self {
            max_rows: n_tokens.max(n_tokens * n_used),
            max_in: cfg.n_embd.max(cfg.q_dim()).max(cfg.n_ff).max(expert_ff),
            ffn: cfg.n_ff.max(n_used * expert_ff),
            n_expert,
            n_used,
        }
    }
}

/// `buf` grown to `len` floats if shorter, never shrunk: a buffer whose length follows
/// the longest sequence is not cleared again each time a shorter pass comes between.
pub(super) fn at_least(buf: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if buf.len() < len {
        buf.resize(len, 0.0);
    }
    buf
}

impl Scratch {
    /// Buffers for passes of up to `n_tokens` rows returning logits for up to `n_outputs`
    /// of them, over caches of up to `window` positions on a pool of `n_threads`,
    /// allocated now so that running never allocates.
    pub fn for_shape(
        model: &Model,
        n_tokens: usize,
        n_outputs: usize,
        window: usize,
        n_threads: usize,
    ) -> Self {
        let cfg = &model.config;
        let (e, qd, kvd) = (cfg.n_embd, cfg.q_dim(), cfg.kv_dim());
        let widths = Widths::of(model, n_tokens);
        let routes = n_tokens * widths.n_used;
        let with = |len: usize| Vec::with_capacity(len);
        Self {
            places: Vec::with_capacity(n_tokens),
            blocks: Vec::with_capacity(n_tokens),
            single_rows: Vec::with_capacity(n_tokens),
            logit_rows: Vec::with_capacity(n_outputs),
            pooled_rows: Vec::with_capacity(n_tokens),
            normed: with(n_outputs * e),
            logits: with(n_outputs * cfg.n_vocab),
            scores: (0..n_threads)
                .map(|_| Mutex::new(Vec::with_capacity(scratch_len(window, n_tokens))))
                .collect(),
            meeting: with(if n_threads > 1 {
                meeting_len(window, n_tokens.min(MAX_ROWS), n_threads)
            } else {
                0
            }),
            x: with(n_tokens * e),
            h: with(n_tokens * e),
            q: with(n_tokens * qd),
            k: with(n_tokens * kvd),
            v: with(n_tokens * kvd),
            attn: with(n_tokens * qd),
            o: with(n_tokens * e),
            gate: with(n_tokens * widths.ffn),
            up: with(n_tokens * widths.ffn),
            router: with(n_tokens * widths.n_expert),
            route_experts: Vec::with_capacity(routes),
            route_weights: with(routes),
            grouped: Vec::with_capacity(routes),
            expert_starts: Vec::with_capacity(widths.n_expert + 1),
            route_slots: Vec::with_capacity(routes),
            expert_in: with(routes * e),
            expert_out: with(routes * e),
            linear: LinearScratch::for_shape(widths.max_rows, widths.max_in),
            calibration: None,
        }
    }

    /// Bytes the buffers hold reserved (their capacity, not their current length).
    pub fn reserved_bytes(&self) -> usize {
        fn cap<T>(v: &Vec<T>) -> usize {
            v.capacity() * std::mem::size_of::<T>()
        }
        let floats = [
            &self.meeting,
            &self.normed,
            &self.logits,
            &self.x,
            &self.h,
            &self.q,
            &self.k,
            &self.v,
            &self.attn,
            &self.o,
            &self.gate,
            &self.up,
            &self.router,
            &self.route_weights,
            &self.expert_in,
            &self.expert_out,
        ];
        let indices = [
            &self.route_experts,
            &self.grouped,
            &self.expert_starts,
            &self.route_slots,
        ];
        let scores: usize = self
            .scores
            .iter()
            .map(|s| cap(&s.lock().unwrap_or_else(|p| p.into_inner())))
            .sum();
        cap(&self.places)
            + cap(&self.blocks)
            + cap(&self.single_rows)
            + cap(&self.logit_rows)
            + floats.into_iter().map(cap).sum::<usize>()
            + indices.into_iter().map(cap).sum::<usize>()
            + scores
            + self.linear.reserved_bytes()
    }

    /// Hands the logits of the last [`Model::forward_into`] (`[n_rows, n_vocab]`) to `out`
    /// and keeps `out`'s buffer for the next pass: an exchange, not a copy of rows that are
    /// a whole vocabulary each (6 MB for 32 SmolLM2 rows). A caller that passes back the
    /// buffer it was handed last time keeps both warm, so steps of one size neither
    /// allocate nor zero anything.
    pub fn swap_logits(&mut self, out: &mut Vec<f32>) {
        std::mem::swap(&mut self.logits, out);
    }
}

/// The activations of one pass, shared by the region's threads.
pub(super) struct Buffers<'s> {
    pub(super) x: SharedSlice<'s, f32>, // [n, n_embd] residual stream
    pub(super) h: SharedSlice<'s, f32>, // [n, n_embd] normed input of a block
    pub(super) q: SharedSlice<'s, f32>, // [n, q_dim]
    pub(super) k: SharedSlice<'s, f32>, // [n, kv_dim]
    pub(super) v: SharedSlice<'s, f32>, // [n, kv_dim]
    pub(super) attn: SharedSlice<'s, f32>, // [n, q_dim]
    pub(super) o: SharedSlice<'s, f32>, // [n, n_embd] output of a block, added to `x` next step
    pub(super) gate: SharedSlice<'s, f32>, // [n, n_ff] or [n · n_used, n_ff of an expert]
    pub(super) up: SharedSlice<'s, f32>, // as `gate`
    pub(super) router: SharedSlice<'s, f32>, // [n, n_expert]
    pub(super) route_experts: SharedSlice<'s, u32>, // [n, n_used]
    pub(super) route_weights: SharedSlice<'s, f32>, // [n, n_used]
    pub(super) grouped: SharedSlice<'s, u32>, // [n · n_used] routes, expert by expert
    pub(super) expert_starts: SharedSlice<'s, u32>, // [n_expert + 1]
    pub(super) route_slots: SharedSlice<'s, u32>, // [n · n_used] each route's place in `grouped`
    pub(super) expert_in: SharedSlice<'s, f32>, // [n · n_used, n_embd] grouped rows' inputs
    pub(super) expert_out: SharedSlice<'s, f32>, // [n · n_used, n_embd] and outputs
    pub(super) normed: SharedSlice<'s, f32>, // [n_rows, n_embd]
    pub(super) logits: SharedSlice<'s, f32>, // [n_rows, n_vocab]
    pub(super) prepared: PreparedInput<'s>,
    pub(super) meeting: SharedSlice<'s, f32>, // where a team sharing a block's attention meets
}

/// Everything a region reads besides the weights.
pub(super) struct Pass<'s, 'a> {
    pub(super) places: &'s [RowPlace],
    pub(super) blocks: &'s [(usize, usize)],
    pub(super) single_rows: &'s [(usize, usize)],
    pub(super) logit_rows: &'s [usize],
    pub(super) pooled_rows: &'s [usize],
    pub(super) segments: Segments<'s, 'a>,
    /// Per-thread attention-score buffers.
    pub(super) scores: &'s [Mutex<Vec<f32>>],
    /// Only thread 0 records, after the barrier that completes the recorded buffer.
    pub(super) calibration: Mutex<Option<&'s mut Calibration>>,
    /// What of each block runs: all of it except in a block measured alone.
    pub(super) part: BlockPart,
    /// Whether a block's input is the previous block's (the residual still to add):
    /// false when a block runs alone on a given input.
    pub(super) chained: bool,
    pub(super) bufs: Buffers<'s>,
}

impl Pass<'_, '_> {
    pub(super) fn record(&self, team: &Team, layer: usize, site: Site, x: &[f32], width: usize) {
        if team.idx() != 0 {
            return;
        }
        let mut calibration = self
            .calibration
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(c) = calibration.as_mut() {
            c.record(layer, site, x, width);
        }
    }
}

/// The pass's segments: written (cache stores) by the thread that owns each, read by all
/// after a barrier.
pub(super) struct Segments<'s, 'a> {
    ptr: *mut Segment<'a>,
    pub(super) len: usize,
    _borrow: std::marker::PhantomData<&'s mut [Segment<'a>]>,
}

// SAFETY: access follows the barrier discipline documented on the accessors.
unsafe impl Sync for Segments<'_, '_> {}

impl<'s, 'a> Segments<'s, 'a> {
    pub(super) fn new(segments: &'s mut [Segment<'a>]) -> Self {
        Self {
            ptr: segments.as_mut_ptr(),
            len: segments.len(),
            _borrow: std::marker::PhantomData,
        }
    }

    /// # Safety
    /// No other thread accesses segment `idx` until the next barrier.
    #[allow(clippy::mut_from_ref)]
    pub(super) unsafe fn get_mut(&self, idx: usize) -> &mut Segment<'a> {
        assert!(idx < self.len);
        &mut *self.ptr.add(idx)
    }

    /// # Safety
    /// No thread writes segment `idx` until the next barrier.
    pub(super) unsafe fn get(&self, idx: usize) -> &Segment<'a> {
        assert!(idx < self.len);
        &*self.ptr.add(idx)
    }
}
