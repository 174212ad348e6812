use serde_json::json;

use super::*;

/// Thought and answer of `text` fed whole, checked equal for every cut a character at a
/// time.
fn split(thinking: Thinking, text: &str) -> (String, String) {
    let run = |parts: &[&str]| {
        let mut splitter = ThoughtSplitter::new(thinking).unwrap();
        let (mut thought, mut answer) = (String::new(), String::new());
        let mut take = |(pieces, text): (Vec<Piece>, String)| {
            for piece in pieces {
                let Piece::Reasoning(t) = piece else {
                    panic!("{piece:?}")
                };
                thought.push_str(&t);
            }
            answer.push_str(&text);
        };
        for part in parts {
            for (i, c) in part.char_indices() {
                take(splitter.push(&part[i..i + c.len_utf8()]));
            }
        }
        take(splitter.finish());
        (thought, answer)
    };
    let whole = run(&[text]);
    for cut in (0..=text.len()).filter(|&i| text.is_char_boundary(i)) {
        assert_eq!(
            run(&[&text[..cut], &text[cut..]]),
            whole,
            "cut at {cut} of {text:?}"
        );
    }
    whole
}

#[test]
fn thoughts_and_answers_part_the_same_way_however_they_are_cut() {
    let (t, a) = split(
        Thinking::MayOpen,
        "<think>\nThe user greets me.\n</think>\n\nHello!",
    );
    assert_eq!((t.as_str(), a.as_str()), ("The user greets me.", "Hello!"));
    // The prompt opened the thought (DeepSeek-R1's template).
    let (t, a) = split(Thinking::Open, "Two plus two.\n</think>\n\n4");
    assert_eq!((t.as_str(), a.as_str()), ("Two plus two.", "4"));
    // No thought (Qwen3 with enable_thinking false): all answer, even a later tag.
    let (t, a) = split(Thinking::MayOpen, "Hi <think>x</think>");
    assert_eq!((t.as_str(), a.as_str()), ("", "Hi <think>x</think>"));
    // Cut off mid-thought: thought, no answer.
    let (t, a) = split(Thinking::MayOpen, "<think>Let me see, 17 ti");
    assert_eq!((t.as_str(), a.as_str()), ("Let me see, 17 ti", ""));
    let (t, a) = split(Thinking::MayOpen, "  <thi");
    assert_eq!((t.as_str(), a.as_str()), ("", "  <thi"));
}

#[test]
fn the_prompts_end_says_where_the_reply_starts() {
    assert_eq!(Thinking::of(false, "<think>\n"), Thinking::Off);
    assert_eq!(
        Thinking::of(true, "<|im_start|>assistant\n<think>\n"),
        Thinking::Open
    );
    assert_eq!(
        Thinking::of(true, "<|im_start|>assistant\n"),
        Thinking::MayOpen
    );
    assert_eq!(
        Thinking::of(true, "<|im_start|>assistant\n<think>\n\n</think>\n\n"),
        Thinking::MayOpen
    );
    assert!(template_thinks(
        "{% if enable_thinking %}<think>{% endif %}"
    ));
}

#[test]
fn a_schema_constrains_the_answer_after_a_free_thought() {
    let schema = Grammar::JsonSchema(
        json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}),
    );
    let may = with_thought(schema.clone(), Thinking::MayOpen);
    let allows = crate::test_vocab::allows;
    assert!(allows(
        &may,
        "<think>\nAny {text} at all: \"n\" is 4.\n</think>\n\n{\"n\": 4}"
    ));
    assert!(allows(&may, "{\"n\": 4}"));
    assert!(!allows(
        &may,
        "<think>\nfour\n</think>\n\n{\"n\": \"four\"}"
    ));
    assert!(!allows(&may, "Sure: {\"n\": 4}"));
    let open = with_thought(schema, Thinking::Open);
    assert!(allows(&open, "Four.\n</think>\n{\"n\": 4}"));
    assert!(!allows(&open, "{\"n\": 4}"), "the thought must close first");
    assert_eq!(
        with_thought(Grammar::Lark("x".into()), Thinking::Off),
        Grammar::Lark("x".into())
    );
}
