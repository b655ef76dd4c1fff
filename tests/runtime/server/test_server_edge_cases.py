"""Adversarial request bodies against one real `serve` process: every client fault is a 400 in OpenAI's error shape
naming the right field, and no request, however odd, takes the engine down for the others."""
from __future__ import annotations

import httpx
import pytest

from .conftest import ServerProcess


@pytest.fixture(scope="module")
def server(tiny_model):
    srv = ServerProcess(["--model", str(tiny_model), "--max-model-len", "256", "--num-gpu-blocks-override", "64",
                         "--request-timeout-s", "60"])
    try:
        yield srv.wait_ready()
    finally:
        assert srv.stop() == 0, srv.log


def complete(server, **body):
    return httpx.post(server.url + "/v1/completions", json={"prompt": "hello there", "max_tokens": 4, **body},
                      timeout=60)


def test_top_k_beyond_int64_is_off_and_the_engine_survives(server):
    # top_k larger than the vocabulary keeps every token; 2**70 used to overflow the sampler's int64 tensor and
    # crash the engine loop: that request got a 500 and every later one a 503 engine_dead.
    ref = complete(server, seed=7, temperature=1.0, top_k=-1)
    assert ref.status_code == 200, ref.text
    r = complete(server, seed=7, temperature=1.0, top_k=2**70)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == ref.json()["choices"][0]["text"]
    assert httpx.get(server.url + "/healthz", timeout=10).status_code == 200
    assert complete(server).status_code == 200


@pytest.mark.parametrize("path,body,param", [
    ("/v1/completions", {"prompt": "hi", "min_tokens": 10, "max_tokens": 3}, "min_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                              "max_completion_tokens": 4}, "max_completion_tokens"),
])
def test_cross_field_rules_name_the_field_not_invalid_json(server, path, body, param):
    # rules over two fields used to come back as code "invalid_json", param null, "request body is not a valid
    # JSON object" although the body was valid JSON
    r = httpx.post(server.url + path, json=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["type"], err["code"], err["param"]) == ("invalid_request_error", "invalid_value", param)
    assert "JSON" not in err["message"] and param in err["message"]
