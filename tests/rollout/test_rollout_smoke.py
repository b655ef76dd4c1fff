"""First deploy, a second deploy (canary, no pause), status, history, rollback on two sshd hosts."""
from __future__ import annotations

import httpx


def test_deploy_twice_and_rollback(rollout_env):
    env = rollout_env(2)
    r = env.cli("deploy", "--yes")
    assert r.returncode == 0, r.stderr
    v1 = env.current(env.names[0])
    print(r.stderr)
    assert v1 and env.current(env.names[1]) == v1
    resp = httpx.get(env.url + "/v1/models", timeout=10)
    assert resp.status_code == 200 and resp.headers["x-deployctl-release"] == v1
    r = env.cli("deploy", "--yes", "--canary", "5")
    print(r.stderr)
    assert r.returncode == 0, r.stderr
    v2 = env.current(env.names[0])
    assert v2 != v1 and env.current(env.names[1]) == v2
    st = env.status()
    assert [h["current_release"] for h in st["hosts"]] == [v2, v2]
    assert all(h["healthy"] for h in st["hosts"])
    r = env.cli("rollback")
    print(r.stderr)
    assert r.returncode == 0, r.stderr
    assert env.current(env.names[0]) == v1 == env.current(env.names[1])
    assert httpx.get(env.url + "/v1/models", timeout=10).headers["x-deployctl-release"] == v1
