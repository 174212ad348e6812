#!/usr/bin/env python3
"""Regenerates tests/data/tool_templates.json: each test model's own chat template rendered by
transformers (`render_jinja_template`, Jinja2 with transformers' `tojson`) for conversations with
tool definitions, assistant tool calls and tool results.

Usage, from the repository root (needs `transformers`, `jinja2` and `gguf` from PyPI):

    ~/.cache/pyramid/test-venv/bin/pip install transformers jinja2 gguf
    ~/.cache/pyramid/test-venv/bin/python crates/tokenizer/tests/tool_templates.py \
        > crates/tokenizer/tests/data/tool_templates.json

Models are read from $PYRAMID_HOME/models (default ~/.cache/pyramid/models).
"""

import json
import os

import gguf
from transformers.utils.chat_template_utils import render_jinja_template

MODELS = ["qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "smollm2-135m-instruct-q4_1.gguf"]

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

CONVERSATIONS = [
    {"tools": [WEATHER, CLOCK], "messages": [{"role": "user", "content": "Weather in Paris?"}]},
    {
        "tools": [WEATHER],
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Paris and Rome?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                    {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome", "days": 2}}},
                ],
            },
            {"role": "tool", "content": "{\"temp\": 21}", "tool_call_id": "call_1"},
            {"role": "tool", "content": "sunny", "tool_call_id": "call_2"},
        ],
    },
    {"tools": [], "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "bye"}]},
]


def main():
    home = os.environ.get("PYRAMID_HOME", os.path.expanduser("~/.cache/pyramid"))
    out = {}
    for file in MODELS:
        reader = gguf.GGUFReader(os.path.join(home, "models", file))
        field = reader.fields["tokenizer.chat_template"]
        template = bytes(field.parts[field.data[0]]).decode()
        cases = []
        for conv in CONVERSATIONS:
            rendered, _ = render_jinja_template(
                conversations=[conv["messages"]],
                tools=conv["tools"] or None,
                chat_template=template,
                add_generation_prompt=True,
            )
            cases.append({**conv, "text": rendered[0]})
        out[file] = cases
    json.dump(out, __import__("sys").stdout, ensure_ascii=False, indent=1)
    print()


if __name__ == "__main__":
    main()
