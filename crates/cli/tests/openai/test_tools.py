"""Tool calls and structured output through the official openai client.

Run against either test model (PYRAMID_MODEL_ID). Proves that:
- `tool_choice: "required"` and a named function give calls whose arguments validate
  (jsonschema) against the function's parameters, on 10 varied prompts, whole and
  streamed (the streamed `tool_calls` deltas add up to the same calls);
- `response_format` `json_schema` replies validate on 10 prompts x 3 schemas, and
  `json_object` replies are JSON objects;
- `client.chat.completions.parse` with a Pydantic model returns the parsed model;
- with PYRAMID_TOOL_LOOP=1 (Qwen2.5, whose template takes tools): a two-step tool loop,
  streamed and not: the model calls get_weather on its own (`auto`), the test answers
  with a `role: "tool"` message, the model replies in text, and the second turn reuses
  the first turn's cached prompt;
- the legacy `functions`/`function_call` and schema keywords the grammar engine does not
  implement get a 400 naming them.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pydantic

import common
from common import expect, expect_eq, ok

cfg = common.config()
MODEL = cfg.model
client = common.client()

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "minLength": 1, "maxLength": 40},
            "unit": {"enum": ["celsius", "fahrenheit"]},
        }, "required": ["city"], "additionalProperties": False},
    }},
    {"type": "function", "function": {
        "name": "search_web",
        "description": "Search the web.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string", "minLength": 1, "maxLength": 60},
            "max_results": {"type": "integer", "minimum": 1, "maximum": 10},
        }, "required": ["query", "max_results"], "additionalProperties": False},
    }},
    {"type": "function", "function": {
        "name": "send_email",
        "description": "Send an email.",
        "parameters": {"type": "object", "properties": {
            "to": {"type": "string", "maxLength": 40},
            "subject": {"type": "string", "maxLength": 60},
            "urgent": {"type": "boolean"},
        }, "required": ["to", "subject", "urgent"], "additionalProperties": False},
    }},
]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}

TOOL_PROMPTS = [
    "What is the weather in Paris right now?",
    "Is it raining in Tokyo?",
    "Find me recent news about electric cars.",
    "Look up the population of Brazil.",
    "Email bob@example.com that the meeting moved to 3pm.",
    "Tell alice@example.com urgently that the server is down.",
    "Should I take an umbrella in London today, in fahrenheit?",
    "Search for a good lasagna recipe, 3 results.",
    "How hot is it in Cairo?",
    "Send a note to team@example.com with subject 'Lunch'.",
]

SCHEMAS = {
    "person": {"type": "object", "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 30},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "email": {"type": "string", "pattern": "^[a-z]{1,12}@[a-z]{1,12}\\.com$"},
    }, "required": ["name", "age", "email"], "additionalProperties": False},
    "recipe": {"type": "object", "properties": {
        "title": {"type": "string", "maxLength": 40},
        "ingredients": {"type": "array", "items": {"type": "string", "maxLength": 30},
                        "minItems": 1, "maxItems": 5},
        "minutes": {"type": "integer", "minimum": 1, "maximum": 600},
        "vegetarian": {"type": "boolean"},
    }, "required": ["title", "ingredients", "minutes", "vegetarian"], "additionalProperties": False},
    "event": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 40},
        "date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
        "location": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 30},
            "country": {"type": "string", "maxLength": 30},
        }, "required": ["city", "country"], "additionalProperties": False},
        "kind": {"enum": ["concert", "conference", "match", "other"]},
        "price": {"type": "number", "minimum": 0, "maximum": 1000},
    }, "required": ["name", "date", "location", "kind"], "additionalProperties": False},
}

JSON_PROMPTS = [
    "Describe a character from a novel.",
    "Tell me about your favourite dish.",
    "Invent something that happens next summer in Berlin.",
    "Write about a football game.",
    "A quick breakfast idea, please.",
    "Who is the oldest person you can imagine?",
    "Plan a tech meetup in Lisbon.",
    "Something with mushrooms.",
    "A jazz night.",
    "Make up a software engineer.",
]


def validate(instance, schema, what: str) -> None:
    try:
        jsonschema.validate(instance, schema)
    except jsonschema.ValidationError as e:
        raise AssertionError(f"{what}: {common.short(instance)} does not validate: {e.message}")


def check_calls(calls, allowed: set[str], what: str) -> None:
    expect(calls, f"{what}: no tool calls")
    for call in calls:
        expect_eq(call.type, "function", f"{what}: call type")
        expect(call.id, f"{what}: call without id")
        expect(call.function.name in allowed, f"{what}: unexpected function {call.function.name}")
        validate(json.loads(call.function.arguments), PARAMS[call.function.name], what)


def ask_tools(prompt: str, choice, parallel: bool, stream: bool):
    """(tool calls, finish_reason) of one greedy request."""
    kwargs = dict(model=MODEL, messages=[{"role": "user", "content": prompt}], tools=TOOLS,
                  tool_choice=choice, parallel_tool_calls=parallel, temperature=0, max_tokens=160)
    if not stream:
        r = client.chat.completions.create(**kwargs)
        return r.choices[0].message.tool_calls or [], r.choices[0].finish_reason
    calls: dict[int, dict] = {}
    finish = None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for choice_ in chunk.choices:
            finish = choice_.finish_reason or finish
            for d in choice_.delta.tool_calls or []:
                if d.index not in calls:
                    # The first delta of a call names it; its arguments follow in fragments.
                    expect(d.id and d.type == "function" and d.function and d.function.name,
                           f"a call's first delta carries id, type and name: {d}")
                c = calls.setdefault(d.index, {"id": "", "name": "", "arguments": "", "fragments": 0})
                c["fragments"] += 1
                c["id"] += d.id or ""
                c["name"] += (d.function.name or "") if d.function else ""
                c["arguments"] += (d.function.arguments or "") if d.function else ""
    expect(all(c["fragments"] > 2 for c in calls.values() if len(c["arguments"]) > 8),
           f"arguments stream in fragments as they are written: {calls}")
    out = [openai.types.chat.ChatCompletionMessageFunctionToolCall(
        id=c["id"], type="function", function={"name": c["name"], "arguments": c["arguments"]})
        for _, c in sorted(calls.items())]
    return out, finish


def forced_calls() -> None:
    names = set(PARAMS)
    with ThreadPoolExecutor(4) as pool:
        required = list(pool.map(lambda p: ask_tools(p, "required", False, False), TOOL_PROMPTS))
        streamed = list(pool.map(lambda p: ask_tools(p, "required", False, True), TOOL_PROMPTS))
        named = list(pool.map(
            lambda ip: ask_tools(ip[1], {"type": "function", "function": {"name": TOOLS[ip[0] % 3]["function"]["name"]}},
                                 False, False),
            enumerate(TOOL_PROMPTS)))
    for prompt, (calls, finish), (s_calls, s_finish) in zip(TOOL_PROMPTS, required, streamed):
        check_calls(calls, names, f"required: {prompt!r}")
        expect_eq(len(calls), 1, f"required, parallel_tool_calls false: {prompt!r}")
        expect_eq(finish, "tool_calls", f"required finish_reason: {prompt!r}")
        expect_eq([(c.function.name, c.function.arguments) for c in s_calls],
                  [(c.function.name, c.function.arguments) for c in calls], f"streamed calls: {prompt!r}")
        expect_eq(s_finish, "tool_calls", f"streamed finish_reason: {prompt!r}")
    for i, (prompt, (calls, finish)) in enumerate(zip(TOOL_PROMPTS, named)):
        name = TOOLS[i % 3]["function"]["name"]
        check_calls(calls, {name}, f"named {name}: {prompt!r}")
        expect_eq(finish, "tool_calls", f"named finish_reason: {prompt!r}")
    ok("required and named tool_choice: schema-valid calls on 10 prompts, whole and streamed")
    # Parallel calls allowed: each call (however many the model makes) is valid.
    calls, finish = ask_tools("Weather in Rome and in Oslo?", "required", True, False)
    check_calls(calls, names, "required, parallel")
    expect(finish in ("tool_calls", "length"), f"parallel finish_reason {finish}")
    ok(f"required with parallel calls: {len(calls)} valid call(s)")
    # A tool made from a Pydantic model, whose nested models are `$defs` with `$ref`s.

    class Address(pydantic.BaseModel):
        city: str = pydantic.Field(max_length=20)
        zip: str = pydantic.Field(pattern="^[0-9]{5}$")

    class Shipment(pydantic.BaseModel):
        to: str = pydantic.Field(max_length=20)
        address: Address
        back: Address | None

    ship = openai.pydantic_function_tool(Shipment, name="ship")
    expect("$defs" in json.dumps(ship), "the Pydantic tool schema has $defs")
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Ship a parcel to Ann in Rome."}], tools=[ship] + TOOLS,
        tool_choice={"type": "function", "function": {"name": "ship"}}, parallel_tool_calls=False,
        temperature=0, max_tokens=120)
    call = (r.choices[0].message.tool_calls or [None])[0]
    expect(call is not None and call.function.name == "ship", f"a ship call: {r.choices[0].message}")
    shipment = Shipment.model_validate_json(call.function.arguments)
    ok(f"a Pydantic tool with $defs: {shipment!r}")


def structured_output() -> None:
    jobs = [(name, prompt) for name in SCHEMAS for prompt in JSON_PROMPTS]

    def one(job):
        name, prompt = job
        r = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": prompt}], temperature=0, max_tokens=200,
            response_format={"type": "json_schema", "json_schema": {"name": name, "schema": SCHEMAS[name], "strict": True}})
        return r.choices[0]

    with ThreadPoolExecutor(4) as pool:
        for (name, prompt), choice in zip(jobs, pool.map(one, jobs)):
            expect_eq(choice.finish_reason, "stop", f"{name} / {prompt!r}: finish_reason")
            try:
                value = json.loads(choice.message.content)
            except json.JSONDecodeError as e:
                raise AssertionError(f"{name} / {prompt!r}: not JSON ({e}): {choice.message.content!r}")
            validate(value, SCHEMAS[name], f"{name} / {prompt!r}")
    ok("json_schema: 10 prompts x 3 schemas validate")
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Three facts about owls, as JSON."}],
        temperature=0, max_tokens=200, response_format={"type": "json_object"})
    if r.choices[0].finish_reason == "stop":
        expect(isinstance(json.loads(r.choices[0].message.content), dict), "json_object reply is an object")
    ok(f"json_object: {r.choices[0].finish_reason}")

    class City(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=30)
        country: str = pydantic.Field(max_length=30)
        population: int = pydantic.Field(ge=0, le=100_000_000)

    parsed = client.chat.completions.parse(
        model=MODEL, messages=[{"role": "user", "content": "Describe Paris."}],
        response_format=City, temperature=0, max_tokens=200)
    city = parsed.choices[0].message.parsed
    expect(isinstance(city, City), f"parse() gave {city!r}")
    ok(f"chat.completions.parse with Pydantic: {city!r}")


def tool_loop(stream: bool) -> None:
    system = {"role": "system", "content": "You are a helpful assistant. After a tool result, answer the user in one short sentence."}
    question = {"role": "user", "content": "What is the weather in Paris right now?"}
    first = client.chat.completions.create(model=MODEL, messages=[system, question], tools=TOOLS[:1],
                                           temperature=0, max_tokens=80)
    message = first.choices[0].message
    expect_eq(first.choices[0].finish_reason, "tool_calls", f"auto: the model calls the tool ({message})")
    check_calls(message.tool_calls, {"get_weather"}, "tool loop step 1")
    expect("paris" in json.loads(message.tool_calls[0].function.arguments)["city"].lower(), "asks for Paris")
    history = [system, question, message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": message.tool_calls[0].id,
                "content": json.dumps({"temperature_c": 18, "sky": "cloudy"})}]
    kwargs = dict(model=MODEL, messages=history, tools=TOOLS[:1], temperature=0, max_tokens=60)
    if stream:
        text, finish, usage, called = "", None, None, False
        for chunk in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs):
            for c in chunk.choices:
                text += c.delta.content or ""
                finish = c.finish_reason or finish
                called = called or bool(c.delta.tool_calls)
            usage = chunk.usage or usage
    else:
        second = client.chat.completions.create(**kwargs)
        text, finish, usage = second.choices[0].message.content, second.choices[0].finish_reason, second.usage
        called = bool(second.choices[0].message.tool_calls)
        if called:
            check_calls(second.choices[0].message.tool_calls, {"get_weather"}, "tool loop step 2")
    # The model answers, or calls again (this 0.5B model repeats its bare call and then
    # imagines a result): a call is a call, never raw call JSON in the answer.
    expect(finish in ("stop", "length") or (finish == "tool_calls" and called),
           f"the second turn ends as text or calls: {finish}")
    expect(finish == "tool_calls" or (text and text.strip()), "an answer has text")
    expect('"arguments"' not in (text or ""), f"no call left in the answer text: {text!r}")
    # The first turn's prompt comes from the cache. (Its reply is re-rendered in the
    # template's tagged form, which matches the generated tokens only when the model
    # wrote the tags itself; this model writes the call bare.)
    cached = common.cached_tokens(usage)
    expect(cached >= first.usage.prompt_tokens,
           f"second turn reused {cached} tokens of the first turn's {first.usage.prompt_tokens}")
    ok(f"tool loop ({'streamed' if stream else 'whole'}): call, result, answer {(text or '')[:60]!r}; {cached} tokens reused")


def refusals() -> None:
    msgs = [{"role": "user", "content": "hi"}]
    for field, value in [("functions", [{"name": "f", "parameters": {}}]), ("function_call", "auto")]:
        resp = common.post("/v1/chat/completions", {"model": MODEL, "messages": msgs, field: value})
        err = common.check_error_response(resp, 400, field)
        expect_eq(err.get("param"), field, f"{field}: param")
    bad = {"type": "object", "properties": {"a": {"type": "string", "not": {"const": "x"}}}}
    resp = common.post("/v1/chat/completions", {"model": MODEL, "messages": msgs, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": bad}}})
    err = common.check_error_response(resp, 400, "unsupported schema keyword")
    expect("not" in err["message"] and err.get("param") == "response_format", f"names the keyword: {err}")
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "uniqueItems": True}}}
    resp = common.post("/v1/chat/completions", {"model": MODEL, "messages": msgs, "tools": [tool], "tool_choice": "required"})
    err = common.check_error_response(resp, 400, "unsupported keyword in tool parameters")
    expect("uniqueItems" in err["message"] and err.get("param") == "tools", f"names the keyword: {err}")
    resp = common.post("/v1/completions", {"model": MODEL, "prompt": "x", "response_format": {"type": "json_object"}})
    expect_eq(common.check_error_response(resp, 400, "completions").get("param"), "response_format", "param")
    ok("legacy functions and unsupported schema keywords are 400s naming them")


def main() -> None:
    refusals()
    if os.environ.get("PYRAMID_TOOL_LOOP"):
        tool_loop(stream=False)
        tool_loop(stream=True)
    forced_calls()
    structured_output()


common.run(main)
