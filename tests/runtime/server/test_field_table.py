"""The request-field table (deployctl_runtime/server/fields.py) walked field by field against one real server:
an honoured field shows its effect, an ignored one changes nothing, a refused one is 400 `unsupported_parameter`
naming it (its "off" value passes), a null one is answered as if absent. Unknown fields and the other requests at
the table's edges: test_field_edges.py."""
from __future__ import annotations

import json
import re

import httpx
import pytest

from deployctl_runtime.server.fields import _NO_OFF, CHAT, COMPLETIONS, FIELDS, HONOURED, IGNORED, REFUSED

from .conftest import running
from .fieldask import WEATHER, ask, ok, text

EOS = 1  # replaced by the fixture: the tiny model's <|im_end|>
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}


@pytest.fixture(scope="module")
def server(tiny_model):
    global EOS
    EOS = json.loads((tiny_model / "config.json").read_text())["eos_token_id"]
    yield from running(["--model", str(tiny_model), "--max-model-len", "512", "--num-gpu-blocks-override", "128"])


def lps(resp, chat, i=0) -> list[float]:
    lp = resp["choices"][i]["logprobs"]
    return [t["logprob"] for t in lp["content"]] if chat else lp["token_logprobs"]


def lp_fields(chat):
    return {"logprobs": True} if chat else {"logprobs": 0}


def _differs_in_logprobs(field, value):
    def probe(srv, chat):
        base = lps(ok(srv, chat, ignore_eos=True, **lp_fields(chat)), chat)
        assert lps(ok(srv, chat, ignore_eos=True, **lp_fields(chat), **{field: value}), chat) != base
    return probe


def _sampled_equals_greedy(**fields):
    def probe(srv, chat):
        greedy = text(ok(srv, chat, ignore_eos=True), chat)
        hot = text(ok(srv, chat, ignore_eos=True, temperature=2.0, seed=1), chat)
        assert hot != greedy  # the probe can tell
        assert text(ok(srv, chat, ignore_eos=True, temperature=2.0, seed=1, **fields), chat) == greedy
    return probe


def _grammar(field, value, check):
    def probe(srv, chat):
        out = text(ok(srv, chat, max_tokens=40, **{field: value}), chat)
        assert check(out), (field, out)
    return probe


def _model(srv, chat):
    assert ask(srv, chat, model="nope").status_code == 404


def _input(srv, chat):
    field = "messages" if chat else "prompt"
    other = [{"role": "user", "content": "zq zq zq"}] if chat else "zq zq zq"
    a, b = ok(srv, chat, ignore_eos=True), ok(srv, chat, ignore_eos=True, **{field: other})
    assert a["usage"]["prompt_tokens"] != b["usage"]["prompt_tokens"]


def _max(field):
    def probe(srv, chat):
        assert ok(srv, chat, ignore_eos=True, **{"max_tokens": None, field: 3})["usage"]["completion_tokens"] == 3
    return probe


def _n(srv, chat):
    assert len(ok(srv, chat, n=3, temperature=1.0, seed=2)["choices"]) == 3


def _stop(srv, chat):
    base = text(ok(srv, chat, ignore_eos=True, max_tokens=16), chat)
    stop = base[len(base) // 2:len(base) // 2 + 2]
    r = ok(srv, chat, ignore_eos=True, max_tokens=16, stop=[stop])
    assert text(r, chat) == base[:base.index(stop)] and r["choices"][0]["finish_reason"] == "stop"
    assert ask(srv, chat, stop=["a", "b", "c", "d", "e"]).json()["error"]["param"] == "stop"  # OpenAI: at most 4


def _seed(srv, chat):
    a, b = (text(ok(srv, chat, ignore_eos=True, temperature=1.0, seed=s), chat) for s in (5, 5))
    assert a == b != text(ok(srv, chat, ignore_eos=True, temperature=1.0, seed=6), chat)
    assert a != text(ok(srv, chat, ignore_eos=True), chat)  # temperature 0 (greedy) is another answer


def _logit_bias(srv, chat):
    r = ok(srv, chat, ignore_eos=True, logit_bias={"42": 100}, return_token_ids=True)
    assert r["choices"][0]["token_ids"] == [42] * 8


def _logprobs(srv, chat):
    r = ok(srv, chat, **({"logprobs": True} if chat else {"logprobs": 2}))
    lp = r["choices"][0]["logprobs"]
    assert (lp["content"] if chat else len(lp["top_logprobs"][0]) == 2)


def _top_logprobs(srv, chat):
    content = ok(srv, chat, logprobs=True, top_logprobs=3)["choices"][0]["logprobs"]["content"]
    assert content and all(len(t["top_logprobs"]) == 3 for t in content)


def _stream(srv, chat, options=None):
    body = {"max_tokens": 8, "temperature": 0, "stream": True, "ignore_eos": True, **(options or {})}
    body.update({"messages": [{"role": "user", "content": "Tell me about the sea"}]} if chat
                else {"prompt": "Tell me about the sea"})
    with httpx.stream("POST", srv.url + ("/v1/chat/completions" if chat else "/v1/completions"), json=body,
                      timeout=120) as r:
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    joined = "".join((c["choices"][0]["delta"].get("content") or "") if chat else c["choices"][0]["text"]
                     for c in chunks if c["choices"])
    assert joined == text(ok(srv, chat, ignore_eos=True), chat)
    return chunks


def _stream_options(srv, chat):
    chunks = _stream(srv, chat, {"stream_options": {"include_usage": True}})
    assert chunks[-1]["usage"]["completion_tokens"] == 8


def _best_of(srv, chat):
    def total(**f):
        return sum(lps(ok(srv, chat, ignore_eos=True, temperature=1.0, **lp_fields(chat), **f), chat))
    best = total(seed=3, best_of=2)
    assert best == pytest.approx(max(total(seed=3), total(seed=4)))


def _tools(srv, chat):
    r = ok(srv, chat, max_tokens=60, tools=[WEATHER], tool_choice="required")
    assert r["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"


def _tool_choice(srv, chat):
    r = ok(srv, chat, max_tokens=60, tools=[WEATHER, TIME], tool_choice={"type": "function",
                                                                        "function": {"name": "get_time"}})
    assert [c["function"]["name"] for c in r["choices"][0]["message"]["tool_calls"]] == ["get_time"]


def _parallel(srv, chat):
    for seed in range(3):
        r = ok(srv, chat, max_tokens=120, temperature=1.0, seed=seed, tools=[WEATHER, TIME], tool_choice="required",
               parallel_tool_calls=False)
        assert len(r["choices"][0]["message"]["tool_calls"]) == 1


def _modalities(srv, chat):
    ok(srv, chat, modalities=["text"])
    assert ask(srv, chat, modalities=["audio"]).json()["error"]["param"] == "modalities"


def _min_tokens(srv, chat):
    forced = {"logit_bias": {str(EOS): 100}}
    assert ok(srv, chat, **forced)["usage"]["completion_tokens"] == 1
    assert ok(srv, chat, **forced, min_tokens=4)["usage"]["completion_tokens"] == 5  # 4 tokens, then the stop


def _ignore_eos(srv, chat):
    r = ok(srv, chat, logit_bias={str(EOS): 100}, ignore_eos=True)
    assert r["usage"]["completion_tokens"] == 8 and r["choices"][0]["finish_reason"] == "length"


def _return_token_ids(srv, chat):
    r = ok(srv, chat, ignore_eos=True, return_token_ids=True)
    assert len(r["choices"][0]["token_ids"]) == 8


def _stop_token_ids(srv, chat):
    ids = ok(srv, chat, ignore_eos=True, return_token_ids=True)["choices"][0]["token_ids"]
    stop = ids[3]
    r = ok(srv, chat, ignore_eos=True, return_token_ids=True, stop_token_ids=[stop])
    got = r["choices"][0]["token_ids"]
    assert r["choices"][0]["finish_reason"] == "stop" and got[-1] == stop and got == ids[:ids.index(stop) + 1]
    bad = ask(srv, chat, stop_token_ids=[10**6]).json()["error"]
    assert (bad["param"], bad["code"]) == ("stop_token_ids", "invalid_token_id")


def _add_generation_prompt(srv, chat):
    assert (ok(srv, chat, add_generation_prompt=False)["usage"]["prompt_tokens"]
            < ok(srv, chat, add_generation_prompt=True)["usage"]["prompt_tokens"])


def _chat_template_kwargs(srv, chat):
    assert (ok(srv, chat, chat_template_kwargs={"enable_thinking": False})["usage"]["prompt_tokens"]
            > ok(srv, chat)["usage"]["prompt_tokens"])


def _request_id(srv, chat):
    # vLLM's: the response's id; an X-Request-Id header wins, as in vLLM
    prefix = "chatcmpl-" if chat else "cmpl-"
    r = ask(srv, chat, request_id="my-req.1")
    assert r.json()["id"] == prefix + "my-req.1" and r.headers["x-request-id"] == prefix + "my-req.1"
    body = {"max_tokens": 4, "request_id": "my-req.2", "stream": True,
            **({"messages": [{"role": "user", "content": "hi"}]} if chat else {"prompt": "hi"})}
    s = httpx.post(srv.url + ("/v1/chat/completions" if chat else "/v1/completions"), json=body, timeout=60)
    ids = {json.loads(line[6:])["id"] for line in s.text.splitlines() if line.startswith("data: {")}
    assert ids == {prefix + "my-req.2"}
    r = httpx.post(srv.url + ("/v1/chat/completions" if chat else "/v1/completions"), timeout=60,
                   headers={"X-Request-Id": "from-header"}, json={**body, "stream": False})
    assert r.json()["id"] == "from-header" == r.headers["x-request-id"]
    err = ask(srv, chat, request_id="two words\n").json()["error"]
    assert err["param"] == "request_id"


def _eos_text(srv) -> str:
    return httpx.post(srv.url + "/detokenize", json={"tokens": [EOS]}, timeout=30).json()["prompt"]


def _skip_special_tokens(srv, chat):
    forced = {"logit_bias": {str(EOS): 100}, "ignore_eos": True, "max_tokens": 3}  # EOS three times, not a stop
    assert text(ok(srv, chat, **forced), chat) == ""
    assert text(ok(srv, chat, **forced, skip_special_tokens=True), chat) == ""
    assert text(ok(srv, chat, **forced, skip_special_tokens=False), chat) == _eos_text(srv) * 3


def _include_stop_str_in_output(srv, chat):
    base = text(ok(srv, chat, ignore_eos=True, max_tokens=16), chat)
    stop = base[len(base) // 2:len(base) // 2 + 2]
    cut = base[:base.index(stop)]
    assert text(ok(srv, chat, ignore_eos=True, max_tokens=16, stop=[stop]), chat) == cut
    r = ok(srv, chat, ignore_eos=True, max_tokens=16, stop=[stop], include_stop_str_in_output=True)
    assert text(r, chat) == cut + stop and r["choices"][0]["finish_reason"] == "stop"
    # the stop token (EOS here) is not text unless asked for, as in vLLM
    shown = {"logit_bias": {str(EOS): 100}, "skip_special_tokens": False}
    assert text(ok(srv, chat, **shown), chat) == ""
    assert text(ok(srv, chat, **shown, include_stop_str_in_output=True), chat) == _eos_text(srv)


def _truncate_prompt_tokens(srv, chat):
    assert ok(srv, chat)["usage"]["prompt_tokens"] > 3
    r = ok(srv, chat, truncate_prompt_tokens=3, return_token_ids=True)
    assert r["usage"]["prompt_tokens"] == 3
    if not chat:  # the last 3 tokens of the prompt: the same answer as those 3 ids sent as the prompt
        ids = httpx.post(srv.url + "/tokenize", json={"prompt": "Tell me about the sea"}, timeout=30).json()["tokens"]
        assert ok(srv, chat, prompt=ids[-3:], return_token_ids=True)["choices"][0]["token_ids"] == \
            r["choices"][0]["token_ids"]
    for bad in (0, -2, 10**6):
        err = ask(srv, chat, truncate_prompt_tokens=bad).json()["error"]
        assert err["param"] == "truncate_prompt_tokens", err


def _return_tokens_as_token_ids(srv, chat):
    r = ok(srv, chat, ignore_eos=True, return_token_ids=True, return_tokens_as_token_ids=True,
           **({"logprobs": True, "top_logprobs": 2} if chat else {"logprobs": 2}))
    ids, lp = r["choices"][0]["token_ids"], r["choices"][0]["logprobs"]
    want = [f"token_id:{t}" for t in ids]
    if chat:
        assert [t["token"] for t in lp["content"]] == want
        assert all(a["token"].startswith("token_id:") for t in lp["content"] for a in t["top_logprobs"])
    else:
        assert lp["tokens"] == want and all(k.startswith("token_id:") for top in lp["top_logprobs"] for k in top)
    plain = ok(srv, chat, ignore_eos=True, **({"logprobs": True} if chat else {"logprobs": 0}))["choices"][0]
    assert not any(t.startswith("token_id:") for t in (
        [c["token"] for c in plain["logprobs"]["content"]] if chat else plain["logprobs"]["tokens"]))


def _is_json_object(s):
    return s.startswith("{")


HONOURED_PROBES = {
    "model": _model, "prompt": _input, "messages": _input, "max_tokens": _max("max_tokens"),
    "max_completion_tokens": _max("max_completion_tokens"),
    "temperature": lambda srv, chat: _seed(srv, chat),  # temperature 1 samples: seeds 5 and 6 differ
    "top_p": _sampled_equals_greedy(top_p=1e-9), "top_k": _sampled_equals_greedy(top_k=1), "n": _n, "stop": _stop,
    "seed": _seed, "presence_penalty": _differs_in_logprobs("presence_penalty", 2.0),
    "frequency_penalty": _differs_in_logprobs("frequency_penalty", 2.0),
    "repetition_penalty": _differs_in_logprobs("repetition_penalty", 1.5), "logit_bias": _logit_bias,
    "logprobs": _logprobs, "top_logprobs": _top_logprobs, "stream": _stream, "stream_options": _stream_options,
    "best_of": _best_of,
    "response_format": _grammar("response_format", {"type": "json_object"}, _is_json_object),
    "tools": _tools, "tool_choice": _tool_choice, "parallel_tool_calls": _parallel, "modalities": _modalities,
    "min_tokens": _min_tokens, "ignore_eos": _ignore_eos, "return_token_ids": _return_token_ids,
    "stop_token_ids": _stop_token_ids,
    "guided_json": _grammar("guided_json", {"type": "object", "properties": {"a": {"type": "integer"}},
                                            "required": ["a"]}, lambda s: s.startswith('{"a":')),
    "guided_regex": _grammar("guided_regex", "[0-9]{3}", lambda s: re.fullmatch(r"[0-9]{3}", s)),
    "guided_choice": _grammar("guided_choice", ["yes", "no"], lambda s: s in ("yes", "no")),
    "guided_grammar": _grammar("guided_grammar", 'start: "ab" | "cd"', lambda s: s in ("ab", "cd")),
    "structured_outputs": _grammar("structured_outputs", {"choice": ["red", "green"]},
                                   lambda s: s in ("red", "green")),
    "add_generation_prompt": _add_generation_prompt, "chat_template_kwargs": _chat_template_kwargs,
    "request_id": _request_id, "min_p": _sampled_equals_greedy(min_p=1.0),
    "skip_special_tokens": _skip_special_tokens, "include_stop_str_in_output": _include_stop_str_in_output,
    "truncate_prompt_tokens": _truncate_prompt_tokens, "return_tokens_as_token_ids": _return_tokens_as_token_ids,
}
IGNORED_VALUES = {"user": "u-1", "metadata": {"team": "a"}, "store": True, "service_tier": "auto",
                  "prompt_cache_key": "k", "safety_identifier": "s", "guided_decoding_backend": "xgrammar",
                  "include_reasoning": True, "structured_outputs.disable_fallback": True}
TOP = {name: rule for name, rule in FIELDS.items() if "[]" not in name}  # keys in messages/tools: test_field_inner.py
CASES = [(name, chat) for name, rule in TOP.items() for chat in (False, True)
         if rule.applies(chat)]
PARENTS = {"structured_outputs": {"choice": ["red", "green"]}, "stream_options": {}}  # a nested key's object


def nest(name: str, value) -> dict:
    """The top-level fields that send `value` under the field table's (maybe dotted) name; a key of stream_options
    comes with stream true. value None (the Python object): the parent object without the key."""
    if "." not in name:
        return {name: value}
    parent, key = name.split(".", 1)
    out = {parent: {**PARENTS[parent], **({} if value is None else {key: value})}}
    return {**out, "stream": True} if parent == "stream_options" else out


def outcome(r: httpx.Response, chat: bool) -> str:
    """The text of a 200 answer, whole or streamed."""
    assert r.status_code == 200, r.text
    if not r.headers["content-type"].startswith("text/event-stream"):
        return text(r.json(), chat)
    chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    return "".join((c["choices"][0]["delta"].get("content") or "") if chat else c["choices"][0]["text"]
                   for c in chunks if c["choices"])


@pytest.mark.parametrize("name,chat", CASES, ids=[f"{n}-{'chat' if c else 'completions'}" for n, c in CASES])
def test_every_field_is_honoured_ignored_or_refused(server, name, chat):
    rule = FIELDS[name]
    if rule.status == HONOURED:
        HONOURED_PROBES[name](server, chat)
    elif rule.status == IGNORED:
        base = outcome(ask(server, chat, ignore_eos=True, **nest(name, None)), chat)
        assert outcome(ask(server, chat, ignore_eos=True, **nest(name, IGNORED_VALUES[name])), chat) == base
    else:
        assert rule.status == REFUSED
        r = ask(server, chat, **nest(name, {"some": "value"}))
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert (err["code"], err["param"]) == ("unsupported_parameter", name) and rule.why in err["message"]
        if rule.off_value(chat) is not _NO_OFF:
            outcome(ask(server, chat, **nest(name, rule.off_value(chat))), chat)


def post(srv, chat: bool, body: dict) -> httpx.Response:
    """The body as is: a None value goes out as JSON null."""
    return httpx.post(srv.url + ("/v1/chat/completions" if chat else "/v1/completions"), json=body, timeout=120)


def answer(r: httpx.Response) -> tuple:
    assert r.status_code == 200, r.text
    body = r.json()
    return body["choices"], body["usage"]


@pytest.mark.parametrize("name,chat", CASES, ids=[f"{n}-{'chat' if c else 'completions'}" for n, c in CASES])
def test_null_is_answered_as_if_the_field_were_absent(server, name, chat):
    # OpenAI's and vLLM's optional fields are nullable: null asks for nothing (it used to be a 400 for n,
    # presence_penalty, logprobs, stream, echo, suffix, min_p, ignore_eos, the refused fields, ...)
    base = {"max_tokens": 8, "temperature": 0, "seed": 1,
            "messages" if chat else "prompt": [{"role": "user", "content": "Tell me about the sea"}] if chat
            else "Tell me about the sea"}
    base.pop(name, None)
    if name == "max_tokens":
        base["max_completion_tokens"] = 8
    if name in ("messages", "prompt"):  # required: null is a missing field, not an empty one
        err = post(server, chat, {**base, name: None}).json()["error"]
        assert (err["param"], err["code"]) == (name, "missing_required_parameter")
        return
    if "." in name:  # a key of an option object sent as null: as if the object did not have it
        parent, key = name.split(".", 1)
        absent = {**base, **nest(name, None)}
        nulled = {**absent, parent: {**absent[parent], key: None}}
        assert outcome(post(server, chat, nulled), chat) == outcome(post(server, chat, absent), chat)
        return
    assert answer(post(server, chat, {**base, name: None})) == answer(post(server, chat, base))


def test_the_openai_sdk_passing_none_through_is_served(server):
    import openai

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    messages = [{"role": "user", "content": "Tell me about the sea"}]
    model = client.models.list().data[0].id
    plain = client.chat.completions.create(model=model, messages=messages, max_tokens=8, temperature=0)
    nones = client.chat.completions.create(model=model, messages=messages, max_tokens=8, temperature=0, n=None,
                                           presence_penalty=None, frequency_penalty=None, logprobs=None,
                                           stream=None, parallel_tool_calls=None, reasoning_effort=None)
    assert nones.choices[0].message.content == plain.choices[0].message.content
    done = client.completions.create(model=model, prompt="Tell me about the sea", max_tokens=8, temperature=0,
                                     echo=None, suffix=None, n=None, stream=None)
    assert done.choices[0].finish_reason == "length"


def test_the_table_covers_both_endpoints_and_every_probe_is_used():
    assert set(HONOURED_PROBES) == {n for n, r in TOP.items() if r.status == HONOURED}
    assert set(IGNORED_VALUES) == {n for n, r in TOP.items() if r.status == IGNORED}
    assert {r.endpoints for r in TOP.values()} == {"both", CHAT, COMPLETIONS}
    assert {r.status for r in TOP.values()} == {HONOURED, IGNORED, REFUSED}  # TEMPLATE: message keys only
