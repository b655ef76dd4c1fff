"""Acceptance (issue 8): sshd stopped on the canary host mid-rollout: the deploy aborts (exit 6) naming the host,
the other host still serves the previous release through nginx, status still answers; once sshd is back, rollback
makes the fleet consistent again."""
from __future__ import annotations

import time

import httpx
import pytest

from deployctl.demo import Traffic
from rollout_env import rollout_state, wait_for

pytestmark = pytest.mark.slow


def test_ssh_failure_mid_rollout_aborts_and_stable_keeps_serving(rollout_env):
    env = rollout_env(2, steps=[10, 100], pause_s=600, analysis={"interval_s": 2, "min_requests": 5})
    r = env.cli("deploy", "--yes")
    assert r.returncode == 0, r.stderr
    v1 = env.current(env.names[0])
    canary, stable = env.names
    traffic = Traffic(env.url, "tiny-chat", workers=1, completion_workers=1).start()
    try:
        deploy = env.popen("deploy", "--yes", "--canary", "10")
        wait_for(lambda: rollout_state(env).get("release") != v1 and rollout_state(env).get("weight") == 10,
                 240, "the canary at 10%", deploy)
        t0 = time.monotonic()
        env.fleet.stop(canary)
        _, err = deploy.communicate(timeout=120)
        print(f"\nsshd stopped on {canary}: deploy exited {deploy.returncode} after {time.monotonic() - t0:.1f} s: "
              f"{err.strip().splitlines()[-1][:300]}")
        assert deploy.returncode == 6, err
        last = err.strip().splitlines()[-1]
        assert "rollout aborted" in last and canary in last and f"traffic back on {v1}" in last
        conf = env.upstream_conf()
        assert str(env.host(canary)["server_port"]) not in conf  # could not be put back: out of the upstream
        for _ in range(50):
            resp = httpx.get(env.url + "/v1/models", timeout=10)
            assert resp.status_code == 200 and resp.headers["x-deployctl-release"] == v1
        st = env.status()
        rows = {h["host"]: h for h in st["hosts"]}
        assert rows[stable]["current_release"] == v1 and rows[stable]["healthy"] and rows[stable]["weight"] == 100.0
        assert "unreachable" in rows[canary]["detail"]
        assert st["rollout"]["status"] == "aborted"

        env.fleet.start(canary)
        r = env.cli("rollback", "--to", "20000101T000000Z-notthere")
        assert r.returncode == 1 and "release 20000101T000000Z-notthere is not on" in r.stderr
        r = env.cli("rollback", "--to", v1)
        assert r.returncode == 0, r.stderr
        assert [env.current(n) for n in env.names] == [v1, v1]
        assert {env.release_served(n) for n in env.names} == {v1}
        assert "down" not in env.upstream_conf() and "weight=" not in env.upstream_conf()
    finally:
        traffic.stop()
    ok, failed = traffic.snapshot()
    print(f"traffic: {dict(ok)}; failed {dict(failed)}; retried {traffic.retried}")
    assert not failed
