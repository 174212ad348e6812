//! The measurement plan and its cells: every level, for every target, against the f32
//! reference on the same inputs.

use std::collections::HashMap;
use std::sync::Arc;

use pyramid_kernels::ThreadPool;
use pyramid_model::{BlockPart, KvCache, KvType, LogitsFor, Model, Projection, Scratch};
use pyramid_openvino::{OvBackend, ProbeGraph};
use pyramid_runtime::{ArtifactShape, Backend, CpuBackend, Executable};
use serde::{Deserialize, Serialize};

use crate::check::Agreement;
use crate::subject::{ModelRun, NativeBlock, NativeProjection, StageRun, Subject};
use crate::timing::{reps_slope_alternating_positive, Clock, FitPlan, SlopeFit};
use crate::{AffinityError, Result};

/// The granularity a cell measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    /// An operator inside its block, priced by ablation.
    Operator,
    /// An operator as a computation of its own: the control.
    Isolated,
    Block,
    Stage,
    Model,
}

impl Level {
    pub const ALL: [Level; 5] = [
        Level::Operator,
        Level::Isolated,
        Level::Block,
        Level::Stage,
        Level::Model,
    ];

    pub fn title(self) -> &'static str {
        match self {
            Level::Operator => "operator in its block (ablation)",
            Level::Isolated => "operator alone (control)",
            Level::Block => "decoder block",
            Level::Stage => "stage",
            Level::Model => "whole model",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// `seq` rows over an empty past.
    Prefill,
    /// One row with the window's other positions live.
    Decode,
    /// A prompt of `seq` tokens then `n_gen` greedy tokens.
    EndToEnd,
}

impl Stage {
    pub fn name(self) -> &'static str {
        match self {
            Stage::Prefill => "prefill",
            Stage::Decode => "decode",
            Stage::EndToEnd => "end to end",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "prefill" => Some(Stage::Prefill),
            "decode" => Some(Stage::Decode),
            _ => None,
        }
    }
}

/// What a profile measures.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Plan {
    /// Prefill rows (one chunk) and the end-to-end prompt.
    pub seq: usize,
    /// Positions every stage's cache and graph holds.
    pub window: usize,
    /// Greedy tokens of the end-to-end run.
    pub n_gen: usize,
    /// The block measured: the first attending to every position.
    pub layer: usize,
    pub stages: Vec<Stage>,
    pub fit: FitPlan,
}

/// One device at one precision.
pub struct Target<'a> {
    /// `cpu`, `ov:CPU`, …
    pub device: String,
    /// `f32`, `int8`, …
    pub precision: String,
    pub executor: Executor<'a>,
}

/// What runs a target's computations.
pub enum Executor<'a> {
    /// The native kernels on the model loaded at the target's precision.
    Native {
        model: &'a Arc<Model>,
        pool: &'a ThreadPool,
    },
    OpenVino(Arc<OvBackend>),
}

/// One measured figure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AffinityCell {
    pub level: Level,
    /// What was measured: `attention`, `ffn`, `wq`, `block without ffn`, `stage`, …
    pub unit: String,
    pub stage: Stage,
    pub device: String,
    pub precision: String,
    /// Where the device says it ran.
    pub executed_on: String,
    /// Seconds per call (for the operator level, the difference of two block fits).
    pub seconds: f64,
    /// The fit's relative spread (operators: the two fits' spreads added).
    pub spread: f64,
    /// Against the native f32 output on the same inputs (none for the end-to-end run,
    /// whose check is its tokens).
    pub agreement: Option<Agreement>,
    /// End to end: generated tokens equal to the f32 reference's, from the first.
    pub tokens_matching: Option<usize>,
    /// Why the cell's arithmetic is not the reference's: such cells are kept apart from
    /// the figures.
    pub problem: Option<String>,
}

impl AffinityCell {
    pub fn is_valid(&self) -> bool {
        self.problem.is_none()
    }
}

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// Token ids in the model's vocabulary.
fn tokens(n: usize, n_vocab: usize, seed: u64) -> Vec<u32> {
    values(n, seed)
        .into_iter()
        .map(|v| (((v + 1.0) / 2.0 * n_vocab as f32) as usize).min(n_vocab - 1) as u32)
        .collect()
}

/// An f32 cache of `window` positions, its first `past` filled by the reference model
/// from random tokens: the keys and values a real session at that length holds, which
/// compressed weights must reproduce (random rows would give states no model reaches).
fn cache(reference: &Model, pool: &ThreadPool, window: usize, past: usize) -> Result<KvCache> {
    let cfg = &reference.config;
    let mut kv = KvCache::new(cfg, window, KvType::F32);
    if past > 0 {
        let prompt = tokens(past, cfg.n_vocab, 5);
        reference.forward(
            pool,
            &prompt,
            &mut kv,
            &mut Scratch::default(),
            LogitsFor::Last,
        )?;
    }
    Ok(kv)
}

/// The inputs of one stage's probes.
struct StageInputs {
    rows: usize,
    /// Embeddings of random tokens: the residual stream a first block sees.
    hidden: Vec<f32>,
    /// Queries, keys and values side by side, for the attention core.
    qkv: Vec<f32>,
    kv: KvCache,
}

impl StageInputs {
    fn new(reference: &Model, pool: &ThreadPool, plan: &Plan, stage: Stage) -> Result<Self> {
        let cfg = &reference.config;
        let (rows, past) = match stage {
            Stage::Prefill => (plan.seq, 0),
            _ => (1, plan.window - 1),
        };
        let mut hidden = vec![0.0; rows * cfg.n_embd];
        for (row, &t) in hidden
            .chunks_exact_mut(cfg.n_embd)
            .zip(&tokens(rows, cfg.n_vocab, 1))
        {
            reference.weights.embed(t as usize, row);
            row.iter_mut().for_each(|v| *v *= cfg.embedding_scale);
        }
        let qkv = values(rows * BlockPart::AttentionCore.input_width(cfg), 2);
        Ok(Self {
            rows,
            hidden,
            qkv,
            kv: cache(reference, pool, plan.window, past)?,
        })
    }

    fn block_input(&self, part: BlockPart) -> &[f32] {
        match part {
            BlockPart::AttentionCore => &self.qkv,
            _ => &self.hidden,
        }
    }

    fn projection_input(&self, n_in: usize, p: Projection) -> Vec<f32> {
        values(self.rows * n_in, 10 + p as u64)
    }
}

/// Measures `plan` on every target. `reference` is the f32 model (its native kernels give
/// every check's expected output), `pool` the threads native runs use; `progress` hears
/// what is being measured.
pub fn measure(
    plan: &Plan,
    reference: &Arc<Model>,
    pool: &ThreadPool,
    targets: &[Target<'_>],
    clock: &mut dyn Clock,
    progress: &mut dyn FnMut(&str),
) -> Result<Vec<AffinityCell>> {
    let cfg = &reference.config;
    if plan.seq == 0 || plan.seq > plan.window || plan.window > cfg.n_ctx_train {
        return Err(AffinityError::Plan(format!(
            "the prefill rows ({}) must be in 1..=window ({}), the window at most the model's context ({})",
            plan.seq, plan.window, cfg.n_ctx_train
        )));
    }
    if plan.layer >= cfg.n_layer {
        return Err(AffinityError::Plan(format!(
            "layer {} of a {}-layer model",
            plan.layer, cfg.n_layer
        )));
    }
    let mut cells = Vec::new();
    let mut m = Measurer {
        plan,
        clock,
        progress,
        cells: &mut cells,
    };
    let reference_backend: Arc<dyn Backend> =
        Arc::new(CpuBackend::new(Arc::clone(reference), pool.n_threads()));
    // Stage executables per target, reused end to end.
    let mut compiled: HashMap<(usize, Stage), Arc<dyn Executable>> = HashMap::new();
    for &stage in &plan.stages {
        let inputs = StageInputs::new(reference, pool, plan, stage)?;
        m.blocks(reference, pool, targets, stage, &inputs)?;
        m.projections(reference, pool, targets, stage, &inputs)?;
        let shape = stage_shape(plan, stage);
        let mut reference_run = StageRun::new(
            reference_backend.compile(shape)?,
            pool,
            tokens(inputs.rows, cfg.n_vocab, 3),
            inputs.kv.clone(),
        );
        reference_run.run()?;
        let expected = reference_run.output()?;
        for (i, target) in targets.iter().enumerate() {
            (m.progress)(&format!(
                "{} {} {} stage",
                target.device,
                target.precision,
                stage.name()
            ));
            let backend = stage_backend(target);
            let executable = backend.compile(shape)?;
            compiled.insert((i, stage), Arc::clone(&executable));
            let mut run = StageRun::new(
                executable,
                target_pool(target, pool),
                reference_run.tokens.clone(),
                inputs.kv.clone(),
            );
            m.cell(
                Level::Stage,
                "stage",
                stage,
                target,
                &mut run,
                &expected,
                None,
            )?;
        }
    }
    if plan.stages.contains(&Stage::Prefill) && plan.stages.contains(&Stage::Decode) {
        let prompt = tokens(plan.seq, cfg.n_vocab, 4);
        let mut reference_run = ModelRun::new(
            reference_backend.compile(stage_shape(plan, Stage::Prefill))?,
            reference_backend.compile(stage_shape(plan, Stage::Decode))?,
            pool,
            prompt.clone(),
            plan.n_gen,
            KvCache::new(cfg, plan.window, KvType::F32),
        );
        reference_run.run()?;
        let expected = reference_run.output()?;
        for (i, target) in targets.iter().enumerate() {
            (m.progress)(&format!(
                "{} {} end to end",
                target.device, target.precision
            ));
            let mut run = ModelRun::new(
                Arc::clone(&compiled[&(i, Stage::Prefill)]),
                Arc::clone(&compiled[&(i, Stage::Decode)]),
                target_pool(target, pool),
                prompt.clone(),
                plan.n_gen,
                KvCache::new(cfg, plan.window, KvType::F32),
            );
            let fit = m.fit(&mut run)?;
            let got = run.output()?;
            let matching = expected
                .iter()
                .zip(&got)
                .take_while(|(a, b)| a == b)
                .count();
            let problem = (target.precision == "f32" && matching < expected.len()).then(|| {
                format!(
                    "greedy tokens differ from the native f32 run's at token {matching} of {}",
                    expected.len()
                )
            });
            let unit = format!("prompt {} + {} tokens", plan.seq, plan.n_gen);
            m.push(
                Level::Model,
                &unit,
                Stage::EndToEnd,
                target,
                &run,
                fit,
                None,
                problem,
            );
            m.cells.last_mut().expect("just pushed").tokens_matching = Some(matching);
        }
    }
    Ok(cells)
}

fn stage_shape(plan: &Plan, stage: Stage) -> ArtifactShape {
    match stage {
        Stage::Prefill => ArtifactShape::Prefill {
            chunk: plan.seq,
            window: plan.window,
        },
        _ => ArtifactShape::Decode {
            batch: 1,
            window: plan.window,
        },
    }
}

fn stage_backend(target: &Target<'_>) -> Arc<dyn Backend> {
    match &target.executor {
        Executor::Native { model, pool } => {
            Arc::new(CpuBackend::new(Arc::clone(model), pool.n_threads()))
        }
        Executor::OpenVino(ov) => Arc::clone(ov) as Arc<dyn Backend>,
    }
}

/// The threads a target's stages run on: its own for native targets; an OpenVINO
/// device brings its own, and the pool only carries the host's share of the work.
fn target_pool<'a>(target: &Target<'a>, pool: &'a ThreadPool) -> &'a ThreadPool {
    match &target.executor {
        Executor::Native { pool, .. } => pool,
        Executor::OpenVino(_) => pool,
    }
}

struct Measurer<'p, 'c> {
    plan: &'p Plan,
    clock: &'c mut dyn Clock,
    progress: &'c mut dyn FnMut(&str),
    cells: &'c mut Vec<AffinityCell>,
}

/// Times a fit whose per-call time came out zero or negative (noise, not the call) is
/// taken again before its cell is recorded.
const NOISY_FIT_RETRIES: usize = 3;

impl Measurer<'_, '_> {
    fn fit(&mut self, subject: &mut dyn Subject) -> Result<SlopeFit> {
        Ok(self.fit_alternating(&mut [subject])?.remove(0))
    }

    fn fit_alternating(&mut self, subjects: &mut [&mut dyn Subject]) -> Result<Vec<SlopeFit>> {
        let mut calls: Vec<_> = subjects.iter_mut().map(|s| move || s.run()).collect();
        let mut refs: Vec<&mut dyn FnMut() -> Result<()>> = calls
            .iter_mut()
            .map(|c| c as &mut dyn FnMut() -> Result<()>)
            .collect();
        reps_slope_alternating_positive(self.plan.fit, self.clock, &mut refs, NOISY_FIT_RETRIES)
    }

    /// Fits `subject`, checks its output against `expected` and records the cell.
    #[allow(clippy::too_many_arguments)]
    fn cell(
        &mut self,
        level: Level,
        unit: &str,
        stage: Stage,
        target: &Target<'_>,
        subject: &mut dyn Subject,
        expected: &[f32],
        residual: Option<&[f32]>,
    ) -> Result<()> {
        let fit = self.fit(subject)?;
        self.check(level, unit, stage, target, subject, fit, expected, residual)?;
        Ok(())
    }

    /// Records the cell of `fit`, its subject's output checked against `expected`;
    /// returns why it is invalid, if it is.
    #[allow(clippy::too_many_arguments)]
    fn check(
        &mut self,
        level: Level,
        unit: &str,
        stage: Stage,
        target: &Target<'_>,
        subject: &dyn Subject,
        fit: SlopeFit,
        expected: &[f32],
        residual: Option<&[f32]>,
    ) -> Result<Option<String>> {
        let agreement = Agreement::of(expected, &subject.output()?, residual);
        let problem = match &agreement {
            None => Some("the output's shape differs from the reference's".to_string()),
            Some(a) => a.problem(&target.precision),
        };
        self.push(
            level,
            unit,
            stage,
            target,
            subject,
            fit,
            agreement,
            problem.clone(),
        );
        Ok(problem)
    }

    #[allow(clippy::too_many_arguments)]
    fn push(
        &mut self,
        level: Level,
        unit: &str,
        stage: Stage,
        target: &Target<'_>,
        subject: &dyn Subject,
        fit: SlopeFit,
        agreement: Option<Agreement>,
        problem: Option<String>,
    ) {
        self.cells.push(AffinityCell {
            level,
            unit: unit.to_string(),
            stage,
            device: target.device.clone(),
            precision: target.precision.clone(),
            executed_on: subject.executed_on(),
            seconds: fit.seconds,
            spread: fit.spread,
            agreement,
            tokens_matching: None,
            problem,
        });
    }

    /// The block, whole and ablated, fitted in alternation, with attention and the FFN
    /// priced as their paired differences; then the attention core alone.
    fn blocks(
        &mut self,
        reference: &Model,
        pool: &ThreadPool,
        targets: &[Target<'_>],
        stage: Stage,
        inputs: &StageInputs,
    ) -> Result<()> {
        const PARTS: [BlockPart; 3] = [
            BlockPart::Whole,
            BlockPart::WithoutAttention,
            BlockPart::WithoutFfn,
        ];
        let layer = self.plan.layer;
        let expected = |part: BlockPart| -> Result<Vec<f32>> {
            let input = inputs.block_input(part).to_vec();
            let mut native =
                NativeBlock::new(reference, pool, layer, part, input, inputs.kv.clone());
            native.run()?;
            native.output()
        };
        let expected_parts = PARTS
            .iter()
            .map(|&part| expected(part))
            .collect::<Result<Vec<_>>>()?;
        let expected_core = expected(BlockPart::AttentionCore)?;
        for target in targets {
            (self.progress)(&format!(
                "{} {} {} block, whole and ablated",
                target.device,
                target.precision,
                stage.name()
            ));
            let mut subjects = PARTS
                .iter()
                .map(|&part| self.block_subject(target, part, inputs))
                .collect::<Result<Vec<_>>>()?;
            let mut refs: Vec<&mut dyn Subject> = subjects
                .iter_mut()
                .map(|s| &mut **s as &mut dyn Subject)
                .collect();
            let fits = self.fit_alternating(&mut refs)?;
            let mut problems = Vec::new();
            for ((part, subject), (fit, expected)) in PARTS
                .iter()
                .zip(&subjects)
                .zip(fits.iter().zip(&expected_parts))
            {
                let residual = Some(inputs.block_input(*part));
                let problem = self.check(
                    Level::Block,
                    part.name(),
                    stage,
                    target,
                    &**subject,
                    fit.clone(),
                    expected,
                    residual,
                )?;
                problems.push(problem);
            }
            for (unit, without) in [("attention", 1), ("ffn", 2)] {
                let problem = problems[0]
                    .clone()
                    .or_else(|| problems[without].clone())
                    .map(|p| format!("from an invalid block: {p}"));
                let fit = fits[0].minus(&fits[without]);
                self.push(
                    Level::Operator,
                    unit,
                    stage,
                    target,
                    &*subjects[0],
                    fit,
                    None,
                    problem,
                );
            }
            (self.progress)(&format!(
                "{} {} {} attention core",
                target.device,
                target.precision,
                stage.name()
            ));
            let mut core = self.block_subject(target, BlockPart::AttentionCore, inputs)?;
            let fit = self.fit(&mut *core)?;
            self.check(
                Level::Isolated,
                BlockPart::AttentionCore.name(),
                stage,
                target,
                &*core,
                fit,
                &expected_core,
                None,
            )?;
        }
        Ok(())
    }

    /// `part` of the plan's block on `target`, its inputs bound.
    fn block_subject<'t>(
        &self,
        target: &'t Target<'_>,
        part: BlockPart,
        inputs: &StageInputs,
    ) -> Result<Box<dyn Subject + 't>> {
        let input = inputs.block_input(part);
        Ok(match &target.executor {
            Executor::Native { model, pool } => Box::new(NativeBlock::new(
                model,
                pool,
                self.plan.layer,
                part,
                input.to_vec(),
                inputs.kv.clone(),
            )),
            Executor::OpenVino(ov) => {
                let mut probe = ov.compile_probe(
                    ProbeGraph::Block(part),
                    self.plan.layer,
                    inputs.rows,
                    self.plan.window,
                )?;
                probe.prepare(input, &inputs.kv)?;
                Box::new(probe)
            }
        })
    }

    /// Each projection alone on every target.
    fn projections(
        &mut self,
        reference: &Model,
        pool: &ThreadPool,
        targets: &[Target<'_>],
        stage: Stage,
        inputs: &StageInputs,
    ) -> Result<()> {
        let layer = self.plan.layer;
        let weights = &reference.weights.layers[layer];
        // A layer of routed experts has no one FFN projection: its experts are priced
        // within the block.
        for p in Projection::ALL {
            let Some(linear) = p.weight(weights) else {
                continue;
            };
            let input = inputs.projection_input(linear.n_in(), p);
            let mut native = NativeProjection::new(linear, p.bias(weights), pool, input.clone());
            native.run()?;
            let expected = native.output()?;
            for target in targets {
                match &target.executor {
                    Executor::Native { model, pool } => {
                        let own = &model.weights.layers[layer];
                        let Some(own_linear) = p.weight(own) else {
                            continue;
                        };
                        let mut subject =
                            NativeProjection::new(own_linear, p.bias(own), pool, input.clone());
                        self.cell(
                            Level::Isolated,
                            p.name(),
                            stage,
                            target,
                            &mut subject,
                            &expected,
                            None,
                        )?;
                    }
                    Executor::OpenVino(ov) => {
                        let mut probe = ov.compile_probe(
                            ProbeGraph::Projection(p),
                            layer,
                            inputs.rows,
                            self.plan.window,
                        )?;
                        probe.prepare(&input, &inputs.kv)?;
                        self.cell(
                            Level::Isolated,
                            p.name(),
                            stage,
                            target,
                            &mut probe,
                            &expected,
                            None,
                        )?;
                    }
                }
            }
        }
        Ok(())
    }
}
