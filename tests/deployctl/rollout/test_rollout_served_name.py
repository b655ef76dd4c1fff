"""Issue 41 on a stand-in fleet (sshd hosts, nginx): a release that changes model.served_name. deploy names the
breaking change and refuses it without --allow-served-name-change (exit 2, nothing changed, the fix in the
message); allowed, the canary answers 404 to every client still sending the old name, and the window fails on
the canary's 4xx share against stable's (not "0 errors", not promoted); the abort verifies the old release under
its own served name, so the canary host is back on it, serving and in the upstream."""
from __future__ import annotations

import pytest

from deployctl.demo.run import Traffic

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_served_name_change_is_refused_then_its_404s_fail_the_canary_and_the_abort_restores(rollout_env):
    env = rollout_env(2, engine="standin", steps=[{"weight": 50, "pause": "20s"}, 100],
                      analysis={"interval_s": 2, "min_requests": 5, "outputs": {"enabled": False},
                                "probes": {"enabled": False}})
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
