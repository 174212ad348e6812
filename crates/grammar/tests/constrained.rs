//! Constraints over the real vocabularies: whatever the model would rank first, the
//! sampled text parses and validates, and ends exactly where the grammar does.

use std::path::PathBuf;
use std::sync::Arc;

use pyramid_gguf::GgufFile;
use pyramid_grammar::{Grammar, GrammarError, GrammarVocab};
use pyramid_tokenizer::Tokenizer;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

const MODELS: [&str; 2] = [
    "smollm2-135m-instruct-q4_1.gguf",
    "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
];

fn tokenizer(file: &str) -> Arc<Tokenizer> {
    let home = std::env::var_os("PYRAMID_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache/pyramid"));
    let path = home.join("models").join(file);
    let gguf = GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Arc::new(Tokenizer::from_gguf(gguf.metadata()).unwrap())
}

/// Samples under `grammar` from random logits (every allowed token is as likely as any
/// other: the hardest model there is) until the constraint ends; returns the text.
fn sample(vocab: &GrammarVocab, tok: &Tokenizer, grammar: &Grammar, rng: &mut StdRng) -> String {
    let mut constraint = vocab.compile(grammar).unwrap();
    let mut ids = Vec::new();
    // Logits are as wide as the output matrix, which may exceed the vocabulary.
    let mut logits = vec![0f32; tok.n_vocab() + 64];
    for _ in 0..400 {
        logits
            .iter_mut()
            .for_each(|l| *l = rng.random_range(-1.0..1.0));
        constraint.mask_logits(&mut logits).unwrap();
        assert!(logits[tok.n_vocab()..]
            .iter()
            .all(|l| *l == f32::NEG_INFINITY));
        let (token, _) = logits
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .unwrap();
        let token = token as u32;
        constraint.accept(token).unwrap();
        if constraint.is_finished() {
            if !tok.is_end_of_generation(token) {
                ids.push(token);
            }
            return tok.decode(&ids).unwrap();
        }
        ids.push(token);
    }
    panic!("no end after 400 tokens: {:?}", tok.decode(&ids));
}

fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 130},
            "role": {"enum": ["admin", "user", "guest"]},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3},
            "address": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 10}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                "required": ["city", "zip"],
                "additionalProperties": false
            },
            "score": {"type": "number", "minimum": -1, "maximum": 1}
        },
        "required": ["name", "age", "role", "address"],
        "additionalProperties": false
    })
}

fn check_person(v: &Value) {
    let o = v.as_object().expect("an object");
    for key in o.keys() {
        assert!(
            ["name", "age", "role", "tags", "address", "score"].contains(&key.as_str()),
            "extra {key}"
        );
    }
    let name = o["name"].as_str().unwrap();
    assert!((1..=12).contains(&name.chars().count()), "{name:?}");
    let age = o["age"].as_u64().unwrap();
    assert!(age <= 130);
    assert!(["admin", "user", "guest"].contains(&o["role"].as_str().unwrap()));
    if let Some(tags) = o.get("tags") {
        let tags = tags.as_array().unwrap();
        assert!(tags.len() <= 3);
        assert!(tags
            .iter()
            .all(|t| t.as_str().unwrap().chars().count() <= 6));
    }
    let addr = o["address"].as_object().unwrap();
    assert_eq!(addr.len(), 2);
    assert!(addr["city"].as_str().unwrap().chars().count() <= 10);
    let zip = addr["zip"].as_str().unwrap();
    assert!(
        zip.len() == 5 && zip.bytes().all(|b| b.is_ascii_digit()),
        "{zip}"
    );
    if let Some(score) = o.get("score") {
        assert!((-1.0..=1.0).contains(&score.as_f64().unwrap()));
    }
}

#[test]
fn sampled_json_validates_against_its_schema_on_both_vocabularies() {
    for file in MODELS {
        let tok = tokenizer(file);
        let vocab = GrammarVocab::new(Arc::clone(&tok)).unwrap();
        let mut rng = StdRng::seed_from_u64(7);
        let grammar = Grammar::JsonSchema(person_schema());
        for _ in 0..8 {
            let text = sample(&vocab, &tok, &grammar, &mut rng);
            let value: Value = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{file}: {text:?} is not JSON: {e}"));
            check_person(&value);
            // Properties come in the schema's order, with Python's separators.
            assert!(text.starts_with("{\"name\": \""), "{text}");
        }
        // Free-form objects have no bound on length, which random tokens would not reach
        // the end of: keys and values are bounded here.
        let bounded = Grammar::JsonSchema(json!({
            "type": "object",
            "patternProperties": {"^[a-z]{1,3}$": {"type": "integer", "minimum": 0, "maximum": 9}},
            "additionalProperties": false,
            "maxProperties": 2
        }));
        for _ in 0..4 {
            let text = sample(&vocab, &tok, &bounded, &mut rng);
            let value: Value = serde_json::from_str(&text).unwrap();
            let object = value.as_object().unwrap();
            assert!(object.len() <= 2, "{text}");
            assert!(
                object.values().all(|v| v.as_u64().is_some_and(|v| v <= 9)),
                "{text}"
            );
        }
    }
}

#[test]
fn a_lark_grammar_ends_where_it_ends() {
    let tok = tokenizer(MODELS[1]);
    let vocab = GrammarVocab::new(Arc::clone(&tok)).unwrap();
    let grammar = Grammar::Lark(r#"start: "<tool_call>\n" ("yes" | "no") "\n</tool_call>""#.into());
    let mut rng = StdRng::seed_from_u64(1);
    for _ in 0..5 {
        let text = sample(&vocab, &tok, &grammar, &mut rng);
        assert!(
            text == "<tool_call>\nyes\n</tool_call>" || text == "<tool_call>\nno\n</tool_call>",
            "{text:?}"
        );
    }
}

#[test]
fn end_tokens_are_allowed_only_where_the_grammar_may_end() {
    let tok = tokenizer(MODELS[1]);
    let vocab = GrammarVocab::new(Arc::clone(&tok)).unwrap();
    let schema = json!({"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "maxItems": 2});
    let mut c = vocab.compile(&Grammar::JsonSchema(schema)).unwrap();
    let ends = tok.end_of_generation_ids().to_vec();
    let allowed = |c: &mut pyramid_grammar::Constraint| c.allowed().unwrap();
    assert!(ends.iter().all(|&e| !allowed(&mut c).is_allowed(e)));
    for id in tok.encode("[1", false).unwrap() {
        c.accept(id).unwrap();
    }
    assert!(ends.iter().all(|&e| !allowed(&mut c).is_allowed(e)));
    for id in tok.encode("]", false).unwrap() {
        c.accept(id).unwrap();
    }
    // `[1]` is complete: only an end may follow.
    let mask = allowed(&mut c);
    assert!(ends.iter().all(|&e| mask.is_allowed(e)));
    assert_eq!(mask.num_set(), ends.len());
    c.accept(ends[0]).unwrap();
    assert!(c.is_finished());
}

#[test]
fn a_cloned_constraint_goes_on_alone() {
    let tok = tokenizer(MODELS[1]);
    let vocab = GrammarVocab::new(Arc::clone(&tok)).unwrap();
    let schema = json!({"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "maxItems": 2});
    let mut first = vocab.compile(&Grammar::JsonSchema(schema)).unwrap();
    let mut second = first.clone();
    for id in tok.encode("[1]", false).unwrap() {
        first.accept(id).unwrap();
    }
    // The copy is still at the start, where it may not end; the original may.
    let ends = tok.end_of_generation_ids().to_vec();
    assert!(ends
        .iter()
        .all(|&e| !second.allowed().unwrap().is_allowed(e)));
    assert!(ends.iter().all(|&e| first.allowed().unwrap().is_allowed(e)));
    for id in tok.encode("[2]", false).unwrap() {
        second.accept(id).unwrap();
    }
    let mut third = second.clone();
    third.accept(ends[0]).unwrap();
    assert!(third.is_finished());
}

#[test]
fn a_token_the_mask_forbids_is_an_error_not_a_panic() {
    let tok = tokenizer(MODELS[0]);
    let vocab = GrammarVocab::new(Arc::clone(&tok)).unwrap();
    let mut c = vocab
        .compile(&Grammar::JsonSchema(json!({"type": "integer"})))
        .unwrap();
    let letter = tok.encode("x", false).unwrap()[0];
    assert!(matches!(c.accept(letter), Err(GrammarError::Matcher(_))));
}

#[test]
fn unsupported_keywords_and_bad_grammars_are_named() {
    let tok = tokenizer(MODELS[0]);
    let vocab = GrammarVocab::new(Arc::clone(&tok)).unwrap();
    for (schema, named) in [
        (json!({"type": "string", "not": {"const": "x"}}), "not"),
        (
            json!({"type": "object", "dependentRequired": {"a": ["b"]}}),
            "dependentRequired",
        ),
        (json!({"type": "array", "uniqueItems": true}), "uniqueItems"),
    ] {
        let err = vocab
            .compile(&Grammar::JsonSchema(schema))
            .unwrap_err()
            .to_string();
        assert!(err.contains(named), "{err}");
    }
    // What can be enforced of such a schema compiles; property names are not keywords.
    let schema = json!({"type": "object", "propertyNames": {"pattern": "^a"},
        "properties": {"not": {"type": "array", "items": {"type": "string"}, "uniqueItems": true}},
        "anyOf": [{"if": {"type": "object"}}]});
    let relaxed = pyramid_grammar::enforceable(&schema);
    assert_eq!(
        relaxed,
        json!({"type": "object", "properties": {"not": {"type": "array", "items": {"type": "string"}}},
               "anyOf": [{}]})
    );
    vocab.compile(&Grammar::JsonSchema(relaxed)).unwrap();
    let err = vocab
        .compile(&Grammar::JsonSchema(json!(["not", "a", "schema"])))
        .unwrap_err();
    assert!(err.to_string().contains("must be an object"), "{err}");
    let err = vocab
        .compile(&Grammar::Lark("start: undefined_rule".into()))
        .unwrap_err();
    assert!(err.to_string().contains("undefined_rule"), "{err}");
}

/// The schemas a probe sent to a server: each compiled on a thread whose stack it once
/// overflowed (the 2 MiB of a tokio blocking thread), ending the whole process. Each now
/// compiles or is refused with a message naming the limit or the problem.
#[test]
fn deep_wide_and_unsatisfiable_schemas_never_overflow_the_callers_stack() {
    let tok = tokenizer(MODELS[0]);
    let vocab = GrammarVocab::new(Arc::clone(&tok)).unwrap();
    let nested_any_of = (0..120).fold(json!({"type": "string"}), |inner, i| {
        json!({"anyOf": [{"type": "integer", "minimum": i}, {"type": "boolean"}, inner]})
    });
    assert!(nested_any_of.to_string().len() > 6_000);
    let ref_chain = |n: usize, nest: bool| {
        let mut defs = serde_json::Map::new();
        for i in 0..n {
            let next = json!({"$ref": format!("#/$defs/d{}", i + 1)});
            let def = if nest {
                json!({"type": "object", "properties": {"x": next}, "required": ["x"]})
            } else {
                next
            };
            defs.insert(format!("d{i}"), def);
        }
        defs.insert(format!("d{n}"), json!({"type": "string"}));
        json!({"$defs": defs, "$ref": "#/$defs/d0"})
    };
    let required = |n: usize| {
        let names: Vec<String> = (0..n).map(|i| format!("p{i}")).collect();
        let props: serde_json::Map<String, Value> = names
            .iter()
            .map(|n| (n.clone(), json!({"type": "integer"})))
            .collect();
        json!({"type": "object", "properties": props, "required": names})
    };
    let compile = |schema: Value| {
        let vocab = vocab.clone();
        // The caller's stack is as small as the server's blocking threads'.
        std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn(move || vocab.compile(&Grammar::JsonSchema(schema)).map(|_| ()))
            .unwrap()
            .join()
            .unwrap()
    };
    assert!(compile(nested_any_of).is_ok());
    assert!(compile(ref_chain(250, false)).is_ok());
    assert!(compile(ref_chain(60, true)).is_ok());
    assert!(compile(required(5_000)).is_ok());
    for (schema, named) in [
        (ref_chain(250, true), "more than 256 levels"),
        (required(20_000), "at most 10000"),
        (
            json!({"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}),
            "nothing can satisfy",
        ),
        (
            json!({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}),
            "nothing can satisfy",
        ),
    ] {
        let err = compile(schema).unwrap_err().to_string();
        assert!(err.contains(named), "{err}");
        assert!(!err.contains("<state>"), "the parser's state leaks: {err}");
    }
}

#[test]
fn nullable_is_honoured() {
    let tok = tokenizer(MODELS[1]);
    let vocab = GrammarVocab::new(Arc::clone(&tok)).unwrap();
    let schema = json!({"type": "object", "properties": {"a": {"type": "string", "nullable": true}},
                        "required": ["a"], "additionalProperties": false});
    let accepts = |text: &str| {
        let mut c = vocab.compile(&Grammar::JsonSchema(schema.clone())).unwrap();
        for id in tok.encode(text, false).unwrap() {
            if !c.allowed().unwrap().is_allowed(id) {
                return false;
            }
            c.accept(id).unwrap();
        }
        c.is_finished()
            || c.allowed()
                .unwrap()
                .is_allowed(tok.end_of_generation_ids()[0])
    };
    assert!(accepts(r#"{"a": "x"}"#));
    assert!(
        accepts(r#"{"a": null}"#),
        "OpenAPI's nullable lets the value be null"
    );
    assert!(!accepts(r#"{"a": 1}"#));
}

#[test]
fn nullable_becomes_a_null_alternative_where_subschemas_stand() {
    let schema = json!({"type": "object", "nullable": true,
        "properties": {"nullable": {"type": "integer", "nullable": false}},
        "$defs": {"P": {"type": "string", "nullable": true}}});
    assert_eq!(
        pyramid_grammar::honour_nullable(&schema),
        json!({"$defs": {"P": {"anyOf": [{"type": "string"}, {"type": "null"}]}},
               "anyOf": [{"type": "object", "properties": {"nullable": {"type": "integer"}}},
                         {"type": "null"}]})
    );
}
