"""server.max_prompt_tokens / max_completion_tokens on one real `serve` process (--max-prompt-tokens 8
--max-completion-tokens 5): a longer prompt or a larger max_tokens is a 400 in OpenAI's error shape naming the
field and the cap; an omitted max_tokens stops at the cap (finish_reason length), not at the end of the context."""
from __future__ import annotations

import httpx
import pytest

from .conftest import running


@pytest.fixture(scope="module")
def server(tiny_model):
    yield from running(["--model", str(tiny_model), "--max-model-len", "256", "--num-gpu-blocks-override", "64",
                        "--max-prompt-tokens", "8", "--max-completion-tokens", "5"], clean_exit=True)


def _post(server, **body):
    return httpx.post(server.url + "/v1/completions", json={"temperature": 0, **body}, timeout=60)


def test_prompt_above_the_cap_is_a_400_naming_prompt(server):
    r = _post(server, prompt=list(range(1, 10)), max_tokens=1)  # 9 token ids
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "prompt" and err["type"] == "invalid_request_error"
    assert "9 tokens, above this server's max_prompt_tokens 8" in err["message"]
    assert _post(server, prompt=list(range(1, 9)), max_tokens=1).status_code == 200  # 8 is allowed


def test_max_tokens_above_the_cap_is_a_400_and_omitted_stops_at_the_cap(server):
    r = _post(server, prompt=[1, 2, 3], max_tokens=6)
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens", r.text
    assert "max_completion_tokens 5" in r.json()["error"]["message"]
    ok = _post(server, prompt=[1, 2, 3], ignore_eos=True)
    assert ok.status_code == 200, ok.text
    body = ok.json()
    assert body["usage"]["completion_tokens"] == 5 and body["choices"][0]["finish_reason"] == "length"
