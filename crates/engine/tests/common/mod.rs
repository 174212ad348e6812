//! The fake backend the scheduler tests run the engine core on.
//!
//! The fake's "model" stores each token id as its key and answers with a token derived
//! from everything in the cache, so a token comes out right only if the cache holds
//! exactly the sequence's history: a lost, duplicated or mis-migrated position changes
//! every later token.
#![allow(dead_code)] // each test file uses its own part of the harness

use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyramid_engine::{Arm, Engine, EngineConfig, Event, FinishReason, PyramidConfig, RequestId};
use pyramid_gguf::GgufFile;
use pyramid_kernels::attention::KvRows;
use pyramid_kernels::ThreadPool;
use pyramid_model::synthetic::{synthetic_gguf, SyntheticSpec};
use pyramid_model::{Architecture, KvType, Model, Precision, Segment};
use pyramid_runtime::artifact::check_fits;
use pyramid_runtime::{ArtifactShape, Backend, Executable, WindowLadder};

pub fn tiny() -> Arc<Model> {
    Arc::new(tiny_model())
}

/// The tiny model in `precision`, for tests that run its real kernels.
pub fn tiny_as(precision: Precision) -> Arc<Model> {
    Arc::new(tiny_model().into_precision(precision, None))
}

fn tiny_model() -> Model {
    let bytes = synthetic_gguf(&SyntheticSpec::tiny(Architecture::Llama))
        .unwrap()
        .to_bytes();
    Model::from_gguf(&GgufFile::from_bytes(bytes).unwrap()).unwrap()
}

/// Compiles in `compile` time; counts compiles and runs per shape.
pub struct Fake {
    pub model: Arc<Model>,
    compile: Duration,
    mixed: bool,
    pub compiled: Mutex<Vec<ArtifactShape>>,
    runs: Arc<Mutex<Vec<(ArtifactShape, usize)>>>,
}

impl Fake {
    pub fn new(compile: Duration, mixed: bool) -> Arc<Self> {
        Arc::new(Self {
            model: tiny(),
            compile,
            mixed,
            compiled: Mutex::default(),
            runs: Arc::default(),
        })
    }

    pub fn runs(&self) -> Vec<(ArtifactShape, usize)> {
        std::mem::take(&mut self.runs.lock().unwrap())
    }
}

pub struct FakeExe {
    shape: ArtifactShape,
    n_vocab: usize,
    head_dim: usize,
    runs: Arc<Mutex<Vec<(ArtifactShape, usize)>>>,
}

/// The fake model's next token after a cache holding `history`.
pub fn next_token(history: &[u32], n_vocab: usize) -> u32 {
    let h = history
        .iter()
        .fold(17u64, |h, &t| h.wrapping_mul(31).wrapping_add(u64::from(t)));
    (h % n_vocab as u64) as u32
}

impl Executable for FakeExe {
    fn shape(&self) -> ArtifactShape {
        self.shape
    }
    fn bytes(&self) -> usize {
        1000
    }
    fn executing_device(&self) -> String {
        "fake".to_string()
    }
    fn run(
        &self,
        _pool: &ThreadPool,
        segments: &mut [Segment<'_>],
        logits: &mut Vec<f32>,
    ) -> pyramid_runtime::Result<()> {
        check_fits(self.shape, segments)?;
        self.runs.lock().unwrap().push((self.shape, segments.len()));
        logits.clear();
        let hd = self.head_dim;
        for seg in segments.iter_mut() {
            let n = seg.n_real();
            let pos = seg.kv.len();
            for (i, &t) in seg.tokens[..n].iter().enumerate() {
                let row = vec![t as f32; hd];
                seg.kv.write_head_rows(0, 0, pos + i, &row, &row).unwrap();
            }
            seg.kv.commit(n).unwrap();
            let KvRows::F32 { keys, .. } = seg.kv.head(0, 0, seg.kv.len()) else {
                unreachable!("the fake runs f32 caches")
            };
            let history: Vec<u32> = keys.chunks_exact(hd).map(|k| k[0] as u32).collect();
            let mut row = vec![0.0; self.n_vocab];
            row[next_token(&history, self.n_vocab) as usize] = 1.0;
            logits.extend_from_slice(&row);
        }
        Ok(())
    }
}

impl Backend for Fake {
    fn device(&self) -> String {
        "fake".to_string()
    }
    fn model(&self) -> &Arc<Model> {
        &self.model
    }
    fn compile(&self, shape: ArtifactShape) -> pyramid_runtime::Result<Arc<dyn Executable>> {
        std::thread::sleep(self.compile);
        self.compiled.lock().unwrap().push(shape);
        Ok(Arc::new(FakeExe {
            shape,
            n_vocab: self.model.config.n_vocab,
            head_dim: self.model.config.head_dim,
            runs: Arc::clone(&self.runs),
        }))
    }
    fn runs_mixed_passes(&self) -> bool {
        self.mixed
    }
}

pub fn config(arm: Arm, windows: &[usize], chunk: usize, max_batch: usize) -> EngineConfig {
    EngineConfig {
        pyramid: PyramidConfig {
            ladder: WindowLadder::new(windows.to_vec(), 256).unwrap(),
            prefill_chunk: chunk,
            arm,
            generation_reserve: 0,
            artifact_budget: usize::MAX,
            margin: Duration::from_millis(5),
            first_compile_estimate: Duration::from_millis(10),
        },
        max_batch,
        kv_budget: usize::MAX,
        max_sessions: 16,
        static_shapes: false,
        aging: pyramid_engine::DEFAULT_AGING,
        speculative: pyramid_engine::SpeculativeConfig::default(),
    }
}

pub fn engine(backend: &Arc<Fake>, config: EngineConfig) -> Engine {
    Engine::new(backend.clone(), 1, KvType::F32, config).unwrap()
}

pub fn prompt(seed: u32, n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| (seed * 101 + i * 7) % 250).collect()
}

/// Steps until every request ended; each one's tokens and finish reason.
pub fn drain(engine: &mut Engine, pool: &ThreadPool) -> Vec<(RequestId, Vec<u32>, FinishReason)> {
    let mut tokens: Vec<(RequestId, Vec<u32>)> = Vec::new();
    let mut done = Vec::new();
    for _ in 0..10_000 {
        if !engine.has_work() {
            break;
        }
        for event in engine.step(pool) {
            match event {
                Event::Token { id, token, .. } => match tokens.iter_mut().find(|t| t.0 == id) {
                    Some(t) => t.1.push(token),
                    None => tokens.push((id, vec![token])),
                },
                Event::Finished { id, reason, .. } => {
                    let t = tokens
                        .iter()
                        .find(|t| t.0 == id)
                        .map(|t| t.1.clone())
                        .unwrap_or_default();
                    done.push((id, t, reason));
                }
                Event::Failed { id, error } => panic!("request {id} failed: {error}"),
                Event::Started { .. } | Event::Embedding { .. } => {}
            }
        }
    }
    assert!(!engine.has_work(), "the engine did not finish");
    done.sort_by_key(|d| d.0);
    done
}

/// What the fake model generates after `prompt`, computed without the engine.
pub fn expected(prompt: &[u32], n: usize, n_vocab: usize) -> Vec<u32> {
    let mut history = prompt.to_vec();
    let mut out = Vec::new();
    for _ in 0..n {
        let t = next_token(&history, n_vocab);
        out.push(t);
        history.push(t);
    }
    out
}
