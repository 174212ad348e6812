"""Anthropic's Messages API against `pyramid serve`, driven by the official `anthropic`
client: create and stream, stop sequences, a tool-use round trip (forced and streamed),
count_tokens, and errors in Anthropic's body (with and without an API key).

Run by crates/cli/tests/serve.rs; see common.py for the environment it sets.
"""

from __future__ import annotations

import json

import anthropic

import common
from common import expect, expect_eq, ok

cfg = common.config()
MODEL = cfg.model
client = anthropic.Anthropic(base_url=cfg.base_url, api_key=cfg.api_key or "no-key-needed",
                             max_retries=0, timeout=120.0)

# Newer SDKs no longer send sampling settings; older clients and the API still take them.
GREEDY = {"temperature": 0}

WEATHER = {
    "name": "get_weather",
    "description": "The current weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                     "required": ["city"]},
}


def text_of(message) -> str:
    return "".join(block.text for block in message.content if block.type == "text")


def check_create_and_stream():
    ask = [{"role": "user", "content": "Name three colours."}]
    message = client.messages.create(model=MODEL, max_tokens=24, extra_body=GREEDY, messages=ask,
                                     system="You answer briefly.")
    expect_eq((message.type, message.role, message.model), ("message", "assistant", MODEL),
              "message type, role, model")
    expect(message.id.startswith("msg_"), f"message id {message.id!r}")
    expect(message.stop_reason in ("end_turn", "max_tokens"), f"stop_reason {message.stop_reason!r}")
    text = text_of(message)
    expect(text, "the reply has text")
    usage = message.usage
    expect(usage.input_tokens + (usage.cache_read_input_tokens or 0) > 5 and usage.output_tokens > 0,
           f"usage {usage}")

    with client.messages.stream(model=MODEL, max_tokens=24, extra_body=GREEDY, messages=ask,
                                system="You answer briefly.") as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    expect_eq(streamed, text, "streamed text vs created text")
    expect_eq(final.stop_reason, message.stop_reason, "streamed stop_reason")
    expect_eq(final.usage.output_tokens, usage.output_tokens, "streamed output_tokens")
    # The second request's prompt came from the prefix cache.
    expect(final.usage.cache_read_input_tokens and final.usage.cache_read_input_tokens > 0,
           f"the repeated prompt is read from the cache: {final.usage}")
    ok(f"create == stream: {text[:40]!r}, {message.stop_reason}")

    words = text.split()
    if len(words) > 2:
        stop = " " + words[2]
        cut = client.messages.create(model=MODEL, max_tokens=24, extra_body=GREEDY, messages=ask,
                                     system="You answer briefly.", stop_sequences=[stop])
        expect_eq((cut.stop_reason, cut.stop_sequence), ("stop_sequence", stop), "stop at a sequence")
        expect(text.startswith(text_of(cut)) and stop not in text_of(cut), f"cut text {text_of(cut)!r}")
        ok(f"stop_sequences: ended before {stop!r}")


def check_tool_round_trip():
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    forced = client.messages.create(model=MODEL, max_tokens=64, extra_body=GREEDY, messages=ask,
                                    tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"})
    calls = [b for b in forced.content if b.type == "tool_use"]
    expect_eq(len(calls), 1, f"one forced call in {forced.content}")
    expect_eq(forced.stop_reason, "tool_use", "stop_reason after a call")
    call = calls[0]
    expect(call.id.startswith("toolu_") and call.name == "get_weather", f"call {call}")
    expect(isinstance(call.input, dict) and isinstance(call.input.get("city"), str), f"input {call.input}")

    # Streamed: the call arrives as a tool_use block with its input as JSON deltas.
    deltas: dict[int, str] = {}
    fragments = 0
    with client.messages.stream(model=MODEL, max_tokens=64, extra_body=GREEDY, messages=ask, tools=[WEATHER],
                                tool_choice={"type": "any"}) as stream:
        for event in stream:
            if event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                deltas[event.index] = deltas.get(event.index, "") + event.delta.partial_json
                fragments += 1
        final = stream.get_final_message()
    expect(final.stop_reason == "tool_use" and deltas, f"streamed calls: {final.content}")
    expect(fragments > len(deltas), f"input streams in fragments as it is written ({fragments} deltas)")
    for index, joined in deltas.items():
        block = final.content[index]
        expect_eq((block.type, json.loads(joined)), ("tool_use", block.input), f"block {index}'s input deltas")

    # The tool's answer goes back; the reply reads it.
    follow = ask + [
        {"role": "assistant", "content": [{"type": "tool_use", "id": call.id, "name": call.name,
                                           "input": call.input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                      "content": "Sunny, 18 degrees."}]},
    ]
    answer = client.messages.create(model=MODEL, max_tokens=48, extra_body=GREEDY, messages=follow,
                                    tools=[WEATHER], tool_choice={"type": "none"})
    expect(text_of(answer) and answer.stop_reason in ("end_turn", "max_tokens"),
           f"an answer after the result: {answer.content}, {answer.stop_reason}")
    ok(f"tool use: {call.input}, then {text_of(answer)[:40]!r}")


def check_structured_output():
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
              "required": ["city", "country"], "additionalProperties": False}
    message = client.messages.create(model=MODEL, max_tokens=64, extra_body=GREEDY,
                                     messages=[{"role": "user", "content": "Where is the Eiffel Tower?"}],
                                     output_config={"format": {"type": "json_schema", "schema": schema},
                                                    "effort": "low"},
                                     cache_control={"type": "ephemeral"}, service_tier="auto")
    value = json.loads(text_of(message))
    expect(set(value) == {"city", "country"} and all(isinstance(v, str) for v in value.values()),
           f"the reply follows the schema: {value}")
    ok(f"output_config.format: {value}")


def check_count_tokens():
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    counted = client.messages.count_tokens(model=MODEL, messages=ask, tools=[WEATHER])
    made = client.messages.create(model=MODEL, max_tokens=1, extra_body=GREEDY, messages=ask, tools=[WEATHER])
    prompt = made.usage.input_tokens + (made.usage.cache_read_input_tokens or 0)
    expect_eq(counted.input_tokens, prompt, "count_tokens vs the prompt a request used")
    ok(f"count_tokens: {counted.input_tokens}")


def check_errors():
    ask = [{"role": "user", "content": "hi"}]
    try:
        client.messages.create(model=MODEL, max_tokens=8, messages=ask, extra_body={"temperature": 1.5})
        raise AssertionError("temperature 1.5 was accepted")
    except anthropic.BadRequestError as e:
        expect_eq(e.body["type"], "error", "error body type")
        expect_eq(e.body["error"]["type"], "invalid_request_error", "error type")
        expect("temperature" in e.body["error"]["message"], f"message names the field: {e.body}")
    try:
        client.messages.create(model="claude-nonexistent", max_tokens=8, messages=ask)
        raise AssertionError("an unknown model was accepted")
    except anthropic.NotFoundError as e:
        expect_eq(e.body["error"]["type"], "not_found_error", "unknown model error type")
    # The SDK insists on max_tokens; a raw request without it gets Anthropic's error.
    resp = common.post("/v1/messages", {"model": MODEL, "messages": ask})
    expect_eq(resp.status, 400, "missing max_tokens")
    body = resp.json()
    expect_eq((body["type"], body["error"]["type"]), ("error", "invalid_request_error"), "missing max_tokens body")
    if cfg.api_key:
        wrong = anthropic.Anthropic(base_url=cfg.base_url, api_key="wrong", max_retries=0)
        try:
            wrong.messages.create(model=MODEL, max_tokens=8, messages=ask)
            raise AssertionError("a wrong key was accepted")
        except anthropic.AuthenticationError as e:
            expect_eq(e.body["error"]["type"], "authentication_error", "wrong key error type")
        ok("x-api-key: the right key served, a wrong one refused")
    ok("errors in Anthropic's body")


def main():
    if cfg.api_key:
        # With a key, the request path is the same; only authentication is checked here.
        check_errors()
        client.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "hi"}])
        return
    check_create_and_stream()
    check_tool_round_trip()
    check_structured_output()
    check_count_tokens()
    check_errors()


if __name__ == "__main__":
    common.run(main)
