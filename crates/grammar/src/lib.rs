//! Constrained decoding: a JSON schema or a Lark grammar, compiled against the model's
//! vocabulary, becomes a mask of the tokens that may come next, step by step.
//!
//! The grammar engine is [llguidance](https://github.com/guidance-ai/llguidance), chosen
//! over `outlines-core` because it compiles a schema lazily (an Earley parser over a
//! lexer of derivative-based regexes) instead of building a whole token-level automaton
//! up front: a new schema costs about a millisecond, not seconds, which matters when
//! every request may bring its own; a mask over a 150k vocabulary takes tens of
//! microseconds; and one engine serves JSON schemas, Lark grammars and JSON embedded in
//! grammars (`%json{...}`, which tool calls use). llama.cpp, vLLM and mistral.rs ship it.
//!
//! [`GrammarVocab`] is built once per model (a token trie over every token's bytes);
//! [`GrammarVocab::compile`] turns a [`Grammar`] into a [`Constraint`], one per request,
//! which [`Constraint::mask_logits`] applies before sampling and
//! [`Constraint::accept`] advances after it.
//!
//! JSON schemas are compiled without free whitespace, with `", "` and `": "` between
//! items, the way Python's `json.dumps` writes (and so the way models have read most
//! JSON): free whitespace would let a small greedy model pad forever.
//!
//! Schema keywords enforced: `type`, `enum`, `const`, `anyOf`, `oneOf`, `allOf`, `$ref`
//! (with `$defs`/`definitions`), `properties`, `required`, `additionalProperties`,
//! `patternProperties`, `minProperties`, `maxProperties`, `items`, `prefixItems`,
//! `additionalItems`, `minItems`, `maxItems`, `minLength`, `maxLength`, `pattern`,
//! `format`, `minimum`, `maximum`, `exclusiveMinimum`, `exclusiveMaximum`, `multipleOf`.
//! OpenAPI's `nullable: true` is read as the alternative of `null`. Annotations (`title`,
//! `description`, `default`, `examples`, ...) constrain nothing and are accepted; any other keyword of the draft (`not`, `uniqueItems`, `if`,
//! `dependentRequired`, `propertyNames`, ...) is an error naming it.

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use pyramid_tokenizer::{TokenType, Tokenizer};
use serde_json::{json, Value};
use toktrie::{SimpleVob, TokEnv, TokRxInfo, TokTrie, TokenizerEnv};

mod bounds;
pub use bounds::{check_schema, MAX_SCHEMA_DEPTH, MAX_SCHEMA_PROPERTIES};

/// The stack a grammar compiles on: address space, committed only as it is used.
pub const COMPILE_STACK: usize = 64 << 20;

#[derive(Debug, thiserror::Error)]
pub enum GrammarError {
    #[error("the grammar cannot be used: {0}")]
    Invalid(String),
    #[error("the vocabulary cannot be prepared for constrained decoding: {0}")]
    Vocabulary(String),
    #[error("constrained decoding failed: {0}")]
    Matcher(String),
}

pub type Result<T, E = GrammarError> = std::result::Result<T, E>;

/// What a constrained reply must match.
#[derive(Debug, Clone, PartialEq)]
pub enum Grammar {
    /// A JSON value that validates against this JSON schema.
    JsonSchema(Value),
    /// Text in this Lark grammar (llguidance's dialect: `start: ...`, regexes in `/.../`,
    /// JSON schemas in `%json{...}`).
    Lark(String),
}

impl Grammar {
    /// A JSON schema as clients write it: OpenAPI's `nullable: true` (which the grammar
    /// engine would pass over) read as JSON Schema's alternative of `null`.
    pub fn json_schema(schema: &Value) -> Grammar {
        Grammar::JsonSchema(honour_nullable(schema))
    }

    /// Any JSON object (OpenAI's `response_format: {"type": "json_object"}`).
    pub fn any_json_object() -> Grammar {
        Grammar::JsonSchema(json!({"type": "object"}))
    }
}

/// How JSON inside a grammar is laid out: no free whitespace, Python's separators.
pub fn json_layout() -> Value {
    json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "})
}

/// `schema` with every `nullable: true` (OpenAPI's, which pydantic and many clients
/// write) turned into `anyOf` the schema or `null`, wherever a subschema may stand, and
/// `nullable: false` dropped: honoured, never silently ignored.
pub fn honour_nullable(schema: &Value) -> Value {
    map_subschemas(schema, &|mut fields| {
        let Some(nullable) = fields.remove("nullable") else {
            return Value::Object(fields);
        };
        if nullable != Value::Bool(true) {
            return Value::Object(fields);
        }
        // Definitions stay at this level, where references find them.
        let mut outer = serde_json::Map::new();
        for key in ["$defs", "definitions"] {
            if let Some(defs) = fields.remove(key) {
                outer.insert(key.to_string(), defs);
            }
        }
        outer.insert(
            "anyOf".to_string(),
            json!([Value::Object(fields), {"type": "null"}]),
        );
        Value::Object(outer)
    })
}

/// `schema` with `visit` applied to every schema object in it, innermost first (the
/// subschemas of `properties`, `items`, `anyOf`, `$defs`, … are rewritten before the
/// object holding them). Property names are never taken for keywords.
fn map_subschemas(
    schema: &Value,
    visit: &dyn Fn(serde_json::Map<String, Value>) -> Value,
) -> Value {
    let Value::Object(fields) = schema else {
        return schema.clone();
    };
    let mut out = serde_json::Map::with_capacity(fields.len());
    for (key, value) in fields {
        let value = match (key.as_str(), value) {
            ("properties" | "patternProperties" | "$defs" | "definitions", Value::Object(map)) => {
                Value::Object(
                    map.iter()
                        .map(|(k, v)| (k.clone(), map_subschemas(v, visit)))
                        .collect(),
                )
            }
            ("anyOf" | "oneOf" | "allOf" | "prefixItems" | "items", Value::Array(list)) => {
                Value::Array(list.iter().map(|v| map_subschemas(v, visit)).collect())
            }
            ("items" | "additionalProperties" | "additionalItems", v @ Value::Object(_)) => {
                map_subschemas(v, visit)
            }
            (_, v) => v.clone(),
        };
        out.insert(key.clone(), value);
    }
    visit(out)
}

/// Keywords of the draft the grammar engine does not enforce.
const UNENFORCED: &[&str] = &[
    "not",
    "if",
    "then",
    "else",
    "dependentRequired",
    "dependentSchemas",
    "dependencies",
    "propertyNames",
    "uniqueItems",
    "contains",
    "minContains",
    "maxContains",
    "unevaluatedProperties",
    "unevaluatedItems",
    "contentEncoding",
    "contentMediaType",
    "contentSchema",
];

/// `schema` without the keywords the grammar engine cannot enforce, wherever a subschema
/// may stand (property names are left alone): the part of a schema it can hold text to,
/// for constraining what the client did not ask to be exact. Every text valid against
/// `schema` is valid against the result.
pub fn enforceable(schema: &Value) -> Value {
    map_subschemas(schema, &|mut fields| {
        fields.retain(|key, _| !UNENFORCED.contains(&key.as_str()));
        Value::Object(fields)
    })
}

/// A model's vocabulary, prepared for compiling grammars against it.
#[derive(Clone)]
pub struct GrammarVocab {
    factory: Arc<ParserFactory>,
    /// The end token the grammar engine allows where a grammar may end.
    eos: u32,
    /// Tokens that end generation; all are allowed when the grammar may end.
    end_tokens: Arc<[u32]>,
    n_vocab: usize,
}

impl std::fmt::Debug for GrammarVocab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarVocab")
            .field("n_vocab", &self.n_vocab)
            .field("end_tokens", &self.end_tokens)
            .finish_non_exhaustive()
    }
}

impl GrammarVocab {
    /// The vocabulary of `tokenizer`. Control tokens (`<|im_end|>`) are marked special so
    /// no grammar text matches them; user-defined added tokens (`<tool_call>`) are text.
    pub fn new(tokenizer: Arc<Tokenizer>) -> Result<GrammarVocab> {
        let n_vocab = tokenizer.n_vocab();
        let end_tokens: Arc<[u32]> = tokenizer.end_of_generation_ids().into();
        let eos = tokenizer
            .eot_id()
            .or(tokenizer.eos_id())
            .or(end_tokens.first().copied())
            .ok_or_else(|| {
                GrammarError::Vocabulary("the model has no end-of-generation token".to_string())
            })?;
        let words: Vec<Vec<u8>> = (0..n_vocab as u32)
            .map(|id| {
                let bytes = tokenizer.token_bytes(id).unwrap_or_default();
                let special = matches!(
                    tokenizer.token_type(id),
                    Some(TokenType::Control | TokenType::Unknown | TokenType::Unused)
                ) || end_tokens.contains(&id);
                if special && !bytes.is_empty() {
                    let mut marked = Vec::with_capacity(bytes.len() + 1);
                    marked.push(TokTrie::SPECIAL_TOKEN_MARKER);
                    marked.extend_from_slice(bytes);
                    marked
                } else {
                    bytes.to_vec()
                }
            })
            .collect();
        let info = TokRxInfo {
            tok_end_of_turn: tokenizer.eot_id(),
            tok_bos: tokenizer.bos_id(),
            tok_pad: tokenizer.pad_id(),
            ..TokRxInfo::new(n_vocab as u32, eos)
        };
        let env: TokEnv = Arc::new(VocabEnv {
            trie: TokTrie::from(&info, &words),
            tokenizer,
        });
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| GrammarError::Vocabulary(e.to_string()))?;
        factory.quiet();
        // Errors name the problem, not the parser's internal state and the tokens so far.
        factory.limits_mut().verbose_errors = false;
        Ok(GrammarVocab {
            factory: Arc::new(factory),
            eos,
            end_tokens,
            n_vocab,
        })
    }

    /// A fresh constraint for one reply; schema and grammar errors name the problem.
    ///
    /// The grammar engine compiles recursively, about 8 KiB of stack per level of a
    /// schema's nesting (through `$ref`s) and per required property: a schema within
    /// [`check_schema`]'s bounds needs far less than [`COMPILE_STACK`], the stack of the
    /// thread it compiles on, so no schema can overflow the caller's stack and abort the
    /// process. A grammar that allows nothing at its start (a `$ref` cycle, a lexer out
    /// of fuel) is refused here, not at the first sampling step.
    pub fn compile(&self, grammar: &Grammar) -> Result<Constraint> {
        if let Grammar::JsonSchema(schema) = grammar {
            check_schema(schema)?;
        }
        std::thread::scope(|scope| {
            std::thread::Builder::new()
                .name("pyramid-grammar-compile".into())
                .stack_size(COMPILE_STACK)
                .spawn_scoped(scope, || self.compile_here(grammar))
                .map_err(|e| GrammarError::Invalid(format!("cannot start compiling: {e}")))?
                .join()
                .map_err(|_| {
                    GrammarError::Invalid("the grammar compiler failed on it".to_string())
                })?
        })
    }

    fn compile_here(&self, grammar: &Grammar) -> Result<Constraint> {
        let top = match grammar {
            Grammar::JsonSchema(schema) => {
                let Value::Object(mut fields) = honour_nullable(schema) else {
                    return Err(GrammarError::Invalid(
                        "a JSON schema must be an object".to_string(),
                    ));
                };
                fields.insert("x-guidance".to_string(), json_layout());
                TopLevelGrammar::from_json_schema(Value::Object(fields))
            }
            Grammar::Lark(source) => TopLevelGrammar::from_lark(source.clone()),
        };
        let parser = self
            .factory
            .create_parser(top)
            .map_err(|e| GrammarError::Invalid(e.to_string()))?;
        let mut constraint = Constraint {
            matcher: Matcher::new(Ok(parser)),
            eos: self.eos,
            end_tokens: Arc::clone(&self.end_tokens),
            n_vocab: self.n_vocab,
            finished: false,
        };
        let first = constraint
            .allowed()
            .map_err(|e| GrammarError::Invalid(format!("nothing can satisfy it ({e})")))?;
        if first.num_set() == 0 {
            return Err(GrammarError::Invalid(
                "nothing can satisfy it: no token may start the reply".to_string(),
            ));
        }
        Ok(constraint)
    }
}

/// What llguidance needs of a tokenizer: the trie, and tokenising for forced text.
struct VocabEnv {
    trie: TokTrie,
    tokenizer: Arc<Tokenizer>,
}

impl TokenizerEnv for VocabEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, bytes: &[u8]) -> Vec<u32> {
        match std::str::from_utf8(bytes) {
            Ok(text) => match self.tokenizer.encode(text, false) {
                Ok(ids) => ids,
                Err(_) => self.trie.greedy_tokenize(bytes),
            },
            // A character cut in two has no canonical tokens: the longest matches will do.
            Err(_) => self.trie.greedy_tokenize(bytes),
        }
    }
}

/// One reply's grammar state.
pub struct Constraint {
    matcher: Matcher,
    eos: u32,
    end_tokens: Arc<[u32]>,
    n_vocab: usize,
    finished: bool,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint")
            .field("finished", &self.finished)
            .finish_non_exhaustive()
    }
}

impl Clone for Constraint {
    fn clone(&self) -> Self {
        Constraint {
            matcher: self.matcher.deep_clone(),
            eos: self.eos,
            end_tokens: Arc::clone(&self.end_tokens),
            n_vocab: self.n_vocab,
            finished: self.finished,
        }
    }
}

impl Constraint {
    /// Sets the logit of every token the grammar does not allow next to −∞. The
    /// end-of-generation tokens are allowed exactly when the grammar may end here; logits
    /// beyond the vocabulary (padding rows of the output matrix) are never allowed.
    pub fn mask_logits(&mut self, logits: &mut [f32]) -> Result<()> {
        let mask = self.allowed()?;
        apply_mask(&mask, self.n_vocab, logits);
        Ok(())
    }

    /// The tokens allowed next, end-of-generation tokens included when the grammar may end.
    pub fn allowed(&mut self) -> Result<SimpleVob> {
        let mut mask = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| GrammarError::Matcher(e.to_string()))?;
        let may_end = mask.is_allowed(self.eos);
        for &id in self.end_tokens.iter() {
            if (id as usize) < mask.len() {
                mask.set(id as usize, may_end);
            }
        }
        Ok(mask)
    }

    /// Advances past the sampled `token`. An end-of-generation token ends the reply
    /// (the grammar allowed it only where it may end); any token the mask forbade is an
    /// error.
    pub fn accept(&mut self, token: u32) -> Result<()> {
        if self.end_tokens.contains(&token) {
            self.finished = true;
            return Ok(());
        }
        self.matcher
            .consume_token(token)
            .map_err(|e| GrammarError::Matcher(e.to_string()))?;
        if self.matcher.is_stopped() {
            self.finished = true;
        }
        Ok(())
    }

    /// Whether the reply is complete: an end token came, or the grammar allows nothing more.
    pub fn is_finished(&self) -> bool {
        self.finished
    }
}

/// `logits[i] = −∞` for every `i` the mask does not set; `i ≥ n_vocab` is never allowed.
fn apply_mask(mask: &SimpleVob, n_vocab: usize, logits: &mut [f32]) {
    let words = mask.as_slice();
    let in_vocab = n_vocab.min(logits.len());
    for (w, chunk) in logits[..in_vocab].chunks_mut(32).enumerate() {
        let bits = words.get(w).copied().unwrap_or(0);
        if bits == u32::MAX && chunk.len() == 32 {
            continue;
        }
        for (b, logit) in chunk.iter_mut().enumerate() {
            if bits & (1 << b) == 0 {
                *logit = f32::NEG_INFINITY;
            }
        }
    }
    if let Some(beyond) = logits.get_mut(n_vocab..) {
        beyond.fill(f32::NEG_INFINITY);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mask_forbids_exactly_the_unset_tokens_and_everything_beyond_the_vocabulary() {
        // 70 tokens span three mask words, the last one partly; logits run past them.
        let n_vocab = 70;
        let allowed = [0usize, 5, 31, 32, 63, 64, 69];
        let mut mask = SimpleVob::alloc(n_vocab);
        allowed.iter().for_each(|&i| mask.allow_token(i as u32));
        let mut logits: Vec<f32> = (0..80).map(|i| i as f32).collect();
        apply_mask(&mask, n_vocab, &mut logits);
        for (i, l) in logits.iter().enumerate() {
            let kept = allowed.contains(&i);
            assert_eq!(*l == i as f32, kept, "token {i}");
            assert_eq!(*l == f32::NEG_INFINITY, !kept, "token {i}");
        }
        // A full word is left untouched, and shorter logits than the vocabulary are fine.
        let mut mask = SimpleVob::alloc(40);
        (0..40).for_each(|i| mask.allow_token(i));
        let mut logits = vec![1.0f32; 20];
        apply_mask(&mask, 40, &mut logits);
        assert!(logits.iter().all(|&l| l == 1.0));
    }
}
