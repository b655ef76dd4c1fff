"""Requests at the edges of the field table (deployctl_runtime/server/fields.py), against a real server: unknown
fields and unknown keys of option objects are 400 naming their path (ignored with a warning under
--ignore-unknown-fields), chat_template_kwargs cannot set what the server sets, tools need a template that shows
them, and the values of a refused field that ask for nothing (add_special_tokens as the server does it, empty lists)
pass."""
from __future__ import annotations

import json
import shutil

import pytest

from .conftest import running
from .fieldask import WEATHER, ask, ok, text


@pytest.fixture(scope="module")
def server(tiny_model):
    yield from running(["--model", str(tiny_model), "--max-model-len", "512", "--num-gpu-blocks-override", "128"])


@pytest.mark.parametrize("chat,name", [(False, "foo"), (True, "reasoning_effort_x"), (False, "messages"),
                                       (True, "suffix_")])
def test_unknown_fields_are_400_naming_them(server, chat, name):
    err = ask(server, chat, **{name: 1}).json()["error"]
    assert (err["code"], err["param"]) == ("unsupported_parameter", name)


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("name", ["max_tokens", "max_completion_tokens"])
def test_a_length_past_the_context_names_the_field_the_client_sent(server, chat, name):
    # max_completion_tokens was copied into max_tokens, and the 400 named max_tokens, a field the client never sent
    err = ask(server, chat, **{"max_tokens": None, name: 100000}).json()["error"]
    assert (err["code"], err["param"]) == ("context_length_exceeded", name), err
    assert f"for {name}); lower {name} to at most" in err["message"], err


@pytest.mark.parametrize("chat,fields,param", [
    (False, {"stream": True, "stream_options": {"include_usage": True, "foo": 1}}, "stream_options.foo"),
    (True, {"structured_outputs": {"choice": ["a"], "whitespace_patern": " "}}, "structured_outputs.whitespace_patern"),
    (True, {"response_format": {"type": "json_object", "foo": True}}, "response_format.foo"),
    (False, {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object"}, "foo": 1}}},
     "response_format.json_schema.foo")])
def test_unknown_keys_of_option_objects_are_400_naming_their_path(server, chat, fields, param):
    # they used to be dropped with a 200
    r = ask(server, chat, **fields)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["code"], err["param"]) == ("unsupported_parameter", param) and f"'{param}'" in err["message"]


@pytest.mark.parametrize("key", ["tools", "messages", "add_generation_prompt", "bos_token", "raise_exception"])
def test_chat_template_kwargs_cannot_set_what_the_server_sets(server, key):
    # they used to be dropped silently (tools there would have rendered tools the server never parses for)
    r = ask(server, True, chat_template_kwargs={"enable_thinking": False, key: "x"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == f"chat_template_kwargs.{key}" and "the server sets" in err["message"]


def test_ignore_unknown_fields_ignores_them_with_a_warning(start_server, tiny_model):
    srv = start_server(["--model", str(tiny_model), "--ignore-unknown-fields"])
    base = text(ok(srv, False, ignore_eos=True), False)
    assert text(ok(srv, False, ignore_eos=True, foo={"x": 1}), False) == base
    assert "ignoring unknown request field 'foo'" in srv.log
    assert text(ok(srv, False, ignore_eos=True, response_format={"type": "text", "foo": 1}), False) == base
    assert "ignoring unknown request field 'response_format.foo'" in srv.log
    # refused fields are still refused: the setting is about names the server does not know
    assert ask(srv, False, suffix="x").json()["error"]["param"] == "suffix"


def test_tools_with_a_template_that_cannot_show_them_are_400(start_server, tiny_model, tmp_path):
    model = tmp_path / "no-tools"
    shutil.copytree(tiny_model, model)
    cfg = json.loads((model / "tokenizer_config.json").read_text())
    cfg["chat_template"] = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                            "{% endfor %}<|im_start|>assistant\n")
    (model / "tokenizer_config.json").write_text(json.dumps(cfg))
    srv = start_server(["--model", str(model), "--skip-verify"])
    err = ask(srv, True, tools=[WEATHER]).json()["error"]
    assert (err["param"], err["code"]) == ("tools", "unsupported_parameter")
    assert "does not show tools" in err["message"]
    ok(srv, True)  # without tools the model serves as before


@pytest.mark.parametrize("chat,value,status", [(False, True, 200), (False, False, 400), (True, False, 200),
                                               (True, True, 400)])
def test_add_special_tokens_passes_when_it_asks_for_what_the_server_does(server, chat, value, status):
    # completions add the tokenizer's special tokens, chat leaves them to the template (vLLM's defaults): sending
    # that is no request at all; the other value would change the prompt, so it is refused
    r = ask(server, chat, add_special_tokens=value)
    assert r.status_code == status, r.text
    if status == 400:
        assert r.json()["error"]["param"] == "add_special_tokens"


@pytest.mark.parametrize("name,nothing,something", [("logits_processors", [], ["pkg.module:Processor"]),
                                                    ("bad_words", [], ["sea"])])
def test_empty_lists_ask_for_nothing(server, name, nothing, something):
    for chat in (False, True):
        assert text(ok(server, chat, ignore_eos=True, **{name: nothing}), chat) == text(ok(server, chat,
                                                                                         ignore_eos=True), chat)
        assert ask(server, chat, **{name: something}).json()["error"]["param"] == name


def test_a_template_guarded_by_tools_is_defined_serves_tools_and_a_failing_template_names_why(start_server,
                                                                                              tiny_model, tmp_path):
    # the "does the template show tools" probe rendered tools=None, which such a template iterates: a TypeError
    # escaped as a bare 500
    model = tmp_path / "tools-defined"
    shutil.copytree(tiny_model, model)
    cfg = json.loads((model / "tokenizer_config.json").read_text())
    cfg["chat_template"] = (
        "{% if tools is defined %}<|im_start|>system\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}<|im_end|>\n"
        "{% endif %}{% for m in messages %}{% if m['content'] == 'boom' %}{{ 1 + m['content'] }}{% endif %}"
        "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n")
    (model / "tokenizer_config.json").write_text(json.dumps(cfg))
    srv = start_server(["--model", str(model), "--skip-verify"])
    r = ok(srv, True, max_tokens=60, tools=[WEATHER], tool_choice="required")
    assert r["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert ok(srv, True, tools=[WEATHER])["usage"]["prompt_tokens"] > ok(srv, True)["usage"]["prompt_tokens"]
    r = ask(srv, True, messages=[{"role": "user", "content": "boom"}])
    assert r.status_code == 500, r.text
    err = r.json()["error"]
    assert err["code"] == "chat_template_error" and "TypeError" in err["message"], err
    assert "Traceback" not in srv.log
