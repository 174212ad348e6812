//! The chat templates of Qwen3, SmolLM3 and Phi-3.5, and one with transformers'
//! `{% generation %}` tags as SmolLM3's own has them (`tests/data/templates/`), render byte
//! for byte as transformers renders them (`tests/data/family_templates.json`, made by
//! `family_templates.py`): tools, assistant tool calls (Qwen3's `<tool_call>`), tool
//! results, assistant thoughts in `reasoning_content` or in `<think>` within the content,
//! `enable_thinking`, and SmolLM3's `/think` and `/no_think`.

mod common;

use common::message;
use pyramid_tokenizer::{ChatMessage, ChatTemplate};
use serde_json::Value;

fn data(path: &str) -> String {
    let path = format!("{}/tests/data/{path}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn family_templates_render_as_transformers_renders_them() {
    let golden: Value = serde_json::from_str(&data("family_templates.json")).unwrap();
    let mut n_case = 0;
    for (file, family) in golden.as_object().unwrap() {
        let template = ChatTemplate::new(
            data(&format!("templates/{file}")),
            family["bos_token"].as_str().unwrap(),
            family["eos_token"].as_str().unwrap(),
        )
        .unwrap_or_else(|e| panic!("{file}: {e}"));
        for case in family["cases"].as_array().unwrap() {
            let name = case["name"].as_str().unwrap();
            let messages: Vec<ChatMessage> = case["messages"]
                .as_array()
                .unwrap()
                .iter()
                .map(message)
                .collect();
            let text = template
                .render_with(
                    &messages,
                    case["tools"].as_array().unwrap(),
                    case["kwargs"].as_object().unwrap(),
                    case["add_generation_prompt"].as_bool().unwrap(),
                )
                .unwrap_or_else(|e| panic!("{file} {name}: {e}"));
            assert_eq!(text, case["text"].as_str().unwrap(), "{file} {name}");
            n_case += 1;
        }
    }
    assert_eq!(n_case, 4 * 15, "every template's every case");
}

/// The thought reaches the template only when the message has one: Qwen3's template tells
/// an absent `reasoning_content` (look for `<think>` in the content) from an empty one.
#[test]
fn reasoning_content_reaches_the_template_only_when_present() {
    let template = ChatTemplate::new(
        "{% for m in messages %}{{ m.reasoning_content is defined }}|{% endfor %}",
        "",
        "",
    )
    .unwrap();
    let mut thought = ChatMessage::new("assistant", "4");
    thought.reasoning_content = Some(String::new());
    let messages = [ChatMessage::new("assistant", "<think>x</think>4"), thought];
    assert_eq!(template.render(&messages, false).unwrap(), "False|True|");
}
