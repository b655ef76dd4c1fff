"""Structured output and tool calling through the real server and the official openai client.

The tiny model's weights are random, so only the grammar (llguidance's bitmask in the sampler) can make its output
valid JSON that matches a schema: every one of 20 seeded answers is parsed and validated with jsonschema, and the
same request without response_format is checked not to be JSON. LangChain's ChatOpenAI (with_structured_output,
bind_tools) runs against the same server (langchain-openai is a test dependency; nothing is fetched at run time).
"""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "kind": {"enum": ["cat", "dog", "bird"]},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
        "owner": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 9999},
                                                     "vip": {"type": "boolean"}},
                  "required": ["id", "vip"], "additionalProperties": False},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
    },
    "required": ["name", "kind", "age", "owner", "tags"],
    "additionalProperties": False,
}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]},
                                                    "unit": {"enum": ["C", "F"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {"tz": {"enum": ["UTC", "CET"]}},
                                       "required": ["tz"], "additionalProperties": False}}}
USER = [{"role": "user", "content": "Describe a pet as JSON."}]


def test_json_schema_20_seeded_answers_all_validate(api_client):
    fmt = {"type": "json_schema", "json_schema": {"name": "pet", "schema": SCHEMA, "strict": True}}

    def ask(seed: int):
        return api_client.chat.completions.create(model="tiny", messages=USER, max_tokens=200, temperature=1.0,
                                              seed=seed, response_format=fmt)

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(ask, range(20)))
    for a in answers:
        assert a.choices[0].finish_reason == "stop", a.choices[0].message.content
        jsonschema.validate(json.loads(a.choices[0].message.content), SCHEMA)
    assert len({a.choices[0].message.content for a in answers}) > 10  # sampled, not one fixed answer
    free = api_client.chat.completions.create(model="tiny", messages=USER, max_tokens=60, temperature=1.0, seed=0)
    with pytest.raises(ValueError):
        json.loads(free.choices[0].message.content)  # without the grammar the random model writes no JSON


def test_json_object_on_completions_and_a_streamed_json_schema_chat(api_client):
    # any JSON object: its strings are unbounded, and this seed (checked) closes the object within max_tokens
    out = api_client.completions.create(model="tiny", prompt="JSON:", max_tokens=300, seed=2,
                                    extra_body={"response_format": {"type": "json_object"}})
    assert out.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(out.choices[0].text), dict)
    fmt = {"type": "json_schema", "json_schema": {"name": "pet", "schema": SCHEMA}}
    chunks = api_client.chat.completions.create(model="tiny", messages=USER, max_tokens=200, seed=2, stream=True,
                                            response_format=fmt)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    jsonschema.validate(json.loads(text), SCHEMA)


@pytest.mark.parametrize("body,param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/nope"}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format.json_schema"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"functions": [{"name": "f"}]}, "functions"),
    ({"modalities": ["text", "audio"]}, "modalities"),
    ({"web_search_options": {}}, "web_search_options"),
])
def test_unusable_formats_and_tools_are_400_naming_the_field(api_server, body, param):
    r = httpx.post(api_server.url + "/v1/chat/completions", json={"messages": USER, "max_tokens": 4, **body},
                   timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.text


def _check_call(call, tool):
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == tool["function"]["name"]
    jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])


def test_tool_choice_required_and_named_come_back_as_tool_calls_and_round_trip(api_client):
    for seed in range(3):
        out = api_client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Weather?"}],
                                             tools=[WEATHER], tool_choice="required", max_tokens=120, seed=seed)
        choice = out.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        for call in choice.message.tool_calls:
            _check_call(call, WEATHER)
    named = api_client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Time?"}],
                                           tools=[WEATHER, TIME], max_tokens=120, seed=4,
                                           tool_choice={"type": "function", "function": {"name": "get_time"}})
    calls = named.choices[0].message.tool_calls
    assert len(calls) == 1
    _check_call(calls[0], TIME)
    history = [{"role": "user", "content": "Time?"}, named.choices[0].message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": calls[0].id, "content": '{"time": "12:00"}'}]
    answer = api_client.chat.completions.create(model="tiny", messages=history, tools=[WEATHER, TIME],
                                            tool_choice="none", max_tokens=8)
    assert answer.choices[0].message.tool_calls is None and answer.choices[0].finish_reason == "length"
    assert answer.usage.prompt_tokens > named.usage.prompt_tokens  # the call and its result were rendered


def test_streamed_tool_calls_arrive_whole_in_one_delta(api_client):
    chunks = list(api_client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Weather?"}], tools=[WEATHER], tool_choice="required",
        max_tokens=120, seed=0, stream=True, stream_options={"include_usage": True}))
    deltas = [c.choices[0] for c in chunks if c.choices]
    calls = [t for d in deltas for t in (d.delta.tool_calls or [])]
    assert calls and [t.index for t in calls] == list(range(len(calls)))
    for call in calls:
        _check_call(call, WEATHER)
    assert deltas[-1].finish_reason == "tool_calls" and not any(d.delta.content for d in deltas)
    assert chunks[-1].usage.completion_tokens > 0
    text = api_client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}],
                                              tools=[WEATHER], tool_choice="none", max_tokens=5, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in text if c.choices)


def test_tool_choice_auto_answers_text_or_a_valid_call(api_client):
    for seed in range(3):
        out = api_client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}],
                                             tools=[WEATHER], max_tokens=40, seed=seed)
        msg = out.choices[0].message
        if msg.tool_calls:
            assert out.choices[0].finish_reason == "tool_calls"
            for call in msg.tool_calls:
                _check_call(call, WEATHER)
        else:
            assert msg.content and not msg.content.startswith("[")


# ---- LangChain's ChatOpenAI, as apps use it ----------------------------------------------------------------------
class Pet(BaseModel):
    """A pet."""

    kind: Literal["cat", "dog", "bird"]
    age: int = Field(ge=0, le=30)
    vaccinated: bool
    tags: list[Literal["small", "big", "fluffy"]] = Field(max_length=3)


def get_weather(city: Literal["Paris", "Oslo"], unit: Literal["C", "F"]) -> str:
    """Weather in a city."""
    return f"12 {unit} in {city}"


@pytest.fixture(scope="module")
def chat(api_server):
    langchain_openai = pytest.importorskip("langchain_openai")
    return langchain_openai.ChatOpenAI(base_url=api_server.url + "/v1", api_key="unused", model="tiny", max_tokens=150,
                                       temperature=1.0, seed=1, max_retries=0, timeout=120)


def test_langchain_with_structured_output_returns_a_validated_object(chat):
    assert isinstance(chat.with_structured_output(Pet, method="json_schema").invoke("Describe a pet."), Pet)


def test_langchain_bind_tools_returns_tool_calls(chat):
    for choice in ("required", "get_weather"):
        msg = chat.bind_tools([get_weather], tool_choice=choice).invoke("Weather in Paris?")
        assert msg.tool_calls, msg
        call = msg.tool_calls[0]
        assert call["name"] == "get_weather" and set(call["args"]) == {"city", "unit"}
        assert get_weather(**call["args"]).endswith(call["args"]["city"])  # the arguments fit its signature
