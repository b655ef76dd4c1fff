"""API keys over real HTTP: deny by default, open health routes, constant-time check, keys never logged."""
from __future__ import annotations

import httpx
import openai
import pytest


@pytest.fixture(scope="module")
def keyed(tiny_model, tmp_path_factory):
    from .conftest import ServerProcess

    key_file = tmp_path_factory.mktemp("keys") / "keys.txt"
    key_file.write_text("# operators\nfile-key-3\n")
    srv = ServerProcess(["--model", str(tiny_model), "--max-model-len", "128", "--kv-cache-memory", "8MiB",
                         "--api-key-file", str(key_file)], env={"DEPLOYCTL_RUNTIME_API_KEY": "env-key-1, env-key-2"})
    try:
        yield srv.wait_ready()
    finally:
        srv.stop()


@pytest.mark.parametrize("path", ["/healthz", "/readyz"])
def test_health_routes_are_open(keyed, path):
    assert httpx.get(keyed.url + path).status_code == 200


@pytest.mark.parametrize("method,path", [("GET", "/metrics"), ("GET", "/v1/models"), ("POST", "/v1/completions"),
                                         ("POST", "/v1/chat/completions"), ("GET", "/some/new/route")])
@pytest.mark.parametrize("auth", [None, "Bearer wrong-key", "Basic env-key-1", "Bearer env-key-1x"])
def test_every_other_route_denies_without_a_valid_key(keyed, method, path, auth):
    headers = {"Authorization": auth} if auth else {}
    r = httpx.request(method, keyed.url + path, headers=headers, json={"prompt": "hi"})
    assert r.status_code == 401
    err = r.json()["error"]
    assert err["type"] == "authentication_error" and err["code"] == "invalid_api_key"
    assert r.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize("key", ["env-key-1", "env-key-2", "file-key-3"])
def test_each_configured_key_works_with_the_openai_client(keyed, key):
    client = openai.OpenAI(base_url=keyed.url + "/v1", api_key=key, max_retries=0)
    model = client.models.list().data[0].id
    assert client.completions.create(model=model, prompt="hi", max_tokens=2).usage.completion_tokens == 2
    assert httpx.get(keyed.url + "/metrics", headers={"Authorization": f"Bearer {key}"}).status_code == 200


def test_wrong_key_is_an_authentication_error_and_keys_are_never_logged(keyed):
    client = openai.OpenAI(base_url=keyed.url + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(model="any", messages=[{"role": "user", "content": "x"}], max_tokens=2)
    assert not any(k in keyed.log for k in ("env-key-1", "env-key-2", "file-key-3", "nope"))
    assert "status=401" in keyed.log  # the refused request is in the access log, without its key


def test_the_access_log_names_each_request_by_its_keys_hashed_id(keyed):
    """Old and new key at once (a rotation): each request's access log line has key_id=<sha256[:12]> of the key
    it used, never the key."""
    import hashlib
    import time

    for key, rid in (("env-key-1", "rot-old-1"), ("env-key-2", "rot-new-1")):
        headers = {"Authorization": f"Bearer {key}", "X-Request-Id": rid}
        model = httpx.get(keyed.url + "/v1/models", headers=headers).json()["data"][0]["id"]
        r = httpx.post(keyed.url + "/v1/completions", headers=headers, json={"model": model, "prompt": "hi",
                                                                            "max_tokens": 1})
        assert r.status_code == 200, r.text
    deadline = time.monotonic() + 10
    while "request_id=rot-new-1 method=POST" not in keyed.log and time.monotonic() < deadline:
        time.sleep(0.1)
    for rid, key in (("rot-old-1", "env-key-1"), ("rot-new-1", "env-key-2")):
        line = next(ln for ln in keyed.log.splitlines() if f"request_id={rid} method=POST" in ln)
        assert f"key_id={hashlib.sha256(key.encode()).hexdigest()[:12]}" in line, line
    assert not any(k in keyed.log for k in ("env-key-1", "env-key-2"))
