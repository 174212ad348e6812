//! Grammars checked against a real vocabulary in unit tests: Qwen2.5's, where
//! `<tool_call>` is one token, built once per test binary.

use std::sync::{Arc, OnceLock};

use pyramid_grammar::{Grammar, GrammarVocab};
use pyramid_tokenizer::Tokenizer;

fn qwen() -> &'static (Arc<Tokenizer>, GrammarVocab) {
    static VOCAB: OnceLock<(Arc<Tokenizer>, GrammarVocab)> = OnceLock::new();
    VOCAB.get_or_init(|| {
        let path = pyramid_testdata::model_path("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
        let file = pyramid_gguf::GgufFile::open(&path).unwrap();
        let tok = Arc::new(Tokenizer::from_gguf(file.metadata()).unwrap());
        let vocab = GrammarVocab::new(Arc::clone(&tok)).unwrap();
        (tok, vocab)
    })
}

/// Whether `grammar` lets a model write `text` token by token and end there.
pub fn allows(grammar: &Grammar, text: &str) -> bool {
    let (tok, vocab) = qwen();
    let mut constraint = vocab.compile(grammar).unwrap();
    for id in tok.encode(text, false).unwrap() {
        if !constraint.allowed().unwrap().is_allowed(id) {
            return false;
        }
        constraint.accept(id).unwrap();
    }
    let end = tok.end_of_generation_ids()[0];
    constraint.allowed().unwrap().is_allowed(end)
}
