#!/usr/bin/env python3
"""Regenerates tests/data/family_templates.json: the chat templates of Qwen3, SmolLM3 and
Phi-3.5, and one with `{% generation %}` tags (tests/data/templates/), rendered by
transformers (`render_jinja_template`, Jinja2 with transformers' `tojson`) for plain and multi-turn chats, tools with assistant tool
calls and tool results, assistant turns with their reasoning (a `reasoning_content`
field, or `<think>…</think>` in the content as clients send it back), and each family's
switches (`enable_thinking`, SmolLM3's `/think` and `/no_think` in the system prompt).

Usage, from the repository root (needs `transformers` and `jinja2` from PyPI):

    ~/.cache/pyramid/test-venv/bin/pip install transformers jinja2
    ~/.cache/pyramid/test-venv/bin/python crates/tokenizer/tests/family_templates.py \
        > crates/tokenizer/tests/data/family_templates.json
"""

import json
import os
import sys

from transformers.utils.chat_template_utils import render_jinja_template

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")

# Each template with the BOS/EOS texts its tokenizer passes (tokenizer_config.json; Qwen3's
# and SmolLM3's have no BOS token).
TEMPLATES = {
    "Qwen-Qwen3-0.6B.jinja": {"bos_token": "", "eos_token": "<|im_end|>"},
    "HuggingFaceTB-SmolLM3-3B.jinja": {"bos_token": "", "eos_token": "<|im_end|>"},
    "microsoft-Phi-3.5-mini-instruct.jinja": {"bos_token": "<s>", "eos_token": "<|endoftext|>"},
    # SmolLM3's own template marks assistant turns with transformers' {% generation %} tags.
    "generation-tags.jinja": {"bos_token": "", "eos_token": "<|im_end|>"},
}

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city, in <b>°C</b> & words.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "e.g. \"Zürich\""},
                "days": {"type": "integer", "minimum": 1},
            },
            "required": ["city"],
        },
    },
}
CLOCK = {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}


def call(id, name, arguments):
    return {"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}


USER = {"role": "user", "content": "What is 2 + 2?"}
TOOL_TURNS = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris and Rome?"},
    {
        "role": "assistant",
        "content": "",
        "reasoning_content": "Two cities: two calls.",
        "tool_calls": [
            call("call_1", "get_weather", {"city": "Paris"}),
            # As OpenAI clients send arguments: a JSON string, printed as it is.
            call("call_2", "get_weather", "{\"city\": \"Rome\", \"days\": 2}"),
        ],
    },
    {"role": "tool", "content": "{\"temp\": 21}", "tool_call_id": "call_1"},
    {"role": "tool", "content": "sunny", "tool_call_id": "call_2"},
]

# name -> messages, tools, template keywords, add_generation_prompt
CASES = {
    "plain": ([USER], [], {}, True),
    "system_multi_turn": (
        [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "bye"},
        ],
        [],
        {},
        True,
    ),
    "multi_turn_no_generation_prompt": (
        [USER, {"role": "assistant", "content": "4"}],
        [],
        {},
        False,
    ),
    "tools_and_results": (TOOL_TURNS, [WEATHER, CLOCK], {}, True),
    "tools_then_answer_then_new_query": (
        TOOL_TURNS
        + [
            {"role": "assistant", "content": "Paris 21°C, Rome sunny.", "reasoning_content": "Both answered."},
            {"role": "user", "content": "And tomorrow?"},
            {"role": "assistant", "content": "", "reasoning_content": "The date.", "tool_calls": [call("call_3", "now", {})]},
            # A tool result sent as a user turn: Qwen3's template does not count it as a query.
            {"role": "user", "content": "<tool_response>\n2025-07-01\n</tool_response>"},
        ],
        [WEATHER, CLOCK],
        {},
        True,
    ),
    "tool_call_with_content": (
        [
            {"role": "user", "content": "Time?"},
            {"role": "assistant", "content": "Let me look.", "tool_calls": [call("c", "now", {})]},
        ],
        [CLOCK],
        {},
        False,
    ),
    "reasoning_content_field": (
        [
            USER,
            {"role": "assistant", "content": "4", "reasoning_content": "\nTwo and two make four.\n"},
            {"role": "user", "content": "And 3 + 3?"},
            {"role": "assistant", "content": "\n6", "reasoning_content": "Six."},
        ],
        [],
        {},
        False,
    ),
    "reasoning_in_content_as_clients_resend_it": (
        [
            USER,
            {"role": "assistant", "content": "<think>\nTwo and two.\n</think>\n\n4"},
            {"role": "user", "content": "And 3 + 3?"},
            {"role": "assistant", "content": "<think>\nThree and three.\n</think>\n\n6"},
        ],
        [],
        {},
        False,
    ),
    "empty_reasoning_content_field": (
        [USER, {"role": "assistant", "content": "<think>ignored</think>4", "reasoning_content": ""}],
        [],
        {},
        False,
    ),
    "enable_thinking_false": ([USER], [], {"enable_thinking": False}, True),
    "enable_thinking_false_multi_turn": (
        [USER, {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3 + 3?"}],
        [],
        {"enable_thinking": False},
        True,
    ),
    "enable_thinking_true": ([USER], [], {"enable_thinking": True}, True),
    "system_no_think": (
        [{"role": "system", "content": "Be brief. /no_think"}, USER, {"role": "assistant", "content": "4"}, USER],
        [],
        {},
        True,
    ),
    "system_think_overrides_keyword": (
        [{"role": "system", "content": "/think\nShow your work."}, USER],
        [],
        {"enable_thinking": False},
        True,
    ),
    "system_only_switch": ([{"role": "system", "content": "/no_think"}, USER], [], {}, True),
}


def main():
    out = {}
    for file, tokens in TEMPLATES.items():
        with open(os.path.join(DATA, "templates", file), encoding="utf-8") as f:
            template = f.read()
        cases = []
        for name, (messages, tools, kwargs, add_generation_prompt) in CASES.items():
            rendered, _ = render_jinja_template(
                conversations=[messages],
                tools=tools or None,
                chat_template=template,
                add_generation_prompt=add_generation_prompt,
                **tokens,
                **kwargs,
            )
            cases.append(
                {
                    "name": name,
                    "messages": messages,
                    "tools": tools,
                    "kwargs": kwargs,
                    "add_generation_prompt": add_generation_prompt,
                    "text": rendered[0],
                }
            )
        out[file] = {**tokens, "cases": cases}
    json.dump(out, sys.stdout, ensure_ascii=False, indent=1)
    print()


if __name__ == "__main__":
    main()
