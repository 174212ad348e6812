//! The window pyramid on a tiny random-weight model: chunked prefill equals whole
//! prefill, migrated sessions equal sessions started large, and the predictive policy
//! compiles ahead of crossings. Timing-dependent policy checks use a scripted backend
//! (fixed compile and step times) so they do not depend on this machine's speed.

use std::sync::Arc;
use std::time::Duration;

use pyramid_engine::replay::{resolve, run_arm, tokens_identical, Append, ReplaySetup, TraceStep};
use pyramid_engine::{
    Arm, Engine, EngineConfig, EngineError, PyramidConfig, Request, WindowPyramid,
};
use pyramid_gguf::GgufFile;
use pyramid_kernels::ThreadPool;
use pyramid_model::synthetic::{synthetic_gguf, SyntheticSpec};
use pyramid_model::{Architecture, KvType, LogitsFor, Model, Precision, Scratch, Segment};
use pyramid_runtime::{
    argmax, prefill_chunked, ArtifactShape, Backend, CpuBackend, Executable, RuntimeError,
    WindowLadder,
};

fn tiny(precision: Precision) -> Arc<Model> {
    let bytes = synthetic_gguf(&SyntheticSpec::tiny(Architecture::Qwen2))
        .unwrap()
        .to_bytes();
    let model = Model::from_gguf(&GgufFile::from_bytes(bytes).unwrap()).unwrap();
    Arc::new(model.into_precision(precision, None))
}

fn config(arm: Arm, windows: &[usize], chunk: usize) -> PyramidConfig {
    PyramidConfig {
        ladder: WindowLadder::new(windows.to_vec(), 256).unwrap(),
        prefill_chunk: chunk,
        arm,
        generation_reserve: 0,
        artifact_budget: usize::MAX,
        margin: Duration::from_millis(5),
        first_compile_estimate: Duration::from_millis(10),
    }
}

#[test]
fn chunked_prefill_equals_whole_prefill() {
    let pool = ThreadPool::new(2).unwrap();
    for precision in [Precision::F32, Precision::Int8] {
        let model = tiny(precision);
        let prompt: Vec<u32> = (0..37).map(|i| (i * 7 + 3) % 300).collect();
        let mut kv = model.new_kv_cache(64);
        let whole = model
            .forward(
                &pool,
                &prompt,
                &mut kv,
                &mut Scratch::default(),
                LogitsFor::Last,
            )
            .unwrap();
        let backend = CpuBackend::new(Arc::clone(&model), pool.n_threads());
        for chunk in [1, 5, 16, 37, 64] {
            let exe = backend
                .compile(ArtifactShape::Prefill { chunk, window: 64 })
                .unwrap();
            let mut kv = model.new_kv_cache(64);
            let mut logits = Vec::new();
            prefill_chunked(exe.as_ref(), &pool, &prompt, &mut kv, &mut logits).unwrap();
            assert_eq!(kv.len(), prompt.len());
            let diff = logits
                .iter()
                .zip(&whole)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max);
            assert!(
                diff < 1e-4,
                "{precision} chunk {chunk}: logits differ by {diff}"
            );
            assert_eq!(argmax(&logits), argmax(&whole), "{precision} chunk {chunk}");
        }
    }
}

#[test]
fn artifacts_reject_shapes_they_were_not_compiled_for() {
    let pool = ThreadPool::new(1).unwrap();
    let model = tiny(Precision::F32);
    let backend = CpuBackend::new(Arc::clone(&model), 1);
    let exe = backend
        .compile(ArtifactShape::Decode {
            batch: 2,
            window: 32,
        })
        .unwrap();
    let mut logits = Vec::new();
    let mut wrong_window = model.new_kv_cache(64);
    let err = exe
        .run(
            &pool,
            &mut [Segment::new(&[1], &mut wrong_window)],
            &mut logits,
        )
        .unwrap_err();
    assert!(err.to_string().contains("a cache of 64 positions"), "{err}");
    let mut kv = model.new_kv_cache(32);
    let err = exe
        .run(&pool, &mut [Segment::new(&[1, 2], &mut kv)], &mut logits)
        .unwrap_err();
    assert!(matches!(err, RuntimeError::BadShape { .. }), "{err}");
    assert!(backend
        .compile(ArtifactShape::Prefill {
            chunk: 8,
            window: 1000
        })
        .is_err());
}

fn trace(appends: &[usize], generate: usize) -> Vec<TraceStep> {
    appends
        .iter()
        .enumerate()
        .map(|(i, &n)| TraceStep {
            session: "a".to_string(),
            step: i as u64,
            append: Append::Tokens(n),
            generate,
        })
        .chain((0..3).map(|i| TraceStep {
            session: "b".to_string(),
            step: i,
            append: Append::Tokens(10),
            generate,
        }))
        .collect()
}

fn no_text(_: &str) -> pyramid_engine::Result<Vec<u32>> {
    unreachable!("token-count traces only")
}

/// Session "a" crosses 32, 64 and 128 through both prompts and decodes; every arm must
/// produce exactly the tokens of the session started on the largest window.
#[test]
fn migrated_sessions_equal_sessions_started_large() {
    let pool = ThreadPool::new(2).unwrap();
    for (precision, kv_type) in [
        (Precision::F32, KvType::F32),
        (Precision::Int8, KvType::Int8),
    ] {
        let model = tiny(precision);
        let steps = resolve(
            &trace(&[20, 9, 30, 40, 60], 12),
            model.config.n_vocab,
            &no_text,
        )
        .unwrap();
        let setup = ReplaySetup {
            backend: Arc::new(CpuBackend::new(Arc::clone(&model), 2)),
            model_id: 1,
            kv_type,
            config: config(Arm::Largest, &[32, 64, 128, 256], 16),
            pool: &pool,
        };
        let arms: Vec<_> = Arm::ALL
            .into_iter()
            .map(|arm| run_arm(&setup, arm, &steps, &|_| {}).unwrap())
            .collect();
        assert_eq!(
            tokens_identical(&arms),
            Some(true),
            "{precision}: arms disagree"
        );
        let generated: usize = arms[0].generated.iter().map(|(_, t)| t.len()).sum();
        assert_eq!(generated, 8 * 12);
        for arm in &arms {
            assert!(arm.failed_sessions.is_empty(), "{:?}", arm.failed_sessions);
            match arm.arm {
                Arm::Largest => {
                    assert_eq!((arm.stats.n_migrations, arm.stats.n_reprefills), (0, 0))
                }
                Arm::Reprefill => {
                    assert!(
                        arm.stats.n_reprefills >= 3 && arm.stats.n_migrations == 0,
                        "{arm:?}"
                    )
                }
                Arm::OnDemand | Arm::Predictive => {
                    assert!(
                        arm.stats.n_migrations >= 3 && arm.stats.n_reprefills == 0,
                        "{arm:?}"
                    )
                }
            }
            assert!(arm.kv_bytes_used <= arm.kv_bytes_reserved);
        }
        assert!(arms[3].kv_bytes_reserved < arms[0].kv_bytes_reserved);
    }
}

#[test]
fn a_session_beyond_the_largest_window_fails_alone() {
    let pool = ThreadPool::new(2).unwrap();
    let model = tiny(Precision::F32);
    // "a" needs 300 positions; "b" stays small and must finish normally.
    let steps = resolve(&trace(&[100, 100, 100], 4), model.config.n_vocab, &no_text).unwrap();
    let setup = ReplaySetup {
        backend: Arc::new(CpuBackend::new(Arc::clone(&model), 2)),
        model_id: 1,
        kv_type: KvType::F32,
        config: config(Arm::Predictive, &[64, 128, 256], 16),
        pool: &pool,
    };
    let report = run_arm(&setup, Arm::Predictive, &steps, &|_| {}).unwrap();
    assert_eq!(report.failed_sessions.len(), 1);
    let failure = &report.failed_sessions[0];
    assert_eq!(failure.session, "a");
    assert_eq!(failure.code, Some("context_length_exceeded"));
    assert!(
        failure.error.contains("context length exceeded") && failure.error.contains("256"),
        "{}",
        failure.error
    );
    let b = report.generated.iter().find(|(s, _)| s == "b").unwrap();
    assert_eq!(b.1.len(), 3 * 4);

    let mut engine = static_engine(setup.backend.clone(), config(Arm::OnDemand, &[64], 8));
    let err = engine
        .generate(&pool, Request::greedy(0, vec![1; 65], 1), &mut |_| true)
        .unwrap_err();
    assert!(matches!(
        err,
        EngineError::Runtime(RuntimeError::BeyondLargestWindow {
            needed: 65,
            largest: 64
        })
    ));
}

/// An engine that runs `backend` one sequence at a time on static artifacts.
fn static_engine(backend: Arc<dyn Backend>, pyramid: PyramidConfig) -> Engine {
    let config = EngineConfig {
        pyramid,
        max_batch: 1,
        kv_budget: usize::MAX,
        max_sessions: 8,
        static_shapes: true,
        aging: pyramid_engine::DEFAULT_AGING,
        speculative: pyramid_engine::SpeculativeConfig::default(),
    };
    Engine::new(backend, 1, KvType::F32, config).unwrap()
}

/// A backend with scripted costs: compiling takes `compile`, every run takes at least
/// `run`. The policy sees slow compiles and steady steps without depending on how fast
/// this machine is.
struct Scripted {
    inner: CpuBackend,
    compile: Duration,
    run: Duration,
}

struct ScriptedExe {
    inner: Arc<dyn Executable>,
    run: Duration,
}

impl Executable for ScriptedExe {
    fn shape(&self) -> ArtifactShape {
        self.inner.shape()
    }
    fn bytes(&self) -> usize {
        self.inner.bytes()
    }
    fn executing_device(&self) -> String {
        "scripted".to_string()
    }
    fn run(
        &self,
        pool: &ThreadPool,
        segments: &mut [Segment<'_>],
        logits: &mut Vec<f32>,
    ) -> pyramid_runtime::Result<()> {
        std::thread::sleep(self.run);
        self.inner.run(pool, segments, logits)
    }
}

impl Backend for Scripted {
    fn device(&self) -> String {
        "scripted".to_string()
    }
    fn model(&self) -> &Arc<Model> {
        self.inner.model()
    }
    fn compile(&self, shape: ArtifactShape) -> pyramid_runtime::Result<Arc<dyn Executable>> {
        std::thread::sleep(self.compile);
        Ok(Arc::new(ScriptedExe {
            inner: self.inner.compile(shape)?,
            run: self.run,
        }))
    }
}

#[test]
fn predictive_compiles_ahead_and_a_sudden_jump_stalls_without_changing_tokens() {
    let pool = ThreadPool::new(2).unwrap();
    let model = tiny(Precision::F32);
    let setup_compiling_in = |compile: Duration| ReplaySetup {
        backend: Arc::new(Scripted {
            inner: CpuBackend::new(Arc::clone(&model), 2),
            compile,
            run: Duration::from_millis(15),
        }),
        model_id: 1,
        kv_type: KvType::F32,
        config: config(Arm::Largest, &[48, 96, 192, 256], 16),
        pool: &pool,
    };
    let setup = setup_compiling_in(Duration::from_millis(60));
    // Steady: 24 tokens a step (12 appended, 12 generated ≈ 180 ms of decode), so each
    // crossing is seen a step ahead, with three times the compile time to spare.
    let steady: Vec<TraceStep> = (0..9)
        .map(|i| TraceStep {
            session: "a".to_string(),
            step: i,
            append: Append::Tokens(12),
            generate: 12,
        })
        .collect();
    let steps = resolve(&steady, model.config.n_vocab, &no_text).unwrap();
    let on_demand = run_arm(&setup, Arm::OnDemand, &steps, &|_| {}).unwrap();
    let predictive = run_arm(&setup, Arm::Predictive, &steps, &|_| {}).unwrap();
    assert_eq!(
        tokens_identical(&[on_demand.clone(), predictive.clone()]),
        Some(true)
    );
    assert!(on_demand.stats.n_migrations >= 2 && predictive.stats.n_migrations >= 2);
    assert!(
        on_demand.stats.n_stalls >= 2 && on_demand.stats.stall_ms >= 2.0 * 60.0,
        "on demand waits for every compile: {on_demand:?}"
    );
    assert_eq!(predictive.stats.n_stalls, 0, "{predictive:?}");

    // A sudden jump past the prediction: the session waits for its compile (a measured
    // stall; shorter than a whole compile when the predictor sees the prefill race
    // towards the top of its window and starts it early) and still produces exactly the
    // tokens of the largest window. Compiles here take longer than the jump's whole
    // prefill (ten 15 ms chunks), so even a compile started at the jump's first chunk
    // leaves a stall on a loaded machine, where the chunks run slower.
    let setup = setup_compiling_in(Duration::from_millis(400));
    let mut jump = steady[..3].to_vec();
    jump.push(TraceStep {
        session: "a".to_string(),
        step: 3,
        append: Append::Tokens(150),
        generate: 4,
    });
    let steps = resolve(&jump, model.config.n_vocab, &no_text).unwrap();
    let largest = run_arm(&setup, Arm::Largest, &steps, &|_| {}).unwrap();
    let predictive = run_arm(&setup, Arm::Predictive, &steps, &|_| {}).unwrap();
    assert_eq!(tokens_identical(&[largest, predictive.clone()]), Some(true));
    assert!(
        predictive.stats.n_stalls >= 1 && predictive.stats.stall_ms > 0.0,
        "{predictive:?}"
    );
    assert_eq!(predictive.stats.n_reprefills, 0);
}

/// The real model: a session whose decode crosses 1,024 and whose next prompt crosses
/// 2,048 produces, after two migrations, exactly the tokens of a session started on the
/// 4,096 window; and the INT8 KV cache migrates bit for bit as well.
#[test]
fn smollm2_migrates_across_1024_and_2048_with_identical_tokens() {
    let path = pyramid_testdata::model_path("smollm2-135m-instruct-q4_1.gguf");
    let gguf = GgufFile::open(&path).unwrap();
    let model = Arc::new(Model::from_gguf_with(&gguf, Precision::Int8).unwrap());
    let pool = ThreadPool::with_available_parallelism();
    let steps = [(1000, 40), (1000, 20)]
        .iter()
        .enumerate()
        .map(|(i, &(append, generate))| TraceStep {
            session: "agent".to_string(),
            step: i as u64,
            append: Append::Tokens(append),
            generate,
        })
        .collect::<Vec<_>>();
    let steps = resolve(&steps, model.config.n_vocab, &no_text).unwrap();
    for kv_type in [KvType::F32, KvType::Int8] {
        let setup = ReplaySetup {
            backend: Arc::new(CpuBackend::new(Arc::clone(&model), pool.n_threads())),
            model_id: 1,
            kv_type,
            config: PyramidConfig {
                ladder: WindowLadder::new(vec![1024, 2048, 4096], 8192).unwrap(),
                generation_reserve: 16,
                // What `pyramid replay` uses.
                margin: Duration::from_millis(20),
                first_compile_estimate: Duration::from_millis(50),
                ..config(Arm::Largest, &[256], 128)
            },
            pool: &pool,
        };
        let large = run_arm(&setup, Arm::Largest, &steps, &|_| {}).unwrap();
        let pyramid = run_arm(&setup, Arm::Predictive, &steps, &|_| {}).unwrap();
        // Whether a compile this cheap finished before the crossing depends on the
        // scheduler; the scripted-backend test checks the policy's timing.
        assert_eq!(pyramid.stats.n_migrations, 2, "{kv_type}: {pyramid:?}");
        assert_eq!(
            tokens_identical(&[large.clone(), pyramid]),
            Some(true),
            "{kv_type}"
        );
        assert_eq!(large.generated[0].1.len(), 60);
    }
}

/// A backend that panics compiling one window.
struct Panicky {
    inner: CpuBackend,
    bad_window: usize,
}

impl Backend for Panicky {
    fn device(&self) -> String {
        "panicky".to_string()
    }
    fn model(&self) -> &Arc<Model> {
        self.inner.model()
    }
    fn compile(&self, shape: ArtifactShape) -> pyramid_runtime::Result<Arc<dyn Executable>> {
        assert_ne!(shape.window(), self.bad_window, "scripted compiler crash");
        self.inner.compile(shape)
    }
}

#[test]
fn a_crashing_compile_is_an_error_for_the_session_that_needs_it_not_a_hang() {
    let pool = ThreadPool::new(2).unwrap();
    let model = tiny(Precision::F32);
    let backend = Arc::new(Panicky {
        inner: CpuBackend::new(Arc::clone(&model), 2),
        bad_window: 64,
    });
    for arm in [Arm::OnDemand, Arm::Predictive] {
        let mut engine = static_engine(backend.clone(), config(arm, &[32, 64, 128], 8));
        let mut run = |id, prompt: Vec<u32>| {
            engine.generate(&pool, Request::greedy(id, prompt, 1), &mut |_| true)
        };
        run(0, vec![5; 20]).unwrap();
        let err = run(1, vec![5; 40]).unwrap_err();
        assert!(
            matches!(err, EngineError::Compile { .. }) && err.to_string().contains("panicked"),
            "{arm:?}: {err}"
        );
        // The session is untouched and still usable on its window.
        let done = run(2, vec![5; 25]).unwrap();
        // The failed request's chunks that fitted the window (to 28) stayed cached.
        assert_eq!(done.usage.cached_tokens, 24, "{arm:?}");
        engine.pyramid().join_background();
        let windows: Vec<usize> = engine.stats().artifacts.iter().map(|a| a.0).collect();
        assert_eq!(windows, [32], "{arm:?}");
    }
    let too_big = WindowPyramid::new(backend, 1, KvType::F32, config(Arm::OnDemand, &[32], 33));
    assert!(matches!(too_big, Err(EngineError::BadConfig(_))));
}

#[test]
fn a_trace_asking_for_more_tokens_than_any_replay_could_run_is_refused() {
    use pyramid_engine::replay::MAX_TRACE_TOKENS;
    let no_text = |_: &str| -> pyramid_engine::Result<Vec<u32>> { Ok(Vec::new()) };
    // Seventeen maximal steps (each allowed alone) in one small file.
    let huge = trace(&[MAX_TRACE_TOKENS / 16; 17], 1);
    let err = resolve(&huge, 100, &no_text).unwrap_err().to_string();
    assert!(err.contains("more than 16777216 tokens in all"), "{err}");
    assert!(resolve(&trace(&[MAX_TRACE_TOKENS / 16; 2], 1), 100, &no_text).is_ok());
}

#[test]
fn a_prefill_looks_up_only_the_smaller_windows_its_chunks_step_through() {
    let model = tiny(Precision::F32);
    let backend: Arc<dyn Backend> = Arc::new(CpuBackend::new(Arc::clone(&model), 1));
    let pyramid = Arc::new(
        WindowPyramid::new(
            backend,
            1,
            KvType::F32,
            config(Arm::OnDemand, &[16, 32, 64, 128, 256], 8),
        )
        .unwrap(),
    );
    for window in [16, 32, 64, 256] {
        pyramid.acquire_window(window).unwrap();
    }
    let own = ArtifactShape::Prefill {
        chunk: 8,
        window: 256,
    };
    let windows = |needs| -> Vec<usize> {
        let ready = pyramid.ready_prefills_below(own, needs);
        ready.iter().map(|r| r.shape().window()).collect()
    };
    // From 24 cached positions through 40: 32 and 64 (128 is not compiled).
    assert_eq!(windows(24..=40), [32, 64]);
    // Through 100 the next is 128, not ready; 16 is below the first chunk's need.
    assert_eq!(windows(17..=100), [32, 64]);
    // A chunk at depth 200 needs no smaller window.
    assert_eq!(windows(208..=216), Vec::<usize>::new());
    // Through 20: 32 holds the last chunk, 64 is never reached.
    assert_eq!(windows(8..=20), [16, 32]);
}
