"""Issue 41 on a stand-in fleet (sshd hosts, nginx): a release that changes model.served_name. deploy names the
breaking change and refuses it without --allow-served-name-change (exit 2, nothing changed, the fix in the
message); allowed, the canary answers 404 to every client still sending the old name, and the window fails on
the canary's 4xx share against stable's (not "0 errors", not promoted); the abort verifies the old release under
its own served name, so the canary host is back on it, serving and in the upstream. Deployed on purpose with the
clients moved, the old release sleeps as each host's standby; a rollback wakes it and verifies it under its own
name (not the configured new one, which it answers 404 to) — both hosts by the wake, not a cold start."""
from __future__ import annotations

import json

import httpx
import pytest

from deployctl.demo.run import Traffic
from support.nginx import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_served_name_change_is_refused_then_its_404s_fail_the_canary_and_the_abort_restores(rollout_env):
    env = rollout_env(2, engine="standin", steps=[{"weight": 50, "pause": "20s"}, 100],
                      analysis={"interval_s": 2, "min_requests": 5, "outputs": {"enabled": False},
                                "probes": {"enabled": False}})
    for h in env.cfg["hosts"]:
        h["spare_port"] = free_port()  # the old release sleeps beside the new one (rollout.standby_s)
    env.write()
    r = env.cli("deploy", "--yes")
    assert r.returncode == 0, r.stderr
    v1 = env.current(env.names[0])
    env.cfg["model"]["served_name"] = "tiny-chat-v2"
    env.write()
    r = env.cli("deploy", "--yes")
    assert r.returncode == 2, r.stderr
    assert ("deploy refused: breaking change: model.served_name changes from 'tiny-chat' (" + v1 + ") to "
            "'tiny-chat-v2': clients that send \"model\": 'tiny-chat' get 404 from the new release") in r.stderr, r.stderr
    assert ("get 404 from the new release; move the clients to 'tiny-chat-v2' first and pass "
            "--allow-served-name-change, or set model.served_name: 'tiny-chat' in deploy.yaml") in r.stderr, r.stderr
    assert [env.current(n) for n in env.names] == [v1, v1]

    traffic = Traffic(env.url, "tiny-chat", workers=2, completion_workers=1).start()  # clients on the old name
    try:
        r = env.cli("deploy", "--yes", "--allow-served-name-change")
    finally:
        traffic.stop()
    print(r.stderr[-3000:])
    assert "breaking change: model.served_name changes from 'tiny-chat'" in r.stderr
    assert r.returncode == 6, r.stderr
    assert "analysis failed at 50%: canary 4xx share " in r.stderr and "answered 400/404/422) is " in r.stderr, r.stderr
    assert "analysis at 100%" not in r.stderr
    # the abort checked v1 under its own name: both hosts serve v1 again, both in the upstream, no problem left
    assert [env.current(n) for n in env.names] == [v1, v1]
    assert {env.release_served(n) for n in env.names} == {v1}
    hist = [h for h in env.history() if h["action"] == "deploy"][-1]
    assert hist["result"] == "aborted" and not hist.get("problems"), hist
    assert hist["verdict"]["canary"]["client_errors"] > 0 and hist["verdict"]["stable"]["client_errors"] == 0
    conf = env.upstream_conf()
    assert all(str(env.host(n)["server_port"]) in conf for n in env.names), conf

    # on purpose, the clients moved to the new name: promoted, v1 asleep as every host's standby
    traffic = Traffic(env.url, "tiny-chat-v2", workers=2, completion_workers=1).start()
    try:
        r = env.cli("deploy", "--yes", "--allow-served-name-change")
    finally:
        traffic.stop()
    assert r.returncode == 0, r.stderr[-3000:]
    v2 = env.current(env.names[0])
    assert v2 != v1 and [env.current(n) for n in env.names] == [v2, v2]
    assert [_via_router(env, "tiny-chat-v2") for _ in range(4)] == [(200, v2)] * 4
    r = env.cli("rollback", "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    phases = json.loads(r.stdout)["phases"]
    assert {n: phases["paths"][n]["path"] for n in env.names} == {n: "wake" for n in env.names}, phases
    assert not phases.get("wake_failed"), phases
    assert [env.current(n) for n in env.names] == [v1, v1]
    assert [_via_router(env, "tiny-chat") for _ in range(4)] == [(200, v1)] * 4


def _via_router(env, model: str) -> tuple[int, str | None]:
    r = httpx.post(env.url + "/v1/chat/completions", timeout=30,
                   json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    return r.status_code, r.headers.get("x-deployctl-release")
