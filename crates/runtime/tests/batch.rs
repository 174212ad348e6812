//! `step_batch` against sessions run alone, on a tiny random-weight model.

use std::sync::Arc;

use pyramid_gguf::GgufFile;
use pyramid_kernels::ThreadPool;
use pyramid_model::synthetic::{synthetic_gguf, SyntheticSpec};
use pyramid_model::{Architecture, Model};
use pyramid_runtime::{step_batch, RuntimeError, Scratch, Session};

fn tiny(seed: u64) -> Arc<Model> {
    let spec = SyntheticSpec {
        seed,
        ..SyntheticSpec::tiny(Architecture::Llama)
    };
    let bytes = synthetic_gguf(&spec).unwrap().to_bytes();
    Arc::new(Model::from_gguf(&GgufFile::from_bytes(bytes).unwrap()).unwrap())
}

#[test]
fn batched_steps_equal_sessions_alone_and_keep_their_tokens() {
    let pool = ThreadPool::new(2).unwrap();
    let model = tiny(1);
    let prompts: [&[u32]; 3] = [&[1, 2, 3], &[10, 20, 30, 40, 50], &[7]];

    let mut alone: Vec<Session> = prompts
        .iter()
        .map(|_| Session::new(model.clone(), 4))
        .collect();
    let mut expected = Vec::new();
    for (s, p) in alone.iter_mut().zip(prompts) {
        s.prefill(&pool, p).unwrap();
        expected.push(s.decode(&pool, 5).unwrap());
    }

    let mut batch: Vec<Session> = prompts
        .iter()
        .map(|_| Session::new(model.clone(), 4))
        .collect();
    let mut scratch = Scratch::default();
    let mut refs: Vec<&mut Session> = batch.iter_mut().collect();
    step_batch(&pool, &mut refs, &prompts, &mut scratch).unwrap();
    let got = step_batch(&pool, &mut refs, &[&[5], &[5], &[5]], &mut scratch).unwrap();
    assert_eq!(got, expected);
    for (b, a) in batch.iter().zip(&alone) {
        assert_eq!(b.tokens(), a.tokens());
    }
}

#[test]
fn a_batch_of_two_models_is_refused() {
    let pool = ThreadPool::new(1).unwrap();
    let (mut a, mut b) = (Session::new(tiny(1), 4), Session::new(tiny(2), 4));
    let err = step_batch(
        &pool,
        &mut [&mut a, &mut b],
        &[&[1], &[1]],
        &mut Scratch::default(),
    )
    .unwrap_err();
    assert!(matches!(err, RuntimeError::MixedModels));
    assert!(a.tokens().is_empty() && b.tokens().is_empty());
}
