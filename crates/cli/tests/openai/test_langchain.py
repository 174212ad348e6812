"""A real agent framework against `pyramid serve`: langchain-openai's ChatOpenAI.

One tool-using task end to end: `bind_tools` with a Python function, the model calls it,
the tool runs, its result goes back as a ToolMessage, and the model answers; then
`with_structured_output` with a Pydantic model returns that model. Every field
langchain sends must be one pyramid implements (unknown fields would be a 400).
"""

from __future__ import annotations

import json

import pydantic
from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

import common
from common import expect, ok

cfg = common.config()

calls_made: list[dict] = []


@tool
def get_weather(city: str) -> str:
    """The current weather in a city."""
    calls_made.append({"city": city})
    return json.dumps({"city": city, "temperature_c": 18, "sky": "cloudy"})


class City(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=30)
    country: str = pydantic.Field(max_length=30)


def main() -> None:
    llm = ChatOpenAI(base_url=cfg.base_url + "/v1", api_key=cfg.api_key or "unused",
                     model=cfg.model, temperature=0, max_tokens=80, timeout=120)
    agent = llm.bind_tools([get_weather])
    messages = [SystemMessage("You are a helpful assistant. After a tool result, answer the user in one short sentence."),
                HumanMessage("What is the weather in Paris right now?")]
    reply = agent.invoke(messages)
    expect(reply.tool_calls, f"the model calls a tool: {reply!r}")
    messages.append(reply)
    for call in reply.tool_calls:
        expect(call["name"] == "get_weather", f"calls get_weather: {call}")
        messages.append(ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"]))
    expect(calls_made and "paris" in calls_made[0]["city"].lower(), f"the tool ran for Paris: {calls_made}")
    answer = agent.invoke(messages)
    expect(isinstance(answer.content, str) and answer.content.strip(), f"an answer in text: {answer!r}")
    ok(f"bind_tools: call {calls_made[0]}, answer {answer.content[:60]!r}")
    city = llm.with_structured_output(City).invoke("Describe Paris.")
    expect(isinstance(city, City), f"with_structured_output gave {city!r}")
    ok(f"with_structured_output: {city!r}")


common.run(main)
