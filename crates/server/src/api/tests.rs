use super::*;

fn chat(body: &str) -> Result<GenerationRequest, ApiError> {
    parse(Endpoint::Chat, body.as_bytes(), DEFAULT_MAX_TOOLS)
}

#[test]
fn a_full_request_parses() {
    let r = chat(r#"{"model": "m", "messages": [{"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "max_completion_tokens": 5, "temperature": 0, "stop": ["\n", "END"], "seed": 7,
        "stream": true, "stream_options": {"include_usage": true}, "logprobs": true, "top_logprobs": 2}"#)
    .unwrap();
    let Prompt::Chat(m) = &r.prompt else { panic!() };
    assert_eq!(
        (m[0].role.as_str(), m[1].content.as_str()),
        ("system", "hi")
    );
    assert_eq!(r.max_tokens, Some(5));
    assert_eq!(r.sampler.temperature, 0.0);
    assert_eq!(r.sampler.seed, 7);
    assert_eq!(r.stop, ["\n", "END"]);
    assert!(r.stream && r.include_usage);
    assert_eq!(r.logprobs, Some(2));
}

#[test]
fn an_assistant_thought_sent_back_reaches_the_template() {
    let r = chat(
        r#"{"model": "m", "messages": [{"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "Two and two."},
        {"role": "assistant", "content": "", "reasoning_content": null}]}"#,
    )
    .unwrap();
    let Prompt::Chat(m) = &r.prompt else { panic!() };
    let thoughts: Vec<_> = m.iter().map(|m| m.reasoning_content.as_deref()).collect();
    assert_eq!(thoughts, [None, Some("Two and two."), None]);
}

#[test]
fn bad_values_name_their_parameter() {
    for (body, param) in [
        (r#"{"model": "m", "messages": []}"#, "messages"),
        (
            r#"{"model": "m", "messages": [{"role": "wizard", "content": "x"}]}"#,
            "messages[0].role",
        ),
        (
            r#"{"model": "m", "messages": [{"role": "user"}]}"#,
            "messages[0].content",
        ),
        (
            r#"{"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": 3}"#,
            "temperature",
        ),
        (
            r#"{"model": "m", "messages": [{"role": "user", "content": "x"}], "top_p": 0}"#,
            "top_p",
        ),
        (
            r#"{"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": -1}"#,
            "max_tokens",
        ),
        (
            r#"{"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}"#,
            "max_tokens",
        ),
        (
            r#"{"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 17}"#,
            "n",
        ),
        (
            r#"{"model": "m", "messages": [{"role": "user", "content": "x"}], "stop": ["a","b","c","d","e"]}"#,
            "stop",
        ),
        (
            r#"{"model": "m", "messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 21}"#,
            "top_logprobs",
        ),
        (
            r#"{"messages": [{"role": "user", "content": "x"}]}"#,
            "model",
        ),
        (
            r#"{"model": "m", "messages": [{"role": "user", "content": "x", "reasoning_content": "y"}]}"#,
            "messages[0].reasoning_content",
        ),
    ] {
        let err = chat(body).unwrap_err();
        assert_eq!(err.status, 400, "{body}");
        assert_eq!(err.param.as_deref(), Some(param), "{body}: {err}");
    }
}

#[test]
fn parameters_beyond_f32_range_sample_safely() {
    let msgs = r#""messages": [{"role": "user", "content": "hi"}]"#;
    for (top_p, temperature) in [("1e-50", "1"), ("1", "1e-40"), ("1e-300", "1e-300")] {
        let body =
            format!(r#"{{"model": "m", {msgs}, "top_p": {top_p}, "temperature": {temperature}}}"#);
        let request = chat(&body).unwrap();
        request.sampler.validate().unwrap();
        let mut sampler = pyramid_runtime::Sampler::new(request.sampler).unwrap();
        assert_eq!(sampler.sample(&mut [0.0, 2.0, 1.0], &[]), 1, "{body}");
    }
}

#[test]
fn every_field_is_implemented_or_refused_by_name() {
    let msgs = r#""messages": [{"role": "user", "content": "hi"}]"#;
    for field in ["functions", "function_call", "echo", "whatever"] {
        let body = format!(r#"{{"model": "m", {msgs}, "{field}": {{}}}}"#);
        let err = chat(&body).unwrap_err();
        assert_eq!(
            (err.status.as_u16(), err.param.as_deref()),
            (400, Some(field))
        );
    }
    // The template's variables are a chat field.
    let err = parse(
        Endpoint::Completion,
        br#"{"model": "m", "prompt": "x", "chat_template_kwargs": {}}"#,
        DEFAULT_MAX_TOOLS,
    )
    .unwrap_err();
    assert_eq!(err.param.as_deref(), Some("chat_template_kwargs"));
    assert!(err.message.contains("/v1/chat/completions only"), "{err}");
    // null is absent, as clients that fill every field with defaults send it.
    chat(&format!(
        r#"{{"model": "m", {msgs}, "tools": null, "user": "u"}}"#
    ))
    .unwrap();
    let ids = parse(
        Endpoint::Completion,
        br#"{"model": "m", "prompt": [1, 2, 3]}"#,
        DEFAULT_MAX_TOOLS,
    )
    .unwrap();
    assert!(matches!(ids.prompt, Prompt::Ids(ref v) if v == &[1, 2, 3]));
    let bias = chat(&format!(
        r#"{{"model": "m", {msgs}, "logit_bias": {{"5": -100}}}}"#
    ));
    assert_eq!(bias.unwrap().sampler.logit_bias, vec![(5, -100.0)]);
}

#[test]
fn malformed_json_is_a_400_without_param() {
    for body in ["", "{", "[1, 2]", "{\"model\": \"m\", \"messages\": [1}"] {
        let err = chat(body).unwrap_err();
        assert_eq!(
            (err.status.as_u16(), err.param.clone()),
            (400, None),
            "{body}"
        );
    }
}
