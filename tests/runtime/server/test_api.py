"""The OpenAI-compatible API over real HTTP against a real `serve` process with the tiny model.

Covers the official `openai` client (completions and chat, streaming and not, n > 1), SSE framing, error shapes and
status codes (400 with param, 404), C03 (context length), C05 (stop strings) and C06 (multi-byte characters).
"""
from __future__ import annotations

import json
import time

import httpx
import openai
import pytest
from tokenizers import Tokenizer

from .conftest import ServerProcess

MAX_MODEL_LEN = 2048
RELEASE = "rel-test-1"


@pytest.fixture(scope="module")
def server(tiny_model):
    srv = ServerProcess(["--model", str(tiny_model), "--max-model-len", str(MAX_MODEL_LEN), "--kv-cache-memory",
                         "32MiB", "--release-id", RELEASE, "--served-model-name", "tiny-chat"])
    try:
        yield srv.wait_ready()
    finally:
        assert srv.stop() == 0, srv.log


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def tokenizer(tiny_model) -> Tokenizer:
    return Tokenizer.from_file(str(tiny_model / "tokenizer.json"))


def post(server, path, body, **kw):
    return httpx.post(server.url + path, json=body, timeout=60, **kw)


def stream_texts(chunks, chat: bool) -> tuple[dict[int, str], dict[int, str], list]:
    texts, finish, usage = {}, {}, []
    for c in chunks:
        if c.usage is not None:
            usage.append(c.usage)
        for ch in c.choices:
            piece = (ch.delta.content or "") if chat else ch.text
            texts[ch.index] = texts.get(ch.index, "") + piece
            if ch.finish_reason:
                finish[ch.index] = ch.finish_reason
    return texts, finish, usage


def test_completions_openai_client_n2_stream_equals_non_stream(client):
    kw = dict(model="tiny-chat", prompt="The quick brown fox", max_tokens=12, n=2, seed=11, temperature=0.9)
    full = client.completions.create(**kw)
    assert sorted(c.index for c in full.choices) == [0, 1]
    assert full.usage.completion_tokens == 24 and full.usage.prompt_tokens > 0
    assert all(c.finish_reason == "length" for c in full.choices)
    texts, finish, usage = stream_texts(client.completions.create(stream=True, **kw), chat=False)
    assert texts == {c.index: c.text for c in full.choices}
    assert finish == {0: "length", 1: "length"} and usage == []
    assert full.choices[0].text != full.choices[1].text  # n choices are independent samples


def test_chat_openai_client_n2_stream_with_usage(client):
    kw = dict(model="tiny-chat", messages=[{"role": "system", "content": "Be brief."},
                                           {"role": "user", "content": "Say hello 😊"}],
              max_tokens=10, n=2, seed=5, temperature=0.7)
    full = client.chat.completions.create(**kw)
    assert [c.message.role for c in full.choices] == ["assistant", "assistant"]
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    texts, finish, usage = stream_texts(chunks, chat=True)
    assert texts == {c.index: c.message.content for c in full.choices}
    assert set(finish) == {0, 1}
    assert len(usage) == 1 and chunks[-1].usage is not None and chunks[-1].choices == []
    assert usage[0].completion_tokens == full.usage.completion_tokens
    assert usage[0].prompt_tokens == full.usage.prompt_tokens


def test_sse_framing_headers_and_release(server):
    body = {"prompt": "hello", "max_tokens": 4, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["cache-control"] == "no-cache" and r.headers["x-accel-buffering"] == "no"
        assert r.headers["x-deployctl-release"] == RELEASE and r.headers["x-request-id"].startswith("cmpl-")
        raw = r.read().decode()
    events = [e for e in raw.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    last = json.loads(events[-2][6:])
    assert last["choices"][0]["finish_reason"] == "length"


def test_models_readyz_and_release_header_everywhere(server):
    r = httpx.get(server.url + "/v1/models")
    assert r.status_code == 200 and [m["id"] for m in r.json()["data"]] == ["tiny-chat"]
    assert abs(r.json()["data"][0]["created"] - time.time()) < 3600  # Unix seconds, as OpenAI's API gives
    ready = httpx.get(server.url + "/readyz")
    assert ready.json()["release"] == RELEASE and ready.json()["status"] == "ready"
    for path in ("/healthz", "/metrics", "/nope"):
        assert httpx.get(server.url + path).headers["x-deployctl-release"] == RELEASE


BAD = [
    ({"prompt": "hi", "max_tokens": "5"}, "max_tokens"),
    ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "hi", "temperature": 5}, "temperature"),
    ({"prompt": "hi", "top_p": 0}, "top_p"),
    ({"prompt": "hi", "n": 0}, "n"),
    ({"prompt": "hi", "n": True}, "n"),
    ({"prompt": "hi", "logprobs": 99}, "logprobs"),
    ({"prompt": "hi", "stop": ["x"] * 40}, "stop"),
    ({"prompt": "hi", "stream": "yes"}, "stream"),
    ({"prompt": "hi", "presence_penalty": 9}, "presence_penalty"),
    ({"prompt": "hi", "top_k": -5}, "top_k"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [10**9]}, "prompt"),
    ({"max_tokens": 3}, "prompt"),
]


@pytest.mark.parametrize("body,param", BAD, ids=[p + str(i) for i, (_, p) in enumerate(BAD)])
def test_wrong_types_and_impossible_values_are_400_with_param(server, body, param):
    r = post(server, "/v1/completions", body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param and err["message"]
    assert set(err) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("body,param", [
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": -1}, "max_completion_tokens"),
])
def test_chat_validation(server, body, param):
    r = post(server, "/v1/chat/completions", body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_not_json_is_400_not_422(server):
    r = httpx.post(server.url + "/v1/completions", content=b"{not json", timeout=10)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def test_unknown_fields_are_refused_naming_them(server):
    # an unknown field used to pass with a 200, so a misspelt or unsupported option changed nothing without a word
    r = post(server, "/v1/completions", {"prompt": "hi", "max_tokens": 2, "frobnicate": {"a": 1}, "best_of": 1})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["code"], err["param"]) == ("unsupported_parameter", "frobnicate")
    assert "--ignore-unknown-fields" in err["message"]


def test_unknown_model_is_404_and_unknown_route_keeps_the_error_shape(server, client):
    with pytest.raises(openai.NotFoundError) as exc:
        client.completions.create(model="gpt-9", prompt="hi", max_tokens=2)
    assert exc.value.body["code"] == "model_not_found" and exc.value.body["param"] == "model"
    r = httpx.get(server.url + "/v2/nothing")
    assert r.status_code == 404 and set(r.json()["error"]) == {"message", "type", "param", "code"}


# ---- C03: context length ------------------------------------------------------------------------------------
def _long_text(tokenizer, min_tokens: int) -> str:
    text = "the quick brown fox jumps over the lazy dog "
    reps = 1
    while len(tokenizer.encode(text * reps).ids) < min_tokens:
        reps *= 2
    return text * reps


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
@pytest.mark.parametrize("stream", [False, True])
def test_c03_over_long_prompt_is_400_before_any_stream_byte(server, tokenizer, path, stream):
    text = _long_text(tokenizer, 3000)
    n_tokens = len(tokenizer.encode(text).ids)
    body = {"max_tokens": 16, "stream": stream}
    body.update({"messages": [{"role": "user", "content": text}]} if "chat" in path else {"prompt": text})
    r = post(server, path, body)
    assert r.status_code == 400
    assert r.headers["content-type"].startswith("application/json")
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["code"] == "context_length_exceeded"
    assert err["param"] == ("messages" if "chat" in path else "prompt")
    assert str(MAX_MODEL_LEN) in err["message"]
    assert any(str(n) in err["message"] for n in range(n_tokens, n_tokens + 40))  # the actual count


def test_c03d_prompt_plus_max_tokens_over_the_limit(server):
    prompt = [65] * 2040  # 2,040 prompt tokens
    r = post(server, "/v1/completions", {"prompt": prompt, "max_tokens": 100})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded" and err["param"] == "max_tokens"
    assert "2140" in err["message"] and "2048" in err["message"] and "8" in err["message"]
    # rule: when max_tokens is omitted it defaults to the remaining context and ends with "length"
    r = post(server, "/v1/completions", {"prompt": prompt, "ignore_eos": True})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["usage"]["completion_tokens"] == 8 and out["choices"][0]["finish_reason"] == "length"


# ---- C05: stop strings across token boundaries ----------------------------------------------------------------
def _clean_window(client, prompt: str) -> tuple[str, str]:
    """Greedy text and a stop string spanning >= 2 tokens and ending in the middle of a token."""
    out = client.completions.create(model="tiny-chat", prompt=prompt, max_tokens=24, temperature=0, logprobs=0,
                                    extra_body={"ignore_eos": True})
    text, tokens = out.choices[0].text, out.choices[0].logprobs.tokens
    assert "".join(tokens) == text or "\\x" in "".join(tokens)  # a partial UTF-8 character shows as \xNN
    pos = 0
    for i in range(3, len(tokens) - 3):
        a, b, c = tokens[i], tokens[i + 1], tokens[i + 2]
        if all(t and "\\x" not in t for t in (a, b, c)) and len(c) >= 2:
            start = text.find(a + b + c, pos)
            if start > 0:
                return text, a + b + c[: len(c) // 2]
        pos += len(tokens[i])
    pytest.skip("the tiny model produced no clean 3-token window")


@pytest.mark.parametrize("prompt", ["The quick brown fox", "Hello world, this is"])
def test_c05_stop_string_split_across_tokens_never_leaks(client, prompt):
    text, stop = _clean_window(client, prompt)
    expected = text[: text.find(stop)]
    kw = dict(model="tiny-chat", prompt=prompt, max_tokens=24, temperature=0, stop=[stop], extra_body={"ignore_eos": True})
    full = client.completions.create(**kw)
    assert full.choices[0].text == expected and full.choices[0].finish_reason == "stop"
    deltas, finish = [], None
    for chunk in client.completions.create(stream=True, **kw):
        for ch in chunk.choices:
            deltas.append(ch.text)
            finish = ch.finish_reason or finish
    assert "".join(deltas) == expected and finish == "stop"
    assert not any(stop in "".join(deltas[: i + 1]) for i in range(len(deltas)))
    # a stop string that never matches: held-back text is flushed at the end
    kw["stop"] = [stop + "\u2603never"]
    assert client.completions.create(**kw).choices[0].text == text


# ---- C06: multi-byte characters split across byte-level tokens --------------------------------------------------
def _assembled_chars(tokenizer, ids: list[int]) -> int:
    """Non-ASCII characters of the decoded text that no single token decodes to (they span byte-level tokens)."""
    def count(s: str) -> int:
        return sum(1 for ch in s if ord(ch) > 127 and ch != "\ufffd")
    return count(tokenizer.decode(ids)) - sum(count(tokenizer.decode([i])) for i in ids)


C06_PROMPT = "聪明 😊 ďábel 中文：聪明的狐狸"


def _c06(server, max_tokens: int, seed: int, stream: bool):
    body = {"prompt": C06_PROMPT, "max_tokens": max_tokens, "temperature": 1.0, "seed": seed, "ignore_eos": True,
            "return_token_ids": True, "stream": stream}
    if not stream:
        choice = post(server, "/v1/completions", body).json()["choices"][0]
        return choice["text"], choice["token_ids"]
    chunks = []
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunks.append(json.loads(line[6:])["choices"][0])
    return [(c["text"], c["token_ids"]) for c in chunks]


def test_c06_multibyte_characters_never_streamed_as_halves(server, tokenizer):
    seed = next((s for s in range(60) if _assembled_chars(tokenizer, _c06(server, 8, s, False)[1]) > 0), None)
    assert seed is not None, "no seed made the tiny model emit a character split over tokens"
    longest_ids = _c06(server, 8, seed, False)[1]
    reference = tokenizer.decode(longest_ids)  # the tokenizer's own one-shot decode
    for max_tokens in range(1, 9):
        text, ids = _c06(server, max_tokens, seed, False)
        assert ids == longest_ids[:max_tokens] and text == tokenizer.decode(ids)
        chunks = _c06(server, max_tokens, seed, True)
        assert "".join(t for t, _ in chunks) == text  # stream == non-stream, byte for byte
        assert [i for _, c in chunks for i in c] == ids
        sent = ""
        for delta, _ in chunks[:-1]:  # before the end, only complete characters of the final text go out
            sent += delta
            assert reference.startswith(sent), (sent, reference)


# ---- metrics and access log -------------------------------------------------------------------------------------
CONTRACT_METRICS = ["num_requests_running", "num_requests_waiting", "kv_cache_usage_ratio", "num_gpu_blocks",
                    "num_free_blocks", "num_preemptions_total", "prompt_tokens_total", "generation_tokens_total",
                    "prefix_cache_queries_total", "prefix_cache_hits_total", "step_retries_total",
                    "request_success_total",
                    "request_rejected_total", "time_to_first_token_seconds", "time_per_output_token_seconds",
                    "inter_token_latency_seconds", "e2e_request_latency_seconds", "request_queue_time_seconds"]


def test_metrics_named_as_in_the_contract_and_updated_live(server):
    before = server.metrics()
    r = post(server, "/v1/completions", {"prompt": "metrics please", "max_tokens": 5, "ignore_eos": True})
    assert r.status_code == 200
    after = server.metrics()
    names = {k.split("{")[0] for k in after}
    for name in CONTRACT_METRICS:
        full = "deployctl_runtime_" + name
        assert full in names or full + "_bucket" in names, full
    p = "deployctl_runtime_"
    assert after[p + "generation_tokens_total"] - before[p + "generation_tokens_total"] == 5
    assert after[p + "prompt_tokens_total"] - before[p + "prompt_tokens_total"] == r.json()["usage"]["prompt_tokens"]
    assert after[p + 'request_success_total{finish_reason="length"}'] > before[p + 'request_success_total{finish_reason="length"}']
    assert after[p + "time_to_first_token_seconds_count"] == before[p + "time_to_first_token_seconds_count"] + 1
    assert after[p + "inter_token_latency_seconds_count"] == before[p + "inter_token_latency_seconds_count"] + 4
    assert after[p + "num_gpu_blocks"] > 0 and 0 <= after[p + "kv_cache_usage_ratio"] <= 1
    ttft_edges = sorted(float(k.split('le="')[1].rstrip('"}')) for k in after
                        if k.startswith(p + "time_to_first_token_seconds_bucket") and "+Inf" not in k)
    tpot_edges = sorted(float(k.split('le="')[1].rstrip('"}')) for k in after
                        if k.startswith(p + "time_per_output_token_seconds_bucket") and "+Inf" not in k)
    assert ttft_edges[0] == 0.005 and ttft_edges[-1] >= 300 and len(ttft_edges) >= 30
    assert tpot_edges[0] == 0.001 and tpot_edges[-1] == 2.0
    assert sum(1 for e in tpot_edges if 0.01 <= e <= 0.1) >= 10  # dense around typical TPOT


def test_access_log_line_without_prompt_text(server):
    r = post(server, "/v1/completions", {"prompt": "zebrafish secret", "max_tokens": 3},
             headers={"X-Request-Id": "acc-log-1"})
    assert r.status_code == 200 and r.headers["x-request-id"] == "acc-log-1"
    bad = post(server, "/v1/completions", {"prompt": "zebrafish", "max_tokens": -1},
               headers={"X-Request-Id": "acc-log-2"})
    assert bad.status_code == 400
    import time

    time.sleep(0.3)
    lines = [ln for ln in server.lines if "deployctl_runtime.access" in ln]
    ok = next(ln for ln in lines if "request_id=acc-log-1" in ln)
    assert "status=200" in ok and "prompt_tokens=" in ok and "completion_tokens=3" in ok
    assert "ttft_ms=" in ok and "ttft_ms=-" not in ok and "total_ms=" in ok
    assert "status=400" in next(ln for ln in lines if "request_id=acc-log-2" in ln)
    assert "zebrafish" not in server.log


def test_prompt_list_and_token_ids_with_n(server, tokenizer):
    ids = tokenizer.encode("hello world").ids
    r = post(server, "/v1/completions", {"prompt": ["hello world", "good night"], "n": 2, "max_tokens": 3,
                                         "temperature": 0, "ignore_eos": True})
    assert r.status_code == 200
    out = r.json()
    assert [c["index"] for c in out["choices"]] == [0, 1, 2, 3]
    assert out["usage"]["completion_tokens"] == 12
    texts = [c["text"] for c in out["choices"]]
    assert texts[0] == texts[1]  # greedy: both choices of a prompt agree
    by_ids = post(server, "/v1/completions", {"prompt": ids, "max_tokens": 3, "temperature": 0, "ignore_eos": True})
    assert by_ids.json()["choices"][0]["text"] == texts[0]
    assert by_ids.json()["usage"]["prompt_tokens"] == len(ids)
