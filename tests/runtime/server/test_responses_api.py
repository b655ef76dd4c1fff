"""POST /v1/responses against one real server, through the official openai SDK (responses.create, plain, streamed,
with a function tool, with a JSON schema, previous_response_id) and LangChain's ChatOpenAI(use_responses_api=True):
the answer is the chat path's for the same request, usage counted as for chat, every field honoured or refused."""
from __future__ import annotations

import json

import httpx
import openai
import pytest

from deployctl_runtime.server.fields import REFUSED, RESPONSES_FIELDS
from deployctl_runtime.server.responses_api import ResponseStore

from .conftest import running

SEA = "Tell me about the sea"
WEATHER = {"type": "function", "name": "get_weather", "description": "the weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
                          "required": ["city"]}}
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


@pytest.fixture(scope="module")
def server(tiny_model):
    yield from running(["--model", str(tiny_model), "--max-model-len", "512", "--num-gpu-blocks-override", "128",
                        "--served-model-name", "tiny"])


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def chat(server, messages, **fields) -> dict:
    r = httpx.post(server.url + "/v1/chat/completions", timeout=120,
                   json={"messages": messages, "temperature": 0, **fields})
    assert r.status_code == 200, r.text
    return r.json()


def post(server, **body) -> httpx.Response:
    return httpx.post(server.url + "/v1/responses", json=body, timeout=120)


def test_plain_answer_is_the_chat_answer_with_usage_counted_as_for_chat(server, client):
    r = client.responses.create(model="tiny", input=SEA, instructions="Be brief.", max_output_tokens=12,
                                temperature=0)
    want = chat(server, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": SEA}],
                max_tokens=12)
    assert r.object == "response" and r.id.startswith("resp_") and r.model == "tiny"
    assert r.output_text == want["choices"][0]["message"]["content"] and r.output[0].type == "message"
    assert r.usage.input_tokens == want["usage"]["prompt_tokens"]
    assert r.usage.output_tokens == want["usage"]["completion_tokens"]
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    if want["choices"][0]["finish_reason"] == "length":
        assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    else:
        assert r.status == "completed"
    # input as messages with text parts: the same prompt
    parts = client.responses.create(model="tiny", max_output_tokens=12, temperature=0, input=[
        {"role": "system", "content": "Be brief."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": SEA}]}])
    assert parts.output_text == r.output_text and parts.usage.input_tokens == r.usage.input_tokens
    # temperature and top_p are honoured: a hot sample differs, top_p 1e-9 is greedy again
    hot = [client.responses.create(model="tiny", input=SEA, max_output_tokens=12, temperature=2.0).output_text
           for _ in range(2)]
    plain = client.responses.create(model="tiny", input=SEA, max_output_tokens=12, temperature=0).output_text
    assert any(h != plain for h in hot)
    assert client.responses.create(model="tiny", input=SEA, max_output_tokens=12, temperature=2.0,
                                   top_p=1e-9).output_text == plain


def test_streamed_with_the_responses_event_types(client):
    whole = client.responses.create(model="tiny", input=SEA, max_output_tokens=10, temperature=0)
    events = list(client.responses.create(model="tiny", input=SEA, max_output_tokens=10, temperature=0,
                                          stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[2:4] == ["response.output_item.added", "response.content_part.added"]
    assert kinds[-4:-1] == ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == whole.output_text == events[-4].text == events[-1].response.output_text
    assert events[-1].response.usage.output_tokens == whole.usage.output_tokens
    assert events[-1].response.status == whole.status


def test_a_function_tool_call_whole_and_streamed(client):
    r = client.responses.create(model="tiny", input="What is the weather in Paris?", tools=[WEATHER],
                                tool_choice="required", max_output_tokens=60, temperature=0)
    call = r.output[0]
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id
    assert json.loads(call.arguments)["city"] in ("Paris", "Oslo")
    events = list(client.responses.create(model="tiny", input="What is the weather in Paris?", tools=[WEATHER],
                                          tool_choice="required", max_output_tokens=60, temperature=0, stream=True))
    kinds = [e.type for e in events]
    assert "response.function_call_arguments.delta" in kinds and "response.output_text.delta" not in kinds
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert done.arguments == call.arguments
    assert events[-1].type == "response.completed" and events[-1].response.output[0].name == "get_weather"
    # the call's answer goes back as function_call + function_call_output items: the template sees both
    follow = client.responses.create(model="tiny", max_output_tokens=8, temperature=0, tools=[WEATHER], input=[
        {"role": "user", "content": "What is the weather in Paris?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}])
    assert follow.usage.input_tokens > r.usage.input_tokens
    # a named tool_choice, and none
    named = client.responses.create(model="tiny", input="hi", tools=[WEATHER], max_output_tokens=60, temperature=0,
                                    tool_choice={"type": "function", "name": "get_weather"})
    assert named.output[0].type == "function_call"
    none = client.responses.create(model="tiny", input="hi", tools=[WEATHER], tool_choice="none",
                                   max_output_tokens=8, temperature=0)
    assert none.output[0].type == "message"


def test_a_json_schema_text_format_is_enforced(client):
    r = client.responses.create(model="tiny", input="Give a person as JSON", max_output_tokens=80, temperature=0,
                                text={"format": {"type": "json_schema", "name": "person", "schema": SCHEMA,
                                                 "strict": True}})
    person = json.loads(r.output_text)
    assert set(person) == {"name", "age"} and isinstance(person["age"], int)
    assert r.text.format.type == "json_schema"
    obj = client.responses.create(model="tiny", input="JSON please", max_output_tokens=40, temperature=0,
                                  text={"format": {"type": "json_object"}})
    assert obj.output_text.startswith("{")
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="tiny", input="x", text={"format": {"type": "json_schema", "name": "a",
                                                                           "schema": {"type": "nope"}}})
    assert err.value.body["param"].startswith("text.format")


def test_previous_response_id_continues_a_stored_conversation(server, client):
    first = client.responses.create(model="tiny", input="My name is Ada.", max_output_tokens=6, temperature=0)
    second = client.responses.create(model="tiny", input="What is my name?", previous_response_id=first.id,
                                     max_output_tokens=6, temperature=0)
    want = chat(server, [{"role": "user", "content": "My name is Ada."},
                         {"role": "assistant", "content": first.output_text},
                         {"role": "user", "content": "What is my name?"}], max_tokens=6)
    assert second.usage.input_tokens == want["usage"]["prompt_tokens"]
    assert second.output_text == want["choices"][0]["message"]["content"]
    assert second.previous_response_id == first.id
    unstored = client.responses.create(model="tiny", input="hi", store=False, max_output_tokens=2)
    for missing in (unstored.id, "resp_nope"):
        with pytest.raises(openai.NotFoundError) as err:
            client.responses.create(model="tiny", input="again", previous_response_id=missing)
        assert (err.value.body["param"], err.value.body["code"]) == ("previous_response_id",
                                                                      "previous_response_not_found")


def test_a_stored_response_is_retrieved_as_answered_and_deleted(client):
    """GET /v1/responses/{id} (the SDK's responses.retrieve) gives the response object as it was answered, streamed
    or not; DELETE forgets it: retrieve and previous_response_id then 404; store false is never retrievable."""
    whole = client.responses.create(model="tiny", input=SEA, max_output_tokens=8, temperature=0)
    last = list(client.responses.create(model="tiny", input=SEA, max_output_tokens=8, temperature=0, stream=True))[-1]
    assert last.type in ("response.completed", "response.incomplete")
    streamed = last.response
    for made in (whole, streamed):
        got = client.responses.retrieve(made.id)
        assert got.model_dump() == made.model_dump()
        assert got.output_text == whole.output_text and got.usage.output_tokens == made.usage.output_tokens
    gone = client.responses.delete(whole.id)
    assert gone is None  # the SDK returns nothing on success; the server answered {"deleted": true}
    unstored = client.responses.create(model="tiny", input="hi", store=False, max_output_tokens=2)
    for missing in (whole.id, unstored.id, "resp_nope"):
        with pytest.raises(openai.NotFoundError) as err:
            client.responses.retrieve(missing)
        assert (err.value.body["param"], err.value.body["code"]) == ("response_id", "response_not_found")
        assert missing in err.value.body["message"]
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(whole.id)
    with pytest.raises(openai.NotFoundError) as err:
        client.responses.create(model="tiny", input="again", previous_response_id=whole.id)
    assert err.value.body["code"] == "previous_response_not_found"


def test_the_store_is_bounded_oldest_first():
    store = ResponseStore(capacity=2)
    for k in "abc":
        store.put(k, [{"role": "user", "content": k}])
    assert store.get("a") is None and store.get("b") and store.get("c")


REFUSED_VALUES = [
    ("reasoning", {"effort": "low"}), ("include", ["message.output_text.logprobs"]), ("background", True),
    ("truncation", "auto"), ("top_logprobs", 2), ("conversation", "conv_1"), ("max_tool_calls", 2),
    ("text", {"verbosity": "low"}), ("prompt", {"id": "p"}), ("stream_options", {"include_obfuscation": True}),
    ("context_management", [{"type": "compaction"}]),
]


def test_every_refused_row_of_the_responses_table_is_probed():
    refused = {n for n, r in RESPONSES_FIELDS.items() if r.status == REFUSED}
    assert {"text.verbosity" if f == "text" else f for f, _ in REFUSED_VALUES} == refused


@pytest.mark.parametrize("field,value", REFUSED_VALUES)
def test_refused_fields_are_400_naming_them(server, field, value):
    r = post(server, input="hi", max_output_tokens=2, **{field: value})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "unsupported_parameter" and err["param"] == ("text.verbosity" if field == "text" else field)


def test_off_values_ignored_and_unknown_fields_and_renamed_errors(server):
    base = post(server, input=SEA, max_output_tokens=4, temperature=0).json()
    for off in ({"include": []}, {"background": False}, {"truncation": "disabled"}, {"top_logprobs": 0},
                {"reasoning": None}, {"user": "u1", "safety_identifier": "s", "prompt_cache_key": "k",
                                      "service_tier": "auto"}):
        r = post(server, input=SEA, max_output_tokens=4, temperature=0, **off)
        assert r.status_code == 200 and r.json()["output"] == [
            {**o, "id": r.json()["output"][0]["id"]} for o in base["output"]], (off, r.text)
    assert post(server, input="hi", max_output_tokens=2, metadata={"team": "a"}).json()["metadata"] == {"team": "a"}
    err = post(server, input="hi", max_output_token=2).json()["error"]
    assert (err["param"], err["code"]) == ("max_output_token", "unsupported_parameter")
    err = post(server, input="hi", max_output_tokens=10**6).json()["error"]
    assert err["param"] == "max_output_tokens" and "max_output_tokens" in err["message"], err
    err = post(server, input=[{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]).json()
    assert err["error"]["param"] == "input[0].content[0].type"
    err = post(server, input=[{"role": "user", "content": "hi", "contnet": "x"}]).json()["error"]
    assert err["param"] == "input[0].contnet"
    err = post(server, input="hi", tools=[{"type": "web_search"}]).json()["error"]
    assert (err["param"], err["code"]) == ("tools[0].type", "unsupported_parameter")
    assert post(server, input="hi", model="nope").status_code == 404
    assert post(server).json()["error"]["param"] == "input"


def test_langchain_chat_openai_with_the_responses_api(server):
    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel, Field

    llm = ChatOpenAI(model="tiny", base_url=server.url + "/v1", api_key="unused", use_responses_api=True,
                     max_tokens=8, temperature=0, max_retries=0)
    msg = llm.invoke(SEA)
    assert msg.text == chat(server, [{"role": "user", "content": SEA}], max_tokens=8)["choices"][0]["message"][
        "content"]
    assert msg.usage_metadata["output_tokens"] > 0
    assert "".join(c.text for c in llm.stream(SEA)) == msg.text

    tooled = ChatOpenAI(model="tiny", base_url=server.url + "/v1", api_key="unused", use_responses_api=True,
                        max_tokens=60, temperature=0, max_retries=0).bind_tools([WEATHER], tool_choice="required")
    calls = tooled.invoke("What is the weather in Paris?").tool_calls
    assert calls and calls[0]["name"] == "get_weather"

    class Person(BaseModel):
        name: str = Field(max_length=8)  # the tiny model's strings run on: the schema bounds them
        age: int

    structured = ChatOpenAI(model="tiny", base_url=server.url + "/v1", api_key="unused", use_responses_api=True,
                            max_tokens=120, temperature=0, max_retries=0).with_structured_output(Person)
    assert isinstance(structured.invoke("Give a person"), Person)
