//! Measured affinity: how fast each device runs a model, at every granularity a placement
//! could be decided at, each figure checked against the native f32 computation.
//!
//! An operator's speed on an accelerator depends on what surrounds it (a MatMul compiled
//! alone can run two orders of magnitude slower than inside its block), and whole-model
//! figures can reverse what block figures favour. So one profile measures, per device,
//! precision and stage:
//! - **operator in its block**, priced by ablation: the whole block's time less the time
//!   of the block without attention (or without the FFN), same weights and shapes;
//! - **operator alone** (the control): each projection and the attention core as a
//!   computation of its own, to show how far isolated figures mislead;
//! - **block**: one decoder block, whole and ablated;
//! - **stage**: a compiled prefill chunk through every layer, one decode step at the window;
//! - **model**: a whole generation, prompt then greedy tokens.
//!
//! Modules: [`timing`] (the reps-slope fit), [`check`] (agreement with the f32
//! reference), [`subject`] (what runs), [`profile`] (the measurement plan and its cells),
//! [`report`] (tables, chart and results file), [`predict`] (each level's prediction of
//! the whole model, and a route placed from the best one), [`schedule`] and [`hetero`]
//! (prefill on the native kernels and a device at once), [`split`] (its layers placed by
//! predicting the schedule).

pub mod check;
pub mod hetero;
pub mod predict;
pub mod profile;
pub mod report;
pub mod schedule;
pub mod split;
pub mod subject;
pub mod timing;

pub use profile::{measure, AffinityCell, Level, Plan, Stage, Target};

#[derive(Debug, thiserror::Error)]
pub enum AffinityError {
    #[error(transparent)]
    Model(#[from] pyramid_model::ModelError),
    #[error(transparent)]
    Runtime(#[from] pyramid_runtime::RuntimeError),
    #[error(transparent)]
    OpenVino(#[from] pyramid_openvino::OvError),
    #[error("affinity plan: {0}")]
    Plan(String),
}

pub type Result<T, E = AffinityError> = std::result::Result<T, E>;
