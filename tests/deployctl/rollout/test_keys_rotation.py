"""`deployctl keys add|retire|list` (docs/runbook-api-key-rotation.md): the router holds the keys, so a rotation is
two router reloads and no engine restart. On the sshd fleet with the stand-in engine behind real nginx: steady
traffic moves from the old key to the new one while five streams longer than the reload's drain stay open across
both reloads; no request fails, every stream ends with [DONE], the engines keep their pids, the old key gets 401
afterwards and `keys list` shows when it was last used."""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import pytest

from deployctl.demo.run import Traffic
from deployctl.render.keys import key_id

pytestmark = [pytest.mark.timeout(400)]

OLD, NEW = "sk-edge-old-0123456789", "sk-edge-new-9876543210"
TOKEN_S = 2.0  # the stand-in's delay per token: a 12-token stream lasts 24 s, across both reloads (each waits up to 5 s)


class KeyedTraffic(Traffic):
    """demo.run.Traffic with the client's current API key on every request."""

    key = OLD


def _stream(url: str, key: str, out: list) -> None:
    """One long streamed completion through the router: (status, ended with [DONE], chunks, error)."""
    try:
        with httpx.Client(timeout=60) as client, client.stream(
                "POST", url + "/v1/completions", headers={"Authorization": f"Bearer {key}"},
                json={"model": "tiny-chat", "prompt": "tell a long story", "max_tokens": 12, "stream": True}) as r:
            lines = [line for line in r.iter_lines() if line.startswith("data: ")]
            out.append((r.status_code, bool(lines) and lines[-1] == "data: [DONE]", len(lines), None))
    except httpx.HTTPError as exc:
        out.append((0, False, 0, repr(exc)))


def _pids(env) -> dict[str, str]:
    return {n: (Path(env.host(n)["deploy_root"]) / "shared" / "run" / "runtime.pid").read_text().strip()
            for n in env.names}


def test_rotation_by_router_reloads_keeps_streams_and_engines(rollout_env):
    env = rollout_env(2, engine="standin", steps=[100])
    env.cfg["server"]["api_key_env"] = "EDGE_KEY"
    env.cfg["engine"]["env"] = {"DEPLOYCTL_STANDIN_TOKEN_S": str(TOKEN_S)}
    env.write()
    keyed = {"EDGE_KEY": OLD, "EDGE_NEW_KEY": NEW}
    r = env.cli("deploy", "--yes", env=keyed, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    url = env.url
    assert httpx.get(url + "/v1/models", timeout=10).status_code == 401  # the router checks the key
    pids = _pids(env)

    traffic = KeyedTraffic(url, "tiny-chat", workers=2, completion_workers=1, max_tokens=1).start()
    streams: list = []
    threads = [threading.Thread(target=_stream, args=(url, OLD, streams)) for _ in range(5)]
    try:
        for t in threads:
            t.start()
        time.sleep(1.0)  # the streams are open on nginx's current workers
        r = env.cli("keys", "add", "--from-env", "EDGE_NEW_KEY", "--json", env=keyed)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["id"] == key_id(NEW) and NEW not in r.stdout + r.stderr
        before = sum(traffic.snapshot()[0].values())
        traffic.key = NEW  # the clients move
        deadline = time.monotonic() + 30
        while sum(traffic.snapshot()[0].values()) < before + 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        r = env.cli("keys", "retire", key_id(OLD)[:8], env=keyed)
        assert r.returncode == 0, r.stderr
        assert any(t.is_alive() for t in threads), "the streams ended before the second reload: make them longer"
        for t in threads:
            t.join(60)
        time.sleep(1.0)
    finally:
        traffic.stop()
    ok, failed = traffic.snapshot()
    assert not failed and sum(ok.values()) > 10, (dict(failed), dict(ok))
    assert len(streams) == 5 and all(s[:2] == (200, True) for s in streams), streams
    assert _pids(env) == pids  # no engine restarted

    assert httpx.get(url + "/v1/models", headers={"Authorization": f"Bearer {OLD}"}, timeout=10).status_code == 401
    assert httpx.get(url + "/v1/models", headers={"Authorization": f"Bearer {NEW}"}, timeout=10).status_code == 200
    r = env.cli("keys", "list", "--json", env=keyed)
    assert r.returncode == 0, r.stderr
    rows = {k["id"]: k for k in json.loads(r.stdout)["keys"]}
    old, new = rows[key_id(OLD)], rows[key_id(NEW)]
    assert old["state"] == "retired" and old["last_used"] and old["requests"] >= 5 and old["engine_key"], old
    assert new["state"] == "accepted" and new["source"] == "keys" and new["last_used"] and new["requests"] > 0, new
    conf = Path(env.cfg["router"]["upstream_conf"])
    keys_file = Path(str(conf) + ".keys")
    assert oct(keys_file.stat().st_mode & 0o777) == "0o600"
    logged = conf.read_text() + Path(env.cfg["router"]["access_log"]).read_text()
    assert OLD not in logged and NEW not in logged
    for args, says in ((("keys", "add", "--from-env", "EDGE_NEW_KEY"), "accepted already"),
                       (("keys", "retire", "0000"), "matches 0 accepted key"),
                       (("keys", "retire", key_id(NEW)), "every key")):
        r = env.cli(*args, env=keyed)
        assert r.returncode == 2 and says in " ".join(r.stderr.split()), (args, r.stderr)
    # a later deploy with the old key still in server.api_key_env does not accept it again at the router
    r = env.cli("router", "reload", env=keyed)
    assert r.returncode == 0, r.stderr
    assert httpx.get(url + "/v1/models", headers={"Authorization": f"Bearer {OLD}"}, timeout=10).status_code == 401
