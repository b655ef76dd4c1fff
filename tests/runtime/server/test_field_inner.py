"""The field table's rows for keys inside each message and each tool ("messages[].name", ...), walked row by row
against a real server whose chat template shows every message key it is given (so a key given to the template is
seen in the prompt's token count), and the unknown keys there: a misspelt message key or tool key is 400 naming
its indexed path (it used to be dropped with a 200: `contnet` became an empty user message), ignored with a warning
under --ignore-unknown-fields. The top-level rows: test_field_table.py."""
from __future__ import annotations

import json
import shutil

import httpx
import pytest

from deployctl_runtime.server.fields import FIELDS, IGNORED, REFUSED, TEMPLATE

from .conftest import running
from .fieldask import WEATHER, ask, ok, text

INNER = {name: rule for name, rule in FIELDS.items() if name.startswith("messages[].")}
SEA = "Tell me about the sea"
# a value of each row as a client sends it (a second user turn carries it)
VALUES = {"messages[].name": "bob", "messages[].tool_call_id": "call_1",
          "messages[].tool_calls": [{"id": "call_1", "type": "function",
                                     "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}],
          "messages[].reasoning": "the user asks about the sea", "messages[].reasoning_content": "the sea",
          "messages[].annotations": [{"type": "url_citation", "url_citation": {"url": "https://x", "title": "x",
                                                                                "start_index": 0, "end_index": 1}}],
          "messages[].parsed": {"city": "Oslo"}}
# ChatML with every key of a message after its content, as a template that reads them would show them
SHOWS_KEYS = ("{% if tools is defined %}<|im_start|>system\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}"
              "<|im_end|>\n{% endif %}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
              "{% for k, v in m.items() %}{% if k not in ('role', 'content') %}\n{{ k }}: {{ v | tojson }}{% endif %}"
              "{% endfor %}<|im_end|>\n{% endfor %}<|im_start|>assistant\n"
              "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}")


def with_key(key: str | None, value) -> list[dict]:
    """Two user turns, the second with `key` (a row's last part) set to `value`; key None: without it."""
    second = {"role": "user", "content": SEA, **({} if key is None else {key: value})}
    return [{"role": "user", "content": "hi"}, second]


@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory):
    model = tmp_path_factory.mktemp("inner") / "shows-keys"
    shutil.copytree(tiny_model, model)
    cfg = json.loads((model / "tokenizer_config.json").read_text())
    cfg["chat_template"] = SHOWS_KEYS
    (model / "tokenizer_config.json").write_text(json.dumps(cfg))
    yield from running(["--model", str(model), "--skip-verify", "--max-model-len", "512",
                        "--num-gpu-blocks-override", "128"])


def prompt_tokens(srv, messages) -> int:
    return ok(srv, True, messages=messages, max_tokens=1)["usage"]["prompt_tokens"]


@pytest.mark.parametrize("name", sorted(INNER))
def test_every_message_key_is_given_to_the_template_ignored_or_refused(server, name):
    rule, key = INNER[name], name.split(".", 1)[1]
    if rule.status == TEMPLATE:  # the template got it: it shows in the prompt
        assert prompt_tokens(server, with_key(key, VALUES[name])) > prompt_tokens(server, with_key(None, None))
    elif rule.status == IGNORED:  # accepted, the same prompt and answer
        base = ok(server, True, messages=with_key(None, None), ignore_eos=True)
        got = ok(server, True, messages=with_key(key, VALUES[name]), ignore_eos=True)
        assert (text(got, True), got["usage"]["prompt_tokens"]) == (text(base, True), base["usage"]["prompt_tokens"])
    else:
        assert rule.status == REFUSED
        r = ask(server, True, messages=with_key(key, {"some": "value"}))
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert (err["code"], err["param"]) == ("unsupported_parameter", f"messages[1].{key}"), err
        assert rule.why in err["message"]
    # null asks for nothing, whatever the row: the prompt is the one without the key
    assert prompt_tokens(server, with_key(key, None)) == prompt_tokens(server, with_key(None, None))


def test_an_echoed_assistant_message_with_its_null_keys_is_served(server):
    # what `resp.choices[0].message.model_dump()` gives back: refusal, audio, function_call, annotations as null
    import openai

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    model = client.models.list().data[0].id
    first = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    echoed = first.choices[0].message.model_dump()
    echoed.update({"refusal": None, "audio": None, "function_call": None, "annotations": None})
    again = client.chat.completions.create(model=model, max_tokens=4, messages=[
        {"role": "user", "content": "hi"}, echoed, {"role": "user", "content": SEA}])
    assert again.choices[0].finish_reason in ("length", "stop")


@pytest.mark.parametrize("fields,param", [
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "user", "contnet": SEA}]}, "messages[1].contnet"),
    ({"messages": [{"role": "user", "content": SEA, "nmae": "bob"}]}, "messages[0].nmae"),
    ({"tools": [{"type": "function", "function": {"name": "get_weather", "parameter": {"type": "object"}}}]},
     "tools[0].function.parameter"),
    ({"tools": [WEATHER, {"type": "function", "function": WEATHER["function"], "strict": True}]}, "tools[1].strict"),
])
def test_unknown_keys_in_messages_and_tools_are_400_naming_their_path(server, fields, param):
    r = ask(server, True, **fields)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["code"], err["param"]) == ("unsupported_parameter", param) and f"'{param}'" in err["message"]


def test_ignore_unknown_fields_ignores_unknown_message_keys_with_one_warning(start_server, tiny_model):
    srv = start_server(["--model", str(tiny_model), "--ignore-unknown-fields"])
    base = text(ok(srv, True, ignore_eos=True), True)
    messages = [{"role": "user", "content": SEA, "x_trace": 1}]
    assert text(ok(srv, True, ignore_eos=True, messages=messages), True) == base
    assert text(ok(srv, True, ignore_eos=True, messages=[{"role": "user", "content": "hi", "x_trace": 2},
                                                         *messages]), True)
    assert srv.log.count("ignoring unknown request field 'messages[].x_trace'") == 1  # one per row, not per index
    # the refused keys are still refused: the setting is about keys the server does not know
    assert ask(srv, True, messages=[{"role": "user", "content": SEA, "audio": {"id": "a"}}]).status_code == 400


@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings")  # the SDK's own model_dump of `parsed`
def test_a_message_echoed_from_the_sdks_parse_is_served(server):
    # chat.completions.parse() returns a message with the SDK's own `parsed` key; echoing it back (the SDK's
    # documented loop) was a 400 naming messages[1].parsed
    from typing import Literal

    import openai
    from pydantic import BaseModel

    class City(BaseModel):
        city: Literal["Oslo"]

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    model = client.models.list().data[0].id
    msgs = [{"role": "user", "content": "where?"}]
    first = client.chat.completions.parse(model=model, messages=msgs, response_format=City, max_tokens=30)
    message = first.choices[0].message
    assert message.parsed == City(city="Oslo")
    for echoed in (message, message.model_dump(), message.model_dump(exclude_none=True)):
        again = client.chat.completions.create(model=model, max_tokens=2,
                                               messages=[*msgs, echoed, {"role": "user", "content": SEA}])
        assert again.choices[0].finish_reason in ("length", "stop")


@pytest.mark.parametrize("message,param,words", [
    ({"role": "assistant", "content": None, "tool_calls": "garbage"}, "messages[1].tool_calls", "valid array"),
    ({"role": "assistant", "content": None, "tool_calls": [{"function": None}]}, "messages[1].tool_calls[0].function",
     ""),
    ({"role": "user", "content": SEA, "name": 5}, "messages[1].name", "valid string"),
    ({"role": "tool", "content": "4", "tool_call_id": {"id": 1}}, "messages[1].tool_call_id", "valid string"),
    ({"role": "user", "content": [{"type": "text", "text": SEA}, {"type": "image_url", "image_url": {"url": "x"}}]},
     "messages[1].content", "part 1 is type 'image_url': this server takes text parts only"),
    ({"role": "user", "content": [{"type": "text", "text": None}]}, "messages[1].content",
     "part 0 is a text part without a string 'text'"),
    ({"role": "user"}, "messages[1]", "a user message needs 'content'"),  # it was an empty prompt
    ({"role": "tool", "tool_call_id": "c1", "content": None}, "messages[1]", "a tool message needs 'content'"),
])
def test_a_malformed_key_for_the_template_is_400_naming_it_not_the_templates_500(server, message, param, words):
    # tool_calls "garbage" reached the template, which failed: a 500 chat_template_error blaming the model
    r = ask(server, True, messages=[{"role": "user", "content": "hi"}, message])
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and words in err["message"], err


@pytest.mark.parametrize("key,value", [("messages[0].name", "bob"), ("stream_options.include_obfuscation", False),
                                       ("structured_outputs.disable_fallback", True), ("messages[].annotations", [])])
def test_a_body_key_spelt_like_a_nested_path_is_unknown(server, key, value):
    # it matched the nested row: accepted (or refused naming a key no message had) and dropped
    err = ask(server, True, **{key: value}).json()["error"]
    assert (err["code"], err["param"]) == ("unsupported_parameter", key) and "unknown field" in err["message"]


def test_tokenize_counts_what_the_chat_request_renders_and_checks_message_keys(server):
    def count(body):
        r = httpx.post(server.url + "/tokenize", json=body, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()["count"]

    msgs = [{"role": "user", "content": SEA, "name": "bob"}]
    for extra in ({}, {"tools": [WEATHER]}, {"chat_template_kwargs": {"enable_thinking": False}}):
        # tools and chat_template_kwargs were dropped here: 12 tokens counted for a chat prompt of 79
        chat = ok(server, True, messages=msgs, max_tokens=1, **extra)["usage"]["prompt_tokens"]
        assert count({"messages": msgs, **extra}) == chat, extra
    assert count({"messages": msgs, "tools": [WEATHER]}) > count({"messages": msgs})
    assert count({"messages": msgs, "chat_template_kwargs": {"enable_thinking": False}}) > count({"messages": msgs})
    for body, param in (({"messages": [{"role": "user", "contnet": SEA}]}, "messages[0].contnet"),
                        ({"messages": [{"role": "assistant", "content": "x", "refusal": "no"}]}, "messages[0].refusal"),
                        ({"messages": msgs, "temperature": 0.5}, "temperature"),
                        ({"prompt": SEA, "tools": [{"type": "function", "function": {"name": "f", "parameter": {}}}]},
                         "tools[0].function.parameter")):
        r = httpx.post(server.url + "/tokenize", json=body, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
        assert "/tokenize" in r.json()["error"]["message"] or "refusal" in param


def test_ignore_unknown_fields_warns_about_so_many_names_and_then_stops(monkeypatch, caplog):
    # every distinct unknown name added to a process-wide set and wrote a warning: random names grew both forever
    from deployctl_runtime.server import fields

    monkeypatch.setattr(fields, "_warned", set())
    with caplog.at_level("WARNING", logger="deployctl_runtime.server"):
        for i in range(fields._WARN_AT_MOST + 50):
            fields.check_fields({f"x{i}": 1, f"messages[{i}].y{i}": 2}, True, True)
    assert len(fields._warned) == fields._WARN_AT_MOST and len(caplog.records) == fields._WARN_AT_MOST
    assert "further unknown names are ignored without a word" in caplog.records[-1].getMessage()
