"""OpenAI's Responses API against `pyramid serve`, driven by the official `openai`
client's `responses` resource: create and stream, retrieve and delete, conversations
continued by `previous_response_id` (prefilling only the new input), function tools
(forced, streamed arguments, the output sent back), `text.format` JSON schemas,
`max_output_tokens`, and errors.

With PYRAMID_RESPONSES_PHASE=first|resume it runs the two halves of a restart instead:
`first` starts a conversation and writes its id to PYRAMID_PERSIST_STATE; `resume` (a
server restarted on the same --session-dir) continues it by `previous_response_id`:
the earlier turn comes from the session store (cached tokens cover it) and the reply
equals an uninterrupted server's (PYRAMID_FRESH_BASE_URL).

Run by crates/cli/tests/serve.rs; see common.py for the environment it sets.
"""

from __future__ import annotations

import json
import os

import jsonschema
import openai

import common
from common import expect, expect_eq, ok

cfg = common.config()
MODEL = cfg.model
client = common.client()

WEATHER = {
    "type": "function", "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
INSTRUCTIONS = "You are a careful assistant who answers briefly. " + " ".join(
    f"Rule {i}: be precise about topic {i}." for i in range(10))


def ask(base_url: str | None = None, **kw):
    api = common.client(base_url) if base_url else client
    return api.responses.create(model=MODEL, temperature=0, **kw)


def check_create_retrieve_delete():
    r = ask(instructions=INSTRUCTIONS, input="Name three colours.", max_output_tokens=24)
    expect(r.id.startswith("resp_") and r.object == "response", f"response {r.id} {r.object}")
    expect(r.status in ("completed", "incomplete"), f"status {r.status}")
    expect(r.output and r.output[0].type == "message" and r.output_text, f"output {r.output}")
    u = r.usage
    expect_eq(u.total_tokens, u.input_tokens + u.output_tokens, "usage total")
    expect(u.output_tokens <= 24 and u.input_tokens > 20, f"usage {u}")
    got = client.responses.retrieve(r.id)
    expect_eq((got.id, got.output_text), (r.id, r.output_text), "retrieved response")
    client.responses.delete(r.id)
    common.expect_api_error(lambda: client.responses.retrieve(r.id), openai.NotFoundError, 404,
                            "a deleted response")
    ok(f"create, retrieve, delete: {r.output_text!r}")


def check_stream():
    kinds = []
    with client.responses.stream(model=MODEL, temperature=0, input="Count from one to five.",
                                 max_output_tokens=24) as stream:
        text, final = "", None
        for event in stream:
            kinds.append(event.type)
            if event.type == "response.output_text.delta":
                text += event.delta
            elif event.type in ("response.completed", "response.incomplete"):
                # The SDK's get_final_response() takes only a completed one.
                final = event.response
    expect_eq(kinds[:2], ["response.created", "response.in_progress"], "the stream's opening events")
    expect(kinds[-1] in ("response.completed", "response.incomplete"), f"last event {kinds[-1]}")
    for kind in ["response.output_item.added", "response.content_part.added", "response.output_text.delta",
                 "response.output_text.done", "response.output_item.done"]:
        expect(kind in kinds, f"{kind} among {sorted(set(kinds))}")
    expect_eq(text, final.output_text, "streamed deltas vs the final text")
    whole = ask(input="Count from one to five.", max_output_tokens=24)
    expect_eq(final.output_text, whole.output_text, "streamed vs whole reply")
    ok(f"stream: {len(kinds)} events, same text as a whole response")


def check_continuation():
    first = ask(instructions=INSTRUCTIONS, input="What is a CPU cache, in one sentence?", max_output_tokens=32)
    second = ask(instructions=INSTRUCTIONS, previous_response_id=first.id, input="And a cache miss?",
                 max_output_tokens=32)
    cached = second.usage.input_tokens_details.cached_tokens
    expect(cached >= first.usage.input_tokens,
           f"the continued turn reused {cached} tokens < the first turn's {first.usage.input_tokens}")
    expect_eq(second.previous_response_id, first.id, "previous_response_id echoed")
    # The same conversation given whole as input items answers the same.
    items = [{"role": "user", "content": "What is a CPU cache, in one sentence?"},
             {"role": "assistant", "content": first.output_text},
             {"role": "user", "content": "And a cache miss?"}]
    whole = ask(instructions=INSTRUCTIONS, input=items, max_output_tokens=32)
    expect_eq(second.output_text, whole.output_text, "continued vs whole-history reply")
    unkept = ask(input="Hello.", store=False, max_output_tokens=4)
    common.expect_api_error(lambda: ask(previous_response_id=unkept.id, input="Again."), openai.BadRequestError,
                            400, "continuing a response made with store: false", param="previous_response_id")
    common.expect_api_error(lambda: client.responses.retrieve(unkept.id), openai.NotFoundError, 404,
                            "retrieving a response made with store: false")
    ok(f"previous_response_id: {cached} of {second.usage.input_tokens} input tokens cached")


def check_tools():
    r = ask(input="What is the weather in Paris?", tools=[WEATHER], tool_choice="required", parallel_tool_calls=False,
                                 max_output_tokens=48)
    calls = [item for item in r.output if item.type == "function_call"]
    expect_eq(len(calls), 1, f"one forced call in {r.output}")
    call = calls[0]
    expect(call.call_id.startswith("call_") and call.name == "get_weather", f"call {call}")
    args = json.loads(call.arguments)
    jsonschema.validate(args, WEATHER["parameters"])

    deltas, done = "", None
    with client.responses.stream(model=MODEL, temperature=0, input="What is the weather in Paris?",
                                 tools=[WEATHER], tool_choice="required", parallel_tool_calls=False,
                                 max_output_tokens=48) as stream:
        fragments = 0
        for event in stream:
            if event.type == "response.function_call_arguments.delta":
                deltas += event.delta
                fragments += 1
            elif event.type == "response.function_call_arguments.done":
                done = event.arguments
        final = stream.get_final_response()
    expect_eq(deltas, done, "argument deltas add up to the done event's arguments")
    expect(fragments > 1, f"arguments stream in fragments ({fragments})")
    expect_eq(json.loads(done), args, "streamed vs whole call")
    expect(final.output[-1].type == "function_call", f"final output {final.output}")

    answer = ask(previous_response_id=r.id, tools=[WEATHER], max_output_tokens=32,
                 input=[{"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 18 degrees."}])
    expect(answer.output_text, f"an answer after the result: {answer.output}")
    ok(f"function tools: {call.arguments}, then {answer.output_text[:40]!r}")


def check_formats_and_errors():
    schema = {"type": "object", "properties": {"colour": {"type": "string"}}, "required": ["colour"],
              "additionalProperties": False}
    r = ask(input="Name a colour, as JSON.", max_output_tokens=32,
            text={"format": {"type": "json_schema", "name": "colour", "schema": schema, "strict": True}})
    jsonschema.validate(json.loads(r.output_text), schema)
    cut = ask(input="Tell me a long story about a dragon.", max_output_tokens=3)
    expect_eq((cut.status, cut.incomplete_details.reason), ("incomplete", "max_output_tokens"), "a cut reply")
    common.expect_api_error(lambda: ask(input="Hi.", extra_body={"frobnicate": 1}), openai.BadRequestError, 400,
                            "an unknown field", param="frobnicate")
    common.expect_api_error(lambda: ask(input="Hi.", previous_response_id="resp_doesnotexist"),
                            openai.BadRequestError, 400, "an unknown previous response",
                            param="previous_response_id")
    common.expect_api_error(lambda: ask(input=[{"type": "web_search_call", "id": "ws_1"}]),
                            openai.BadRequestError, 400, "an item of a hosted tool", param="input[0].type")
    raw = client.responses.with_raw_response.create(
        model=MODEL, input="Hi.", max_output_tokens=2, tools=[{"type": "web_search"}, WEATHER])
    expect_eq(raw.headers.get("x-pyramid-skipped-tools"), "web_search", "hosted tools are named as skipped")
    ok("text.format json_schema, max_output_tokens, errors and skipped hosted tools")


def restart_phase(phase: str) -> None:
    state_file = os.environ["PYRAMID_PERSIST_STATE"]
    if phase == "first":
        r = ask(instructions=INSTRUCTIONS, input="What is a CPU cache, in two sentences?", max_output_tokens=24)
        with open(state_file, "w") as f:
            json.dump({"id": r.id, "input_tokens": r.usage.input_tokens}, f)
        ok(f"first turn kept as {r.id}")
        return
    with open(state_file) as f:
        state = json.load(f)
    second = dict(instructions=INSTRUCTIONS, input="And what is a cache miss?", max_output_tokens=24)
    resumed = ask(previous_response_id=state["id"], **second)
    cached = resumed.usage.input_tokens_details.cached_tokens
    expect(cached >= state["input_tokens"],
           f"after a restart the continued turn reused {cached} tokens < the first turn's {state['input_tokens']}")
    fresh = cfg.fresh_base_url
    first = ask(fresh, instructions=INSTRUCTIONS, input="What is a CPU cache, in two sentences?", max_output_tokens=24)
    uninterrupted = ask(fresh, previous_response_id=first.id, **second)
    expect_eq(resumed.output_text, uninterrupted.output_text, "the resumed reply vs an uninterrupted server's")
    ok(f"after a restart: {cached} cached tokens, same reply as an uninterrupted server")


def main() -> None:
    phase = os.environ.get("PYRAMID_RESPONSES_PHASE")
    if phase:
        restart_phase(phase)
        return
    check_create_retrieve_delete()
    check_stream()
    check_continuation()
    check_tools()
    check_formats_and_errors()


if __name__ == "__main__":
    common.run(main)
