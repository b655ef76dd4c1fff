"""C25 (top logprobs) and the routes and fields the field's clients use, through a real server and the openai client:
logprobs/top_logprobs, OpenAI's strictness, logit_bias, suffix, GET /health, GET /v1/models/{id}, /tokenize and
/detokenize (vLLM's shapes), usage.prompt_tokens_details.cached_tokens, stream_options.continuous_usage_stats and
request_queue_time_seconds measured to the first scheduling (not to the first token)."""
from __future__ import annotations

import json
import math

import httpx
import openai
import pytest


def post(srv, path, body):
    return httpx.post(srv.url + path, json=body, timeout=60)


def _readable(token: str) -> bool:
    return "Ġ" not in token and "Ċ" not in token


# ---- C25 -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True])
def test_c25_completions_logprobs_3_gives_three_finite_alternatives(api_client, stream):
    kw = dict(model="tiny", prompt="The quick brown fox", max_tokens=6, temperature=0.7, seed=3, logprobs=3)
    if stream:
        chunks = [c.choices[0].logprobs for c in api_client.completions.create(stream=True, **kw) if c.choices]
        tokens = [t for lp in chunks if lp for t in lp.tokens]
        chosen = [v for lp in chunks if lp for v in lp.token_logprobs]
        tops = [t for lp in chunks if lp for t in lp.top_logprobs]
    else:
        lp = api_client.completions.create(**kw).choices[0].logprobs
        tokens, chosen, tops = lp.tokens, lp.token_logprobs, lp.top_logprobs
    assert len(tokens) == len(chosen) == len(tops) == 6
    for tok, value, top in zip(tokens, chosen, tops):
        assert len(top) == 3 and all(math.isfinite(v) and v <= 0 for v in top.values())
        assert list(top.values()) == sorted(top.values(), reverse=True)
        if tok in top:
            assert abs(top[tok] - value) < 1e-6
        assert _readable(tok) and all(_readable(t) for t in top)
    full = api_client.completions.create(**{**kw, "logprobs": None, "max_tokens": 6})
    assert "".join(tokens) == full.choices[0].text or "\\x" in "".join(tokens)  # same tokens either way


@pytest.mark.parametrize("stream", [False, True])
def test_c25_chat_top_logprobs_3_with_text_and_bytes(api_client, stream):
    kw = dict(model="tiny", messages=[{"role": "user", "content": "Say hi 😊"}], max_tokens=6, temperature=0,
              logprobs=True, top_logprobs=3)
    if stream:
        content = [e for c in api_client.chat.completions.create(stream=True, **kw)
                   if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    else:
        content = api_client.chat.completions.create(**kw).choices[0].logprobs.content
    assert len(content) == 6
    for entry in content:
        assert len(entry.top_logprobs) == 3 and all(math.isfinite(a.logprob) for a in entry.top_logprobs)
        assert entry.top_logprobs[0].token == entry.token  # greedy: the chosen token is the most likely
        assert abs(entry.top_logprobs[0].logprob - entry.logprob) < 1e-6
        assert bytes(entry.bytes).decode("utf-8", "backslashreplace") == entry.token and _readable(entry.token)
        assert all(bytes(a.bytes) for a in entry.top_logprobs)


@pytest.mark.parametrize("path,body,param", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 21},
     "top_logprobs"),
    ("/v1/completions", {"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
    ("/v1/completions", {"prompt": "x", "suffix": "end"}, "suffix"),
    ("/v1/completions", {"prompt": "x", "logit_bias": {"5": 101}}, "logit_bias"),
    ("/v1/completions", {"prompt": "x", "logit_bias": {"99999": 1}}, "logit_bias"),
    ("/v1/completions", {"prompt": "x", "logit_bias": {"abc": 1}}, "logit_bias"),
    # int() would read these as 10, 1, 1 and 1: a key that is not plain decimal digits is not a token id
    ("/v1/completions", {"prompt": "x", "logit_bias": {"1_0": 1}}, "logit_bias"),
    ("/v1/completions", {"prompt": "x", "logit_bias": {" 1": 1}}, "logit_bias"),
    ("/v1/completions", {"prompt": "x", "logit_bias": {"+1": 1}}, "logit_bias"),
    ("/v1/completions", {"prompt": "x", "logit_bias": {"\u0661": 1}}, "logit_bias"),
    # best_of changes what a chat answer means too: checked (and honoured), never dropped as an unknown field
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "best_of": 2, "n": 3}, "best_of"),
])
def test_openai_strictness_and_refused_fields_are_400_naming_the_field(api_server, path, body, param):
    r = post(api_server, path, {"max_tokens": 2, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


@pytest.mark.parametrize("field", ["suffix", "echo"])
def test_suffix_and_echo_are_unsupported_parameters(api_client, field):
    with pytest.raises(openai.BadRequestError) as exc:
        value = "y" if field == "suffix" else True
        api_client.completions.create(model="tiny", prompt="x", max_tokens=2, **{field: value})
    assert (exc.value.body["code"], exc.value.body["param"]) == ("unsupported_parameter", field)


def test_logit_bias_is_honoured(api_server):
    target = 300
    r = post(api_server, "/v1/completions", {"prompt": "Hello", "max_tokens": 5, "temperature": 1.0, "seed": 1,
                                         "logit_bias": {str(target): 100}, "ignore_eos": True,
                                         "return_token_ids": True}).json()
    assert r["choices"][0]["token_ids"] == [target] * 5


def test_chat_best_of_returns_the_seeded_choice_with_the_highest_cumulative_logprob(api_client):
    msgs = [{"role": "user", "content": "Hi"}]
    every = api_client.chat.completions.create(model="tiny", messages=msgs, max_tokens=6, temperature=1.0, seed=7,
                                               n=4, logprobs=True)
    totals = {c.message.content: sum(t.logprob for t in c.logprobs.content) for c in every.choices}
    best = api_client.chat.completions.create(model="tiny", messages=msgs, max_tokens=6, temperature=1.0, seed=7,
                                              n=1, extra_body={"best_of": 4})
    assert len(totals) > 1 and len(best.choices) == 1
    assert best.choices[0].message.content == max(totals, key=totals.get)


# ---- routes ----------------------------------------------------------------------------------------------------
def test_health_and_models_retrieve(api_server, api_client):
    r = httpx.get(api_server.url + "/health", timeout=10)
    assert r.status_code == 200
    assert api_client.models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError):
        api_client.models.retrieve("other")


def test_tokenize_and_detokenize_in_vllms_shapes(api_server, tiny_model):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tiny_model / "tokenizer.json"))
    r = post(api_server, "/tokenize", {"prompt": "Hello world", "return_token_strs": True}).json()
    assert r["tokens"] == tok.encode("Hello world").ids and r["count"] == len(r["tokens"])
    assert r["max_model_len"] == 1024 and len(r["token_strs"]) == r["count"]
    chat = post(api_server, "/tokenize", {"messages": [{"role": "user", "content": "hi"}]}).json()
    usage = post(api_server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                  "max_tokens": 1}).json()["usage"]
    assert chat["count"] == usage["prompt_tokens"]
    assert post(api_server, "/detokenize", {"tokens": r["tokens"]}).json() == {"prompt": "Hello world"}
    assert post(api_server, "/detokenize", {"tokens": [10**6]}).status_code == 400


def test_cached_tokens_come_from_the_prefix_cache(api_client):
    prompt = "The quick brown fox jumps over the lazy dog. " * 6  # several full 16-token blocks
    first = api_client.completions.create(model="tiny", prompt=prompt, max_tokens=1)
    again = api_client.completions.create(model="tiny", prompt=prompt, max_tokens=1)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert cached > 0 and cached % 16 == 0 and cached < again.usage.prompt_tokens


def test_continuous_usage_stats_in_every_chunk(api_server):
    with httpx.stream("POST", api_server.url + "/v1/completions", timeout=60, json={
            "prompt": "Hi", "max_tokens": 4, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}) as s:
        chunks = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: {")]
    counts = [c["usage"]["completion_tokens"] for c in chunks]
    assert all("usage" in c for c in chunks) and counts == sorted(counts) and counts[-1] == 4
    assert chunks[-1]["choices"] == []  # the include_usage chunk still ends the stream


def test_queue_time_is_arrival_to_scheduling_not_ttft(api_server):
    before = api_server.metrics()
    post(api_server, "/v1/completions", {"prompt": "Hello " * 100, "max_tokens": 1})
    m = api_server.metrics()
    q = m["deployctl_runtime_request_queue_time_seconds_sum"] - before.get(
        "deployctl_runtime_request_queue_time_seconds_sum", 0)
    ttft = m["deployctl_runtime_time_to_first_token_seconds_sum"] - before.get(
        "deployctl_runtime_time_to_first_token_seconds_sum", 0)
    assert 0 <= q < ttft  # an idle api_server schedules at once; the first token also needs the prefill


def test_chat_stream_with_return_token_ids_carries_every_token_id(api_server):
    """A chunk whose text is held back (a partial UTF-8 character: the tiny model emits raw bytes) still carries its
    token ids: the streamed ids add up to usage.completion_tokens, and to the non-streamed answer's ids."""
    body = {"messages": [{"role": "user", "content": "Emoji: 😊 🚀 — describe them."}], "max_tokens": 48,
            "seed": 3, "temperature": 0.7, "return_token_ids": True}
    whole = post(api_server, "/v1/chat/completions", body).json()
    ids, usage = [], None
    with httpx.stream("POST", api_server.url + "/v1/chat/completions", timeout=60,
                      json={**body, "stream": True, "stream_options": {"include_usage": True}}) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                obj = json.loads(line[6:])
                for ch in obj.get("choices") or []:
                    ids += ch.get("token_ids") or []
                usage = obj.get("usage") or usage
    assert len(ids) == usage["completion_tokens"] == 48
    assert ids == whole["choices"][0]["token_ids"]
