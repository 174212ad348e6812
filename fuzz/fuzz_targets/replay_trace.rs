//! Agent-trace parsing for `pyramid replay` (`pyramid_engine::replay::parse_trace`), and
//! resolving the parsed steps into token ids.
//!
//! Input: a JSONL trace (the CLI reads it with `read_to_string`, so non-UTF-8 is skipped).
//! Properties:
//! - parsing returns steps or a `BadTrace` error naming a line of the input, never panics;
//! - there is at most one step per non-blank line, and no count exceeds `MAX_STEP_TOKENS`;
//! - `resolve` gives each token-count step exactly that many ids below `n_vocab`, each text
//!   step the tokenizer's ids, the same on every call, and reports a tokenizer failure as
//!   `BadStep` (resolved only when the whole trace is at most 2¹⁶ tokens, so a run stays
//!   fast: a trace of a few KB may ask for far more, see the fuzzing notes in the report).
#![no_main]

use libfuzzer_sys::fuzz_target;
use pyramid_engine::replay::{parse_trace, resolve, Append, MAX_STEP_TOKENS};
use pyramid_engine::EngineError;

const MAX_RESOLVED_TOKENS: usize = 1 << 16;
/// The synthetic models' vocabulary is about this size; 1 is the smallest a model can have.
const N_VOCABS: [usize; 2] = [300, 1];

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let n_lines = text.lines().count();
    let steps = match parse_trace(text) {
        Ok(steps) => steps,
        Err(EngineError::BadTrace { line, reason }) => {
            assert!(
                (1..=n_lines).contains(&line),
                "line {line} of {n_lines}: {reason}"
            );
            return;
        }
        Err(other) => panic!("parse_trace failed with a non-trace error: {other}"),
    };
    let n_nonblank = text.lines().filter(|l| !l.trim().is_empty()).count();
    assert_eq!(steps.len(), n_nonblank);
    let mut total = 0usize;
    for s in &steps {
        assert!(s.generate as u64 <= MAX_STEP_TOKENS);
        match &s.append {
            Append::Tokens(n) => {
                assert!(*n as u64 <= MAX_STEP_TOKENS);
                total = total.saturating_add(*n);
            }
            Append::Text(t) => total = total.saturating_add(t.len()),
        }
    }
    if total > MAX_RESOLVED_TOKENS {
        return;
    }

    // A stand-in tokenizer: one id per byte, refusing texts that contain a NUL.
    let tokenize = |t: &str| -> pyramid_engine::Result<Vec<u32>> {
        if t.contains('\0') {
            return Err(EngineError::BadConfig("NUL in text".into()));
        }
        Ok(t.bytes().map(u32::from).collect())
    };
    for n_vocab in N_VOCABS {
        let resolved = match resolve(&steps, n_vocab, &tokenize) {
            Ok(resolved) => resolved,
            Err(EngineError::BadStep { .. }) => {
                assert!(steps
                    .iter()
                    .any(|s| matches!(&s.append, Append::Text(t) if t.contains('\0'))));
                continue;
            }
            Err(other) => panic!("resolve failed with {other}"),
        };
        assert_eq!(resolved.len(), steps.len());
        for (r, s) in resolved.iter().zip(&steps) {
            assert_eq!(
                (&r.session, r.step, r.generate),
                (&s.session, s.step, s.generate)
            );
            match &s.append {
                Append::Tokens(n) => {
                    assert_eq!(r.tokens.len(), *n);
                    assert!(r.tokens.iter().all(|&id| (id as usize) < n_vocab));
                }
                Append::Text(t) => assert_eq!(r.tokens, tokenize(t).expect("resolved")),
            }
        }
        let again = resolve(&steps, n_vocab, &tokenize).expect("resolved once");
        assert!(again
            .iter()
            .zip(&resolved)
            .all(|(a, b)| a.tokens == b.tokens));
    }
});
