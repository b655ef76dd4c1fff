"""Edges found by trying the runtime as a new user: /health says 503 until the model serves, a missing model
directory (or one without config.json) is a configuration error (exit 2), corrupt (NaN) weights or a model whose
warm-up overflows fail the start instead of reporting ready, and the errors of top_logprobs and seed name what the
client sent."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from deployctl_runtime.sampling_params import SamplingParams

from .conftest import RUNTIME_DIR


def test_health_is_503_while_loading_then_200(start_server, tiny_model):
    srv = start_server(["--model", str(tiny_model)], env={"DEPLOYCTL_RUNTIME_FAULT": "load_delay_s=3"}, ready=False)
    srv.wait_port()
    r = httpx.get(srv.url + "/health", timeout=10)
    assert r.status_code == 503, r.text  # was 200 while /v1/models said not_ready
    assert r.json()["error"]["code"] == "not_ready" and "Retry-After" in r.headers
    assert httpx.get(srv.url + "/v1/models", timeout=10).status_code == 503
    srv.wait_ready()
    assert httpx.get(srv.url + "/health", timeout=10).status_code == 200


def _serve(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "deployctl_runtime", "serve", "--port", "0", *args],
                          capture_output=True, text=True, timeout=timeout, env={"PYTHONPATH": str(RUNTIME_DIR),
                                                                               "PATH": "/usr/bin:/bin",
                                                                               "OMP_NUM_THREADS": "1"})


def test_a_missing_model_directory_is_a_configuration_error(tmp_path):
    r = _serve("--model", str(tmp_path / "nope"))
    assert r.returncode == 2, r.stderr  # was 1: a crash, restarted 4 times by launch.sh
    assert f"model directory {tmp_path / 'nope'} does not exist" in r.stderr and "--model" in r.stderr


def test_a_directory_that_is_not_a_checkpoint_is_a_configuration_error(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"")
    r = _serve("--model", str(tmp_path))
    assert r.returncode == 2, r.stderr  # was 1: a failed load, retried 4 times by launch.sh
    assert f"model directory {tmp_path} has no config.json" in r.stderr and "--model" in r.stderr


def _edited_copy(tiny_model: Path, model: Path, edit) -> Path:
    """A copy of the tiny checkpoint whose weights ``edit(tensors)`` changed in place (its manifest dropped)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(tiny_model, model)
    (model / "manifest.sha256").unlink()
    weights = next(model.glob("*.safetensors"))
    tensors = load_file(str(weights))
    edit(tensors)
    save_file(tensors, str(weights), metadata={"format": "pt"})
    return model


def test_nan_weights_fail_the_start(tmp_path, tiny_model):
    def nan(tensors):
        tensors[sorted(k for k in tensors if "mlp" in k)[0]][0, 0] = float("nan")

    model = _edited_copy(tiny_model, tmp_path / "nan-model", nan)
    t0 = time.monotonic()
    r = _serve("--model", str(model), timeout=120)
    assert r.returncode == 1, r.stderr  # it used to pass warm-up and report ready
    assert "NaN or inf" in r.stderr and "corrupt" in r.stderr
    assert time.monotonic() - t0 < 60


def test_a_model_that_always_overflows_fails_the_start(tmp_path, tiny_model):
    # finite weights (the weight check passes) whose activations overflow on every prompt: a stand-in for a
    # float16 overflow. It used to report ready, answer every request 500 and never count an engine error.
    def overflow(tensors):
        for name in tensors:
            if name.endswith("down_proj.weight"):
                tensors[name].fill_(3e38)

    model = _edited_copy(tiny_model, tmp_path / "overflow-model", overflow)
    r = _serve("--model", str(model), timeout=120)
    assert r.returncode == 1, r.stderr  # a failed start, as NaN weights
    assert "failed to start: the warm-up forward pass gave non-finite logits" in r.stderr, r.stderr
    assert "in float32" in r.stderr and "Traceback" not in r.stderr


def test_top_logprobs_error_names_top_logprobs(api_server):
    r = httpx.post(api_server.url + "/v1/chat/completions", timeout=30,
                   json={"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 21})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "top_logprobs"
    assert err["message"].startswith("top_logprobs:"), err


@pytest.mark.parametrize("seed,status", [(2**64 - 1, 200), (2**64, 400), (-(2**63), 200), (-(2**63) - 1, 400)])
def test_seeds_outside_the_generator_range_are_refused_not_wrapped(api_server, seed, status):
    r = httpx.post(api_server.url + "/v1/completions", timeout=30,
                   json={"prompt": "hi", "max_tokens": 2, "temperature": 1.0, "seed": seed})
    assert r.status_code == status, r.text
    if status == 400:
        assert r.json()["error"]["param"] == "seed"
        with pytest.raises(ValueError, match="seed"):  # the offline API refuses the same
            SamplingParams(seed=seed).validate()



WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}}, "required": ["city"]}}}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("short", [2, 5])
def test_a_forced_tool_call_cut_by_max_tokens_is_a_truncated_call_with_finish_reason_length(api_server, stream,
                                                                                           short):
    body = {"messages": [{"role": "user", "content": "Weather?"}], "tools": [WEATHER], "tool_choice": "required",
            "temperature": 0}
    url = api_server.url + "/v1/chat/completions"
    whole = httpx.post(url, json={**body, "max_tokens": 200}, timeout=60).json()
    full_args = whole["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
    cut = whole["usage"]["completion_tokens"] - short
    if not stream:
        ch = httpx.post(url, json={**body, "max_tokens": cut}, timeout=60).json()["choices"][0]
        calls, reason = ch["message"]["tool_calls"], ch["finish_reason"]
        assert ch["message"]["content"] is None  # it used to come back as content text
    else:
        with httpx.stream("POST", url, json={**body, "max_tokens": cut, "stream": True}, timeout=60) as r:
            chunks = [json.loads(line[6:]) for line in r.iter_lines()
                      if line.startswith("data: ") and line != "data: [DONE]"]
        deltas = [c["choices"][0] for c in chunks if c["choices"]]
        assert not any(d["delta"].get("content") for d in deltas)
        (last,) = [d for d in deltas if d["delta"].get("tool_calls")]
        calls, reason = last["delta"]["tool_calls"], last["finish_reason"]
    assert reason == "length"
    assert calls[0]["function"]["name"] == "get_weather"
    args = calls[0]["function"]["arguments"]
    compact = json.dumps(json.loads(full_args), separators=(",", ":"))
    assert args == full_args or (args and compact.startswith(args) and args != compact), (args, full_args)


TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def _tool_answer(url: str, body: dict, stream: bool) -> tuple:
    """(content, tool_calls, finish_reason) of the only choice, whole or gathered from the stream."""
    if not stream:
        ch = httpx.post(url, json=body, timeout=60).json()["choices"][0]
        return ch["message"]["content"], ch["message"].get("tool_calls"), ch["finish_reason"]
    with httpx.stream("POST", url, json={**body, "stream": True}, timeout=60) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    deltas = [c["choices"][0] for c in chunks if c["choices"]]
    calls = [call for d in deltas for call in d["delta"].get("tool_calls") or []]
    return ("".join(d["delta"].get("content") or "" for d in deltas) or None, calls or None,
            next(d["finish_reason"] for d in deltas if d["finish_reason"]))


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("tools,choice", [([WEATHER, TIME], NAMED), ([WEATHER], "required"),
                                          ([WEATHER, TIME], "required")], ids=["named", "required", "required-2"])
def test_a_forced_tool_call_cut_at_every_point_is_a_truncated_call_never_text(api_server, stream, tools, choice):
    # cut before "arguments" (or inside the name) it used to come back as content '[{"name":"get_weathe...'
    body = {"messages": [{"role": "user", "content": "Weather?"}], "tools": tools, "tool_choice": choice,
            "temperature": 0}
    url = api_server.url + "/v1/chat/completions"
    whole = httpx.post(url, json={**body, "max_tokens": 200}, timeout=60).json()
    (call,) = whole["choices"][0]["message"]["tool_calls"]
    name, full_args = call["function"]["name"], call["function"]["arguments"]
    compact = json.dumps(json.loads(full_args), separators=(",", ":"))
    seen = []
    for cut in range(1, whole["usage"]["completion_tokens"]):
        content, calls, reason = _tool_answer(url, {**body, "max_tokens": cut}, stream)
        assert content is None and reason == "length", (cut, content, reason)
        if calls is None:  # only while two tools' names are still alike ("get_")
            assert choice == "required" and len(tools) == 2 and not seen, cut
            continue
        (got,) = calls
        args = got["function"]["arguments"]
        assert got["function"]["name"] == name and got["type"] == "function" and got["id"].startswith("call_")
        assert args == full_args or compact.startswith(args), (cut, args)
        seen.append(args)
    assert "" in seen and len(set(seen)) > 2  # cuts before the arguments, inside them, and after
    assert [len(a) for a in seen] == sorted(len(a) for a in seen)


def _byte_token(tiny_model, byte: int) -> int:
    from tokenizers import Tokenizer

    from deployctl_runtime.tokenizer import TokenBytes

    tok = Tokenizer.from_file(str(tiny_model / "tokenizer.json"))
    tb = TokenBytes(tok)
    return next(i for i in range(tok.get_vocab_size()) if tb.bytes(i) == bytes([byte]))


def test_text_offset_counts_characters_of_the_text_for_partial_utf8_tokens(api_server, tiny_model):
    # "é" is C3 A9: forcing its two byte tokens alternately is impossible with logit_bias, so force the lead byte:
    # each lone lead byte is one U+FFFD in the text; the tokens show as "\xc3" (4 characters), and text_offset used
    # to add those 4 per token (non-stream: past the end of the text) and stayed 0 when streamed
    lead = _byte_token(tiny_model, 0xC3)
    body = {"prompt": "Hello", "max_tokens": 4, "temperature": 0, "logit_bias": {str(lead): 100}, "logprobs": 0,
            "ignore_eos": True}
    ch = httpx.post(api_server.url + "/v1/completions", json=body, timeout=60).json()["choices"][0]
    offsets, tokens = ch["logprobs"]["text_offset"], ch["logprobs"]["tokens"]
    assert tokens == ["\\xc3"] * 4
    assert all(o <= len(ch["text"]) for o in offsets) and offsets == sorted(offsets)
    assert offsets[0] == 0 and offsets[-1] < len(ch["text"])
    with httpx.stream("POST", api_server.url + "/v1/completions", json={**body, "stream": True}, timeout=60) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ") and "[DONE]" not in line]
    streamed = [o for c in chunks if c["choices"] and c["choices"][0]["logprobs"]
                for o in c["choices"][0]["logprobs"]["text_offset"]]
    assert streamed == offsets


def _streamed_completion(url: str, body: dict) -> tuple[str, list[int], list[int]]:
    """(text, text_offset, token_ids) gathered from a streamed completion."""
    with httpx.stream("POST", url, json={**body, "stream": True}, timeout=60) as r:
        chunks = [json.loads(line[6:])["choices"][0] for line in r.iter_lines() if line.startswith("data: {")]
    return ("".join(c["text"] for c in chunks),
            [o for c in chunks if c["logprobs"] for o in c["logprobs"]["text_offset"]],
            [t for c in chunks for t in c.get("token_ids") or []])


def test_text_offset_indexes_into_the_text_when_a_stop_string_cuts_it(api_server):
    # a stop string beginning inside one token and ending inside a later one: the text ends where it begins, yet
    # the tokens that carried it are returned; their offsets used to run past the text (text of 20 characters,
    # last offset 22), and streamed ones too
    url = api_server.url + "/v1/completions"
    body = {"prompt": "The quick brown fox", "max_tokens": 24, "temperature": 0, "ignore_eos": True, "logprobs": 0,
            "return_token_ids": True}
    whole = httpx.post(url, json=body, timeout=60).json()["choices"][0]
    text, starts = whole["text"], whole["logprobs"]["text_offset"]
    ends = starts[1:] + [len(text)]
    k = next(k for k in range(2, len(starts) - 3) if ends[k] - starts[k] >= 2 and ends[k + 1] > starts[k + 1]
             and text.find(text[starts[k] + 1:starts[k + 2] + 1]) == starts[k] + 1)
    cut = starts[k] + 1
    body = {**body, "stop": [text[cut:starts[k + 2] + 1]]}
    ch = httpx.post(url, json=body, timeout=60).json()["choices"][0]
    offsets = ch["logprobs"]["text_offset"]
    assert ch["text"] == text[:cut] and ch["finish_reason"] == "stop"
    assert len(offsets) == len(ch["token_ids"]) == k + 3  # the tokens through the one that completed the stop
    assert offsets == starts[:k + 1] + [cut, cut] and max(offsets) <= len(ch["text"])
    assert _streamed_completion(url, body) == (ch["text"], offsets, ch["token_ids"])
    # without a stop the streamed offsets are the whole response's (tokens go out once the text reaches them)
    assert _streamed_completion(url, {**body, "stop": None}) == (text, starts, whole["token_ids"])


def test_a_streamed_tool_call_carries_the_logprobs_of_every_token(api_server):
    body = {"messages": [{"role": "user", "content": "Weather?"}], "tools": [WEATHER], "tool_choice": "required",
            "temperature": 0, "max_tokens": 200, "logprobs": True, "top_logprobs": 2}
    url = api_server.url + "/v1/chat/completions"
    whole = httpx.post(url, json=body, timeout=60).json()["choices"][0]
    assert whole["finish_reason"] == "tool_calls"
    with httpx.stream("POST", url, json={**body, "stream": True}, timeout=60) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ") and "[DONE]" not in line]
    streamed = [t for c in chunks if c["choices"] and c["choices"][0].get("logprobs")
                for t in c["choices"][0]["logprobs"]["content"]]
    # it used to carry only the last token's (the tool_calls delta had none; held tokens' were dropped)
    assert streamed == whole["logprobs"]["content"]
