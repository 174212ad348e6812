//! Chat templates with tools render byte for byte as transformers renders them
//! (`tests/data/tool_templates.json`, made by `tool_templates.py`): tool definitions,
//! assistant tool calls with JSON arguments, and tool results.

mod common;

use common::message;
use pyramid_tokenizer::{ChatMessage, ChatTemplate};
use serde_json::Value;

#[test]
fn tools_render_as_transformers_renders_them() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/tool_templates.json"
    );
    let golden: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    for (file, cases) in golden.as_object().unwrap() {
        let template = ChatTemplate::from_gguf(&common::metadata(file)).unwrap();
        assert_eq!(template.takes_tools(), file.starts_with("qwen"), "{file}");
        for case in cases.as_array().unwrap() {
            let messages: Vec<ChatMessage> = case["messages"]
                .as_array()
                .unwrap()
                .iter()
                .map(message)
                .collect();
            let tools = case["tools"].as_array().unwrap();
            let text = template
                .render_with(&messages, tools, &serde_json::Map::new(), true)
                .unwrap();
            assert_eq!(text, case["text"].as_str().unwrap(), "{file}");
        }
    }
}
