//! What is timed: one call of a computation on one device, with its output kept for the
//! check against the f32 reference.
//!
//! - [`NativeBlock`], [`NativeProjection`]: the native kernels on a block (or part) and on
//!   one projection, as a forward pass runs them.
//! - [`OvProbe`]: the same computation as an OpenVINO graph of its own.
//! - [`StageRun`]: one run of a compiled stage (a prefill chunk, a decode step) on any
//!   backend.
//! - [`ModelRun`]: a whole generation, prompt and greedy tokens, through a route's stages.

use std::sync::Arc;

use pyramid_kernels::ThreadPool;
use pyramid_model::linear::LinearScratch;
use pyramid_model::{BlockPart, KvCache, Linear, Model, Scratch, Segment};
use pyramid_openvino::OvProbe;
use pyramid_runtime::{argmax, Executable};

use crate::Result;

/// One computation on one device.
pub trait Subject {
    /// One call: what the fit repeats.
    fn run(&mut self) -> Result<()>;
    /// The last call's output.
    fn output(&self) -> Result<Vec<f32>>;
    /// Where it really ran, as the device reports it.
    fn executed_on(&self) -> String;
}

/// A block or a part of one on the native kernels ([`Model::run_block`]).
pub struct NativeBlock<'a> {
    pub model: &'a Model,
    pub pool: &'a ThreadPool,
    pub layer: usize,
    pub part: BlockPart,
    pub input: Vec<f32>,
    pub kv: KvCache,
    output: Vec<f32>,
    scratch: Scratch,
}

impl<'a> NativeBlock<'a> {
    /// `input` rows run after `kv`'s live positions, as [`Model::run_block`] takes them.
    pub fn new(
        model: &'a Model,
        pool: &'a ThreadPool,
        layer: usize,
        part: BlockPart,
        input: Vec<f32>,
        kv: KvCache,
    ) -> Self {
        let rows = input.len() / part.input_width(&model.config);
        Self {
            output: vec![0.0; rows * part.output_width(&model.config)],
            model,
            pool,
            layer,
            part,
            input,
            kv,
            scratch: Scratch::default(),
        }
    }
}

impl Subject for NativeBlock<'_> {
    fn run(&mut self) -> Result<()> {
        Ok(self.model.run_block(
            self.pool,
            self.layer,
            self.part,
            &self.input,
            &mut self.output,
            &mut self.kv,
            &mut self.scratch,
        )?)
    }

    fn output(&self) -> Result<Vec<f32>> {
        Ok(self.output.clone())
    }

    fn executed_on(&self) -> String {
        format!("cpu ({})", pyramid_kernels::isa::active().name())
    }
}

/// One projection on the native kernels, as a region of its own ([`Linear::forward`]).
pub struct NativeProjection<'a> {
    pub linear: &'a Linear,
    pub bias: Option<&'a [f32]>,
    pub pool: &'a ThreadPool,
    pub input: Vec<f32>,
    rows: usize,
    output: Vec<f32>,
    scratch: LinearScratch,
}

impl<'a> NativeProjection<'a> {
    pub fn new(
        linear: &'a Linear,
        bias: Option<&'a [f32]>,
        pool: &'a ThreadPool,
        input: Vec<f32>,
    ) -> Self {
        let rows = input.len() / linear.n_in();
        Self {
            output: vec![0.0; rows * linear.n_out()],
            scratch: LinearScratch::for_shape(rows, linear.n_in()),
            linear,
            bias,
            pool,
            input,
            rows,
        }
    }
}

impl Subject for NativeProjection<'_> {
    fn run(&mut self) -> Result<()> {
        self.linear.forward(
            self.pool,
            &self.input,
            self.bias,
            &mut self.output,
            self.rows,
            &mut self.scratch,
        );
        Ok(())
    }

    fn output(&self) -> Result<Vec<f32>> {
        Ok(self.output.clone())
    }

    fn executed_on(&self) -> String {
        format!("cpu ({})", pyramid_kernels::isa::active().name())
    }
}

impl Subject for OvProbe {
    fn run(&mut self) -> Result<()> {
        Ok(OvProbe::run(self)?)
    }

    fn output(&self) -> Result<Vec<f32>> {
        Ok(OvProbe::output(self)?)
    }

    fn executed_on(&self) -> String {
        self.executing_device().to_string()
    }
}

/// One run of a compiled stage over a cache at a fixed length, which every call restores.
pub struct StageRun<'a> {
    pub executable: Arc<dyn Executable>,
    pub pool: &'a ThreadPool,
    pub tokens: Vec<u32>,
    pub kv: KvCache,
    logits: Vec<f32>,
}

impl<'a> StageRun<'a> {
    /// `tokens` run after `kv`'s live positions.
    pub fn new(
        executable: Arc<dyn Executable>,
        pool: &'a ThreadPool,
        tokens: Vec<u32>,
        kv: KvCache,
    ) -> Self {
        Self {
            executable,
            pool,
            tokens,
            kv,
            logits: Vec::new(),
        }
    }
}

impl Subject for StageRun<'_> {
    fn run(&mut self) -> Result<()> {
        let past = self.kv.len();
        let mut segments = [Segment::new(&self.tokens, &mut self.kv)];
        let result = self
            .executable
            .run(self.pool, &mut segments, &mut self.logits);
        self.kv.truncate(past);
        Ok(result?)
    }

    fn output(&self) -> Result<Vec<f32>> {
        Ok(self.logits.clone())
    }

    fn executed_on(&self) -> String {
        self.executable.executing_device()
    }
}

/// A whole generation on a route: the prompt through the prefill stage, then greedy
/// tokens one decode step each, from an empty cache every call.
pub struct ModelRun<'a> {
    pub prefill: Arc<dyn Executable>,
    pub decode: Arc<dyn Executable>,
    pub pool: &'a ThreadPool,
    /// A whole number of prefill chunks.
    pub prompt: Vec<u32>,
    pub n_gen: usize,
    kv: KvCache,
    logits: Vec<f32>,
    generated: Vec<u32>,
}

impl<'a> ModelRun<'a> {
    pub fn new(
        prefill: Arc<dyn Executable>,
        decode: Arc<dyn Executable>,
        pool: &'a ThreadPool,
        prompt: Vec<u32>,
        n_gen: usize,
        kv: KvCache,
    ) -> Self {
        Self {
            prefill,
            decode,
            pool,
            prompt,
            n_gen,
            kv,
            logits: Vec::new(),
            generated: Vec::new(),
        }
    }
}

impl Subject for ModelRun<'_> {
    fn run(&mut self) -> Result<()> {
        self.kv.truncate(0);
        self.generated.clear();
        let chunk = self.prefill.shape().rows();
        for tokens in self.prompt.chunks(chunk) {
            let mut segments = [Segment::new(tokens, &mut self.kv)];
            self.prefill
                .run(self.pool, &mut segments, &mut self.logits)?;
        }
        for _ in 0..self.n_gen {
            let token = [argmax(&self.logits)];
            self.generated.push(token[0]);
            let mut segments = [Segment::new(&token, &mut self.kv)];
            self.decode
                .run(self.pool, &mut segments, &mut self.logits)?;
        }
        Ok(())
    }

    /// The generated tokens' ids.
    fn output(&self) -> Result<Vec<f32>> {
        Ok(self.generated.iter().map(|&t| t as f32).collect())
    }

    fn executed_on(&self) -> String {
        let (p, d) = (
            self.prefill.executing_device(),
            self.decode.executing_device(),
        );
        if p == d {
            p
        } else {
            format!("{p}->{d}")
        }
    }
}
