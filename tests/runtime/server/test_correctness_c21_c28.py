"""Cases C21, C22, C24, C26, C27, C28 (shared/cases/runtime-2.md) replayed through a real `serve` process and the
offline API; each failed on main before this change. C23 is tests/runtime/test_prefix_cache_keys_c23.py, C25
test_logprobs_c25.py."""
from __future__ import annotations

import json
import shutil

import httpx
import pytest

from deployctl_runtime import LLM, SamplingParams
from deployctl_runtime.engine import RequestRejected

from .conftest import OVERFLOW_TOKEN, ServerProcess, running

KEY = "k-c2x"
MAX_LEN = 256


@pytest.fixture(scope="module")
def server(tiny_model):
    yield from running(["--model", str(tiny_model), "--max-model-len", str(MAX_LEN), "--kv-cache-memory", "8MiB",
                        "--served-model-name", "tiny"], env={"DEPLOYCTL_RUNTIME_API_KEY": KEY}, key=KEY)


@pytest.fixture(scope="module")
def offline(tiny_model):
    return LLM(str(tiny_model), max_model_len=MAX_LEN, num_gpu_blocks_override=64)


def post(srv, path, body, **kw):
    return httpx.post(srv.url + path, json=body, headers=srv.headers, timeout=60, **kw)


# ---- C21: best_of ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("body,code", [({"n": 3, "best_of": 2}, "invalid_value"),
                                       ({"n": 2, "best_of": 3, "stream": True}, "unsupported_parameter")])
def test_c21_best_of_below_n_or_streamed_is_400_naming_best_of(server, body, code):
    r = post(server, "/v1/completions", {"prompt": "hi", "max_tokens": 3, **body})
    assert r.status_code == 400, r.text
    assert (r.json()["error"]["param"], r.json()["error"]["code"]) == ("best_of", code)


def test_c21_best_of_returns_the_choice_with_the_highest_cumulative_logprob(server):
    kw = {"prompt": "The quick brown fox", "max_tokens": 6, "temperature": 1.0, "seed": 21, "ignore_eos": True}
    all4 = post(server, "/v1/completions", {**kw, "n": 4, "logprobs": 0}).json()["choices"]
    best = max(all4, key=lambda c: sum(c["logprobs"]["token_logprobs"]))
    assert len({c["text"] for c in all4}) > 1  # the candidates differ, so picking matters
    r = post(server, "/v1/completions", {**kw, "n": 1, "best_of": 4})
    assert r.status_code == 200, r.text
    out = r.json()
    assert [c["text"] for c in out["choices"]] == [best["text"]] and out["choices"][0]["index"] == 0
    assert out["choices"][0]["logprobs"] is None  # not asked for, only used to rank
    assert out["usage"]["completion_tokens"] == 4 * 6  # every candidate is generated (and billed, as OpenAI)


# ---- C22: one BOS on every path --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bos_model(tiny_model, tmp_path_factory):
    """The tiny checkpoint with a BOS (<|endoftext|>, id 0) that the tokenizer's post-processor prepends and a chat
    template starting with {{ bos_token }}, as Llama 3's."""
    from deployctl_runtime.tiny_model import CHAT_TEMPLATE, write_manifest

    out = tmp_path_factory.mktemp("bos") / "bos-model"
    shutil.copytree(tiny_model, out)
    tok = json.loads((out / "tokenizer.json").read_text())
    tok["post_processor"] = {"type": "TemplateProcessing",
                             "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
                                        {"Sequence": {"id": "A", "type_id": 0}}],
                             "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                             "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [0],
                                                                  "tokens": ["<|endoftext|>"]}}}
    (out / "tokenizer.json").write_text(json.dumps(tok))
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    cfg.update(bos_token="<|endoftext|>", add_bos_token=True, chat_template="{{ bos_token }}" + CHAT_TEMPLATE)
    (out / "tokenizer_config.json").write_text(json.dumps(cfg))
    (out / ".deployctl-verify-cache.json").unlink(missing_ok=True)
    write_manifest(out)
    return out


def test_c22_bos_once_on_chat_completions_and_offline(bos_model):
    import transformers

    hf = transformers.AutoTokenizer.from_pretrained(str(bos_model))
    chat_ids = hf.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=True, add_generation_prompt=True)
    chat_ids = chat_ids["input_ids"] if isinstance(chat_ids, dict) or hasattr(chat_ids, "keys") else chat_ids
    hi_ids = hf("hi").input_ids
    assert chat_ids[:2] != [0, 0] and chat_ids[0] == 0 and hi_ids[0] == 0
    srv = ServerProcess(["--model", str(bos_model), "--max-model-len", "128", "--kv-cache-memory", "8MiB"])
    try:
        srv.wait_ready()
        chat = httpx.post(srv.url + "/v1/chat/completions", timeout=60,
                          json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}).json()
        assert chat["usage"]["prompt_tokens"] == len(chat_ids)
        for prompt in ("hi", "<|endoftext|>hi"):
            r = httpx.post(srv.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 1}, timeout=60).json()
            assert r["usage"]["prompt_tokens"] == len(hi_ids), prompt
        tok = httpx.post(srv.url + "/tokenize", json={"prompt": "<|endoftext|>hi"}, timeout=30).json()
        assert tok["tokens"] == hi_ids
    finally:
        srv.stop()
    llm = LLM(str(bos_model), max_model_len=128, num_gpu_blocks_override=16)
    rendered = hf.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    out = llm.generate(rendered, SamplingParams(max_tokens=1))[0]
    assert out.prompt_token_ids == list(chat_ids)


# ---- C24: overflow (a model whose activations overflow on some prompts) --------------------------------------
def test_c24_non_finite_logits_end_the_request_with_a_named_5xx_and_the_server_stays_up(overflow_token_model):
    srv = ServerProcess(["--model", str(overflow_token_model), "--max-model-len", "128", "--kv-cache-memory", "8MiB"])
    bad = [5, OVERFLOW_TOKEN, 7]
    try:
        srv.wait_ready()
        for extra in ({}, {"ignore_eos": True}, {"logprobs": 2}):
            r = httpx.post(srv.url + "/v1/completions", timeout=60, headers={"X-Request-Id": "nan-1"},
                           json={"prompt": bad, "max_tokens": 8, "temperature": 0, **extra})
            assert r.status_code == 500, (extra, r.text)
            err = r.json()["error"]
            assert err["code"] == "non_finite_logits" and "non-finite logits" in err["message"]
            assert "Traceback" not in r.text and "--dtype" in err["message"]
        with httpx.stream("POST", srv.url + "/v1/completions", timeout=60,
                          json={"prompt": bad, "max_tokens": 4, "stream": True, "logprobs": 1}) as s:
            events = [line[6:] for line in s.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]" and json.loads(events[-2])["error"]["code"] == "non_finite_logits"
        assert httpx.get(srv.url + "/health", timeout=10).status_code == 200  # the engine loop is alive
        assert httpx.get(srv.url + "/readyz", timeout=10).status_code == 200
        r = httpx.post(srv.url + "/v1/completions", timeout=60, json={"prompt": [5, 6, 7], "max_tokens": 8,
                                                                      "ignore_eos": True})
        assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length"
    finally:
        srv.stop()
    lines = [ln for ln in srv.lines if "nan-1" in ln and "non-finite" in ln]
    assert len(lines) == 3 and "Traceback" not in srv.log  # once per request, no traceback


# ---- C26: one validator for offline and HTTP -------------------------------------------------------------------
def test_c26_top_k_zero_is_off_on_both_paths(server, offline):
    ids = [5, 6, 7, 8]
    params = dict(max_tokens=5, temperature=1.0, seed=3, ignore_eos=True)
    zero = offline.generate([ids], SamplingParams(top_k=0, **params))[0].token_ids
    assert zero == offline.generate([ids], SamplingParams(top_k=-1, **params))[0].token_ids
    r = post(server, "/v1/completions", {"prompt": ids, "top_k": 0, "return_token_ids": True, **params})
    assert r.status_code == 200 and r.json()["choices"][0]["token_ids"] == zero


@pytest.mark.parametrize("field,value", [("temperature", 5.0), ("top_p", 0.0), ("top_k", -5), ("logprobs", 99),
                                         ("presence_penalty", 9.0), ("repetition_penalty", 0.0), ("min_tokens", -1)])
def test_c26_same_refusal_and_message_offline_and_over_http(server, offline, field, value):
    with pytest.raises(ValueError) as exc:
        offline.generate([[5, 6]], SamplingParams(**{field: value}))
    r = post(server, "/v1/completions", {"prompt": [5, 6], "max_tokens": 16, field: value})
    assert r.status_code == 400 and r.json()["error"]["param"] == field
    assert r.json()["error"]["message"] == str(exc.value)


def test_c26_prompt_plus_max_tokens_over_the_context_is_refused_on_both_paths(server, offline):
    ids = [7] * (MAX_LEN - 6)
    with pytest.raises(RequestRejected) as exc:
        offline.generate([ids], SamplingParams(max_tokens=10))
    r = post(server, "/v1/completions", {"prompt": ids, "max_tokens": 10})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert r.json()["error"]["message"] == exc.value.message


# ---- C27: trailing slash ---------------------------------------------------------------------------------------
def test_c27_trailing_slash_answers_like_its_twin_and_never_echoes_host(server):
    headers = {**server.headers, "Host": "evil.example"}
    for path, body in (("/v1/completions/", {"prompt": "hi", "max_tokens": 2}),
                       ("/v1/chat/completions/", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})):
        r = httpx.post(server.url + path, json=body, headers=headers, timeout=60, follow_redirects=False)
        assert r.status_code == 200, r.text
        assert "evil.example" not in r.text and all("evil.example" not in v for v in r.headers.values())
    r = httpx.get(server.url + "/v1/models/", headers=headers, timeout=10, follow_redirects=False)
    assert r.status_code == 200 and r.json()["data"][0]["id"] == "tiny"
    assert httpx.post(server.url + "/v1/completions/", json={"prompt": "hi"}, timeout=10).status_code == 401
    nope = httpx.get(server.url + "/nope/", headers=headers, timeout=10, follow_redirects=False)
    assert nope.status_code == 404 and "evil.example" not in nope.text and "location" not in nope.headers


# ---- C28: where the model runs ---------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["/healthz", "/readyz"])
def test_c28_health_reports_device_dtype_and_kv_pool(server, path):
    body = httpx.get(server.url + path, timeout=10).json()
    assert body["device"] == "cpu" and body["dtype"] == "float32"
    assert isinstance(body["device_name"], str) and body["device_name"]
    kv = body["kv_cache"]
    assert kv["num_blocks"] > 0 and kv["block_size"] == 16 and kv["num_tokens"] == kv["num_blocks"] * 16
    assert 0 <= kv["num_free_blocks"] <= kv["num_blocks"] and 0.0 <= kv["usage"] <= 1.0
