//! A feed-forward block of routed experts (Qwen3-MoE) as the region's threads run it: the
//! router's scores, each row's top-k experts, the rows gathered by expert so that each
//! expert's projections read its weights once for all of its rows, and every row's
//! experts' outputs summed back with their weights.
//!
//! Rows are grouped by a counting sort that keeps row order, and a row's experts are summed
//! in its top-k order, so which rows an expert multiplies and how a row's result adds up
//! never depend on the number of threads: the pass stays the same bit for bit on any pool,
//! as the dense one does.

use pyramid_kernels::{Team, COLUMN_ALIGN};

use super::layer::{gated_cols, project};
use super::scratch::Pass;
use crate::linear::Site;
use crate::weights::{LayerWeights, RoutedFfn};
use crate::Model;

impl Model {
    /// The norm, router, experts and their weighted sum of layer `li` (its input the
    /// residual plus the attention's output in `o` when `add_attention`), ending at a
    /// barrier with the block's output in `o`.
    pub(super) fn routed_ffn_half(
        &self,
        team: &Team,
        pass: &Pass<'_, '_>,
        li: usize,
        layer: &LayerWeights,
        routed: &RoutedFfn,
        add_attention: bool,
    ) {
        let cfg = &self.config;
        let (e, ff, k) = (cfg.n_embd, routed.n_ff(), routed.n_used);
        let n_expert = routed.experts.len();
        let b = &pass.bufs;
        let n = pass.places.len();
        let my_rows = team.split(n, 1);
        // SAFETY (every block below): between two barriers each thread writes only its own
        // rows, routed rows, or columns of a buffer, and reads buffers completed before the
        // last barrier; thread 0 alone writes the grouping.
        unsafe {
            self.residual_norm(
                b,
                my_rows.clone(),
                add_attention,
                &layer.ffn_norm,
                &routed.router,
            )
        };
        team.sync();
        unsafe {
            pass.record(team, li, Site::FfnIn, b.h.as_slice(), e);
            project(
                team,
                &routed.router,
                b.h.as_slice(),
                &b.prepared,
                None,
                &b.router,
                n,
            );
        }
        team.sync();
        unsafe {
            for r in my_rows.clone() {
                route(
                    b.router.range(r * n_expert..(r + 1) * n_expert),
                    routed.normalize,
                    b.route_experts.range_mut(r * k..(r + 1) * k),
                    b.route_weights.range_mut(r * k..(r + 1) * k),
                );
            }
        }
        team.sync();
        if team.idx() == 0 {
            unsafe {
                group_by_expert(
                    b.route_experts.as_slice(),
                    b.expert_starts.range_mut(0..n_expert + 1),
                    b.grouped.range_mut(0..n * k),
                    b.route_slots.range_mut(0..n * k),
                );
            }
        }
        team.sync();
        let expert_of = |i: usize| unsafe {
            let route = b.grouped.range(i..i + 1)[0] as usize;
            &routed.experts[b.route_experts.range(route..route + 1)[0] as usize]
        };
        // Each routed row: its row of `h`, prepared for its expert's gate and up.
        unsafe {
            for i in team.split(n * k, 1) {
                let row = b.grouped.range(i..i + 1)[0] as usize / k;
                let input = b.expert_in.range_mut(i * e..(i + 1) * e);
                input.copy_from_slice(b.h.range(row * e..(row + 1) * e));
                expert_of(i).gate.prepare_rows(input, i..i + 1, &b.prepared);
            }
        }
        team.sync();
        let starts = unsafe { b.expert_starts.range(0..n_expert + 1) };
        let groups = || {
            starts
                .windows(2)
                .enumerate()
                .filter(|(_, w)| w[0] < w[1])
                .map(|(x, w)| (&routed.experts[x], w[0] as usize..w[1] as usize))
        };
        unsafe {
            let my_cols = team.split(ff, COLUMN_ALIGN);
            for (expert, rows) in groups() {
                let input = b.expert_in.range(rows.start * e..rows.end * e);
                let prepared = b.prepared.rows(&expert.gate, rows.clone());
                let out_rows = rows.start * ff..rows.end * ff;
                gated_cols(
                    expert,
                    cfg.activation,
                    input,
                    &prepared,
                    (&b.gate.sub(out_rows.clone()), &b.up.sub(out_rows)),
                    rows.len(),
                    my_cols.clone(),
                );
            }
        }
        team.sync();
        unsafe {
            pass.record(team, li, Site::FfnDown, b.gate.range(0..n * k * ff), ff);
            for i in team.split(n * k, 1) {
                let input = b.gate.range(i * ff..(i + 1) * ff);
                expert_of(i).down.prepare_rows(input, i..i + 1, &b.prepared);
            }
        }
        team.sync();
        unsafe {
            let my_cols = team.split(e, COLUMN_ALIGN);
            for (expert, rows) in groups() {
                let input = b.gate.range(rows.start * ff..rows.end * ff);
                let prepared = b.prepared.rows(&expert.down, rows.clone());
                let out = b.expert_out.sub(rows.start * e..rows.end * e);
                expert
                    .down
                    .forward_cols(input, &prepared, None, &out, rows.len(), my_cols.clone());
            }
        }
        team.sync();
        // Each row's experts summed in its top-k order.
        unsafe {
            for r in my_rows {
                let out = b.o.range_mut(r * e..(r + 1) * e);
                out.fill(0.0);
                for s in r * k..(r + 1) * k {
                    let weight = b.route_weights.range(s..s + 1)[0];
                    let slot = b.route_slots.range(s..s + 1)[0] as usize;
                    for (o, y) in out
                        .iter_mut()
                        .zip(b.expert_out.range(slot * e..(slot + 1) * e))
                    {
                        *o += weight * y;
                    }
                }
            }
        }
        team.sync();
    }
}

/// One row's `k = ids.len()` experts from its router `logits`, best first, with their
/// softmax probabilities (renormalised over the `k` when `normalize`); of equal
/// probabilities the lower expert comes first.
pub(crate) fn route(logits: &[f32], normalize: bool, ids: &mut [u32], weights: &mut [f32]) {
    let top = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let total: f32 = logits.iter().map(|&l| (l - top).exp()).sum();
    for s in 0..ids.len() {
        let mut best: Option<(usize, f32)> = None;
        for (x, &l) in logits.iter().enumerate() {
            let taken = ids[..s].contains(&(x as u32));
            if !taken && best.is_none_or(|(_, b)| l > b) {
                best = Some((x, l));
            }
        }
        // `k` is at most the number of experts, so one is always left.
        let Some((x, l)) = best else { break };
        ids[s] = x as u32;
        weights[s] = (l - top).exp() / total;
    }
    if normalize {
        let chosen: f32 = weights.iter().sum();
        weights.iter_mut().for_each(|w| *w /= chosen);
    }
}

/// The routes (`experts[r * k + s]`: row `r`'s `s`-th expert) grouped by expert, keeping
/// row order within each: `grouped` lists route indices expert by expert, expert `x`'s at
/// `starts[x]..starts[x + 1]`, and `slots[route]` is where a route landed in `grouped`.
pub(crate) fn group_by_expert(
    experts: &[u32],
    starts: &mut [u32],
    grouped: &mut [u32],
    slots: &mut [u32],
) {
    starts.fill(0);
    for &x in experts {
        starts[x as usize + 1] += 1;
    }
    for x in 1..starts.len() {
        starts[x] += starts[x - 1];
    }
    // Each expert's start serves as its cursor, leaving it at the expert's end ...
    for (route, &x) in experts.iter().enumerate() {
        let slot = starts[x as usize];
        starts[x as usize] += 1;
        grouped[slot as usize] = route as u32;
        slots[route] = slot;
    }
    // ... which is the next expert's start.
    let last = starts.len() - 1;
    starts.copy_within(0..last - 1, 1);
    starts[0] = 0;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_route_is_the_top_k_softmax_probabilities_best_first() {
        let logits = [0.5f32, 2.0, -1.0, 2.0, 1.0];
        let total: f32 = logits.iter().map(|l| (l - 2.0f32).exp()).sum();
        let (mut ids, mut weights) = ([0u32; 3], [0f32; 3]);
        route(&logits, false, &mut ids, &mut weights);
        // The tie between experts 1 and 3 goes to the lower.
        assert_eq!(ids, [1, 3, 4]);
        assert_eq!(weights[0], 1.0 / total);
        assert_eq!(weights[2], (-1.0f32).exp() / total);
        route(&logits, true, &mut ids, &mut weights);
        let sum: f32 = weights.iter().sum();
        assert!((sum - 1.0).abs() < 1e-6, "{weights:?}");
        assert!(weights[0] == weights[1] && weights[1] > weights[2]);
    }

    #[test]
    fn routes_group_by_expert_in_row_order() {
        // Three rows, two experts each, over four experts (expert 2 unused).
        let experts = [3u32, 0, 0, 1, 3, 1];
        let (mut starts, mut grouped, mut slots) = ([9u32; 5], [0u32; 6], [0u32; 6]);
        group_by_expert(&experts, &mut starts, &mut grouped, &mut slots);
        assert_eq!(starts, [0, 2, 4, 4, 6]);
        assert_eq!(grouped, [1, 2, 3, 5, 0, 4]);
        for (route, &slot) in slots.iter().enumerate() {
            assert_eq!(grouped[slot as usize] as usize, route);
        }
    }
}
