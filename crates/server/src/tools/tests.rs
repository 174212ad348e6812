use super::*;

fn weather_tools(extra: &str) -> ToolSet {
    let body = format!(
        r#"{{"tools": [
            {{"type": "function", "function": {{"name": "get_weather", "parameters": {{"type": "object", "properties": {{"city": {{"type": "string"}}}}, "required": ["city"]}}}}}},
            {{"type": "function", "function": {{"name": "now"}}}}
        ]{extra}}}"#
    );
    let obj: Map<String, Value> = serde_json::from_str(&body).unwrap();
    ToolSet::parse(&obj, 128).unwrap().unwrap()
}

/// `pieces` with neighbouring text and argument fragments joined: what a reply means,
/// whichever way it was split.
fn joined(pieces: Vec<Piece>) -> Vec<Piece> {
    let mut out: Vec<Piece> = Vec::new();
    for piece in pieces {
        match (out.last_mut(), piece) {
            (Some(Piece::Text(a)), Piece::Text(b)) => a.push_str(&b),
            (Some(Piece::Arguments(a)), Piece::Arguments(b)) => a.push_str(&b),
            (_, piece) => out.push(piece),
        }
    }
    out
}

/// Every way of cutting `text` in two, fed a character at a time as tokens arrive, gives
/// the same pieces as feeding it whole; returns what it reads.
fn parse_split(tools: &ToolSet, text: &str) -> (String, Vec<ParsedCall>) {
    let mut parser = ToolCallParser::new(tools);
    let mut pieces = parser.push(text);
    pieces.extend(parser.finish());
    let whole = joined(pieces);
    for cut in (0..=text.len()).filter(|&i| text.is_char_boundary(i)) {
        let mut parser = ToolCallParser::new(tools);
        let mut pieces = Vec::new();
        for part in [&text[..cut], &text[cut..]] {
            for (i, c) in part.char_indices() {
                pieces.extend(parser.push(&part[i..i + c.len_utf8()]));
            }
        }
        pieces.extend(parser.finish());
        assert_eq!(joined(pieces), whole, "cut at {cut} of {text:?}");
    }
    let mut gathered = Gathered::default();
    gathered.add(whole);
    (gathered.text, gathered.calls)
}

#[test]
fn calls_are_parsed_across_any_chunking() {
    let tools = weather_tools("");
    let text = "Let me check.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
    let (content, calls) = parse_split(&tools, text);
    assert_eq!(content, "Let me check.");
    assert_eq!(
        calls,
        [
            ParsedCall {
                name: "get_weather".into(),
                arguments: r#"{"city":"Zürich"}"#.into()
            },
            ParsedCall {
                name: "now".into(),
                arguments: "{}".into()
            }
        ]
    );
}

#[test]
fn malformed_blocks_come_back_as_text() {
    let tools = weather_tools("");
    for text in [
        "<tool_call>\n{\"name\": \"launch_rockets\", \"arguments\": {}}\n</tool_call>",
        "<tool_call>\n{\"name\": \"now\", \"arguments\": [1]}\n</tool_call>",
        "a <tool_ca",
        "<tool_call",
    ] {
        let (content, calls) = parse_split(&tools, text);
        assert!(calls.is_empty(), "{text:?}");
        assert_eq!(content, text);
    }
    // Arguments written as a JSON string are read as the object inside.
    let (_, calls) = parse_split(
        &tools,
        "<tool_call>{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Oslo\\\"}\"}</tool_call>",
    );
    assert_eq!(calls[0].arguments, r#"{"city":"Oslo"}"#);
}

#[test]
fn without_parallel_calls_only_the_first_is_a_call() {
    let tools = weather_tools(r#", "parallel_tool_calls": false"#);
    let text = "<tool_call>{\"name\": \"now\", \"arguments\": {}}</tool_call><tool_call>{\"name\": \"now\", \"arguments\": {}}</tool_call>";
    let (content, calls) = parse_split(&tools, text);
    assert_eq!(calls.len(), 1);
    assert_eq!(
        content,
        &text[text.find("</tool_call>").unwrap() + CLOSE.len()..]
    );
}

#[test]
fn tool_choice_is_validated() {
    let obj = |body: &str| serde_json::from_str::<Map<String, Value>>(body).unwrap();
    let tools = r#""tools": [{"type": "function", "function": {"name": "f"}}]"#;
    for (body, param) in [
        (
            format!(r#"{{{tools}, "tool_choice": "sometimes"}}"#),
            "tool_choice",
        ),
        (
            format!(
                r#"{{{tools}, "tool_choice": {{"type": "function", "function": {{"name": "g"}}}}}}"#
            ),
            "tool_choice.function.name",
        ),
        (r#"{"tool_choice": "required"}"#.to_string(), "tool_choice"),
        (
            r#"{"tools": [{"type": "function", "function": {"name": "a b"}}]}"#.to_string(),
            "tools[0].function.name",
        ),
        (
            r#"{"tools": [{"type": "retrieval"}]}"#.to_string(),
            "tools[0].type",
        ),
        (
            format!(r#"{{{tools}, "parallel_tool_calls": 1}}"#),
            "parallel_tool_calls",
        ),
    ] {
        let err = ToolSet::parse(&obj(&body), 128).unwrap_err();
        assert_eq!(err.param.as_deref(), Some(param), "{body}");
    }
    let named = ToolSet::parse(
        &obj(&format!(
            r#"{{{tools}, "tool_choice": {{"type": "function", "function": {{"name": "f"}}}}}}"#
        )),
        128,
    )
    .unwrap()
    .unwrap();
    assert_eq!(named.choice, ToolChoice::Function("f".into()));
    assert!(named.forces_calls());
    let none = ToolSet::parse(&obj(&format!(r#"{{{tools}, "tool_choice": "none"}}"#)), 128)
        .unwrap()
        .unwrap();
    assert!(none.prompt_tools().is_empty() && !none.parses_calls());
    assert!(reply_grammar(Some(&none), None).is_none());
}

#[test]
fn grammars_follow_the_choice() {
    let required = weather_tools(r#", "tool_choice": "required""#);
    let Some(Grammar::Lark(lark)) = reply_grammar(Some(&required), None) else {
        panic!()
    };
    assert!(lark.starts_with("start: reply\nreply: calls\n"), "{lark}");
    assert!(
        lark.contains(r#"("\n" call)*"#)
            && lark.contains("get_weather")
            && lark.contains("\"now\"")
    );
    let single = weather_tools(
        r#", "tool_choice": {"type": "function", "function": {"name": "now"}}, "parallel_tool_calls": false"#,
    );
    let Some(Grammar::Lark(lark)) = reply_grammar(Some(&single), None) else {
        panic!()
    };
    assert!(
        !lark.contains("get_weather") && !lark.contains(r#"("\n" call)*"#),
        "{lark}"
    );
    // `auto` with a response format: a call, or the formatted answer.
    let auto = weather_tools("");
    let format = Grammar::JsonSchema(json!({"type": "object"}));
    let Some(Grammar::Lark(lark)) = reply_grammar(Some(&auto), Some(&format)) else {
        panic!()
    };
    assert!(
        lark.starts_with("start: reply\nreply: calls | answer\n"),
        "{lark}"
    );
    let Some(Grammar::Lark(lazy)) = reply_grammar(Some(&auto), None) else {
        panic!()
    };
    assert!(lazy.contains("tag_hd[lazy]"), "{lazy}");
    assert_eq!(reply_grammar(None, Some(&format)), Some(format));
}

#[test]
fn the_fallback_prompt_writes_tools_calls_and_results_in_the_parsed_format() {
    let tools = weather_tools("");
    let mut call = ChatMessage::new("assistant", "");
    call.tool_calls = vec![ToolCall {
        id: "c1".into(),
        name: "get_weather".into(),
        arguments: json!({"city": "Rome"}),
    }];
    let messages = vec![
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", "Weather?"),
        call,
        ChatMessage::new("tool", "sunny"),
        ChatMessage::new("tool", "warm"),
    ];
    let out = fallback_messages(&messages, tools.prompt_tools());
    assert_eq!(out.len(), 4);
    assert_eq!(out[0].role, "system");
    assert!(out[0].content.starts_with("Be brief.\n\n# Tools"));
    assert!(out[0]
        .content
        .contains("\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\""));
    assert_eq!(
        out[2].content,
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>"
    );
    assert_eq!(
        (out[3].role.as_str(), out[3].content.as_str()),
        (
            "user",
            "<tool_response>\nsunny\n</tool_response>\n<tool_response>\nwarm\n</tool_response>"
        )
    );
    // What the fallback writes as a call, the parser reads back as that call.
    let (_, calls) = parse_split(&tools, &out[2].content);
    assert_eq!(calls[0].arguments, r#"{"city":"Rome"}"#);
}

#[test]
fn a_reply_that_is_only_an_untagged_call_is_that_call() {
    let tools = weather_tools("");
    for text in [
        "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}",
        "  ```json\n{\n  \"name\": \"get_weather\",\n  \"arguments\": {\"city\": \"Paris\"}\n}\n```\n",
    ] {
        let (content, calls) = parse_split(&tools, text);
        assert_eq!(content, "", "{text:?}");
        assert_eq!(calls[0].arguments, r#"{"city":"Paris"}"#);
    }
    // JSON that is not a call, a fence of something else, and text around a call stay text.
    for text in [
        "{\"answer\": 42}",
        "```python\nprint(1)\n```",
        "Sure: {\"name\": \"now\", \"arguments\": {}}",
        "``",
    ] {
        let (content, calls) = parse_split(&tools, text);
        assert!(calls.is_empty(), "{text:?}");
        assert_eq!(content, text);
    }
    // An untagged start that turns out to hold tagged calls still yields them.
    let (content, calls) = parse_split(
        &tools,
        "{}\n<tool_call>{\"name\": \"now\", \"arguments\": {}}</tool_call>",
    );
    assert_eq!((content.as_str(), calls.len()), ("{}\n", 1));
}

#[test]
fn definitions_move_to_the_root_of_the_combined_schema_renamed_apart() {
    let mut defs = Map::new();
    let a = json!({"type": "object", "properties": {"p": {"$ref": "#/$defs/Point"}},
        "$defs": {"Point": {"type": "object", "properties": {"next": {"$ref": "#/$defs/Point"}}}}});
    let b = json!({"type": "object", "properties": {"p": {"$ref": "#/definitions/Point"}},
        "definitions": {"Point": {"type": "integer"}}});
    let a = hoist_definitions(&a, "f0_", &mut defs);
    let b = hoist_definitions(&b, "f1_", &mut defs);
    assert_eq!(a["properties"]["p"]["$ref"], "#/$defs/f0_Point");
    assert_eq!(b["properties"]["p"]["$ref"], "#/$defs/f1_Point");
    assert!(a.get("$defs").is_none() && b.get("definitions").is_none());
    assert_eq!(
        defs["f0_Point"]["properties"]["next"]["$ref"],
        "#/$defs/f0_Point"
    );
    assert_eq!(defs["f1_Point"], json!({"type": "integer"}));
}

#[test]
fn many_tools_are_checked_in_linear_time_and_capped() {
    let many = |n: usize| -> Map<String, Value> {
        let tools: Vec<Value> = (0..n)
            .map(|i| json!({"type": "function", "function": {"name": format!("f{i}")}}))
            .collect();
        json!({ "tools": tools }).as_object().unwrap().clone()
    };
    // 300,000 names: a pairwise duplicate check would compare 4.5e10 pairs.
    let big = many(300_000);
    let tools = ToolSet::parse(&big, 300_000).unwrap().unwrap();
    assert_eq!(tools.prompt_tools().len(), 300_000);
    let err = ToolSet::parse(&big, 128).unwrap_err();
    assert_eq!(err.param.as_deref(), Some("tools"));
    assert!(err.message.contains("at most 128"), "{}", err.message);
    assert!(ToolSet::parse(&many(128), 128).is_ok());
    // A duplicate far into the list is still found.
    let mut dup = many(300_000);
    dup["tools"].as_array_mut().unwrap()[299_999]["function"]["name"] = json!("f7");
    let err = ToolSet::parse(&dup, 300_000).unwrap_err();
    assert_eq!(err.param.as_deref(), Some("tools[299999].function.name"));
}

#[test]
fn arguments_stream_as_they_are_written() {
    let tools = weather_tools("");
    let text =
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\", \"days\": [1, 2]}}\n</tool_call>";
    let mut parser = ToolCallParser::new(&tools);
    let mut seen = Vec::new();
    for (i, c) in text.char_indices() {
        seen.push((i, parser.push(&text[i..i + c.len_utf8()])));
    }
    // The name is announced once the arguments begin, before any of them is known.
    let start = seen
        .iter()
        .find(|(_, p)| p.contains(&Piece::CallStart("get_weather".into())))
        .unwrap();
    assert_eq!(start.0, text.find("{\"city").unwrap());
    let fragments: Vec<&Piece> = seen
        .iter()
        .flat_map(|(_, p)| p)
        .filter(|p| matches!(p, Piece::Arguments(_)))
        .collect();
    assert!(fragments.len() > 10, "{fragments:?}");
    let (_, calls) = parse_split(&tools, text);
    assert_eq!(calls[0].arguments, r#"{"city":"Zürich","days":[1,2]}"#);
}

#[test]
fn a_call_cut_off_ends_where_it_stopped_and_never_leaves_its_tag_in_the_answer() {
    let tools = weather_tools("");
    let (content, calls) = parse_split(&tools, "Sure.<tool_call>\n{\"name\": \"get_w");
    assert_eq!((content.as_str(), calls.len()), ("Sure.", 0));
    let (content, calls) = parse_split(
        &tools,
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par",
    );
    assert_eq!(content, "");
    assert_eq!(calls[0].arguments, r#"{"city":"Par"#);
    // A call once begun stays one, as it streamed, even if its arguments go wrong.
    let (content, calls) = parse_split(
        &tools,
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": }\n</tool_call>",
    );
    assert_eq!(
        (content.as_str(), calls[0].arguments.as_str()),
        ("", r#"{"city":}"#)
    );
}

#[test]
fn bare_calls_one_per_line_are_calls() {
    let tools = weather_tools("");
    let (content, calls) = parse_split(
        &tools,
        "{\"name\": \"now\", \"arguments\": {}}\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n",
    );
    assert_eq!(content, "");
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[1].arguments, r#"{"city":"Oslo"}"#);
    let (content, calls) = parse_split(
        &tools,
        "```json\n{\"name\": \"now\", \"arguments\": {}}\n```\n```json\n{\"name\": \"now\", \"arguments\": {}}\n```\nDone.",
    );
    assert_eq!((content.as_str(), calls.len()), ("Done.", 2));
    // A call may open any line; inside a line, JSON is text.
    let (content, calls) = parse_split(
        &tools,
        "Let me check.\n```json\n{\n  \"name\": \"get_weather\",\n  \"arguments\": {\"city\": \"Oslo\"}\n}\n```\nIt is sunny.\nSee {\"name\": \"now\", \"arguments\": {}} too.",
    );
    assert_eq!(
        content,
        "Let me check.\nIt is sunny.\nSee {\"name\": \"now\", \"arguments\": {}} too."
    );
    assert_eq!(calls.len(), 1);
}

/// Whether the lazy grammar of `tools` lets a model write `text` and end there.
fn lazy_allows(tools: &ToolSet, text: &str) -> bool {
    let grammar = reply_grammar(Some(tools), None).expect("a grammar for auto");
    crate::test_vocab::allows(&grammar, text)
}

#[test]
fn under_auto_text_is_free_and_a_call_once_begun_is_a_valid_one() {
    let tools = weather_tools("");
    for text in [
        "",
        "Plain prose with { braces, <tags> and \"name\" in it.",
        "Let me check.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>",
        "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call> done",
        "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n{\"name\": \"now\", \"arguments\": {}}",
        "```json\n{\"name\": \"now\", \"arguments\": {}}\n```",
        "Let me run it:\n```json\n{\n  \"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n```\nDone.",
        "Data: {\"name\": \"Alice\", \"age\": 3}",
        "```json\n{\n  \"name\": \"get_weather\",\n  \"arguments\": {\"city\": \"Oslo\"}\n}\n```",
    ] {
        assert!(lazy_allows(&tools, text), "{text:?}");
        // What the grammar lets through, the parser reads the same way.
        let (_, calls) = parse_split(&tools, text);
        assert_eq!(calls.len(), text.matches("\"arguments\"").count(), "{text:?}");
    }
    for text in [
        // An undeclared function, arguments against the schema, a call left open.
        "<tool_call>\n{\"name\": \"read-file-notes.txt\", \"arguments\": {}}\n</tool_call>",
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": 7}}\n</tool_call>",
        "```json\n{\"name\": \"get_weather\", \"arguments\": {\"town\": \"Oslo\"}}\n```",
        "Sure. <tool_call>\n{\"name\": \"now\", \"arguments\": {}}",
        // A JSON object opening a line with a name key is a call: of a declared function.
        "Here:\n```json\n{\n  \"name\": \"cat notes.txt\", \"arguments\": {}}\n```",
        "{\"name\": \"Alice\", \"age\": 3}",
    ] {
        assert!(!lazy_allows(&tools, text), "{text:?}");
    }
}
