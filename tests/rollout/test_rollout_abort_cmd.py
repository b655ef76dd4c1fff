"""`deployctl abort` from a second shell during a canary pause, and Ctrl-C (SIGINT) of a deploy: both leave every
host on the previous release with all traffic on it, the lock released, and the story in history."""
from __future__ import annotations

import signal

import pytest

from rollout_env import rollout_state, wait_for

pytestmark = pytest.mark.slow


def _canary_running(env, before):
    st = rollout_state(env)
    return st.get("release") != before and st.get("weight") == 10 and st.get("status") == "running"


def _consistent_on(env, release):
    assert [env.current(n) for n in env.names] == [release] * len(env.names)
    assert {env.release_served(n) for n in env.names} == {release}
    conf = env.upstream_conf()
    assert "down" not in conf and "weight=" not in conf


def test_abort_command_and_ctrl_c(rollout_env):
    env = rollout_env(2, steps=[10, 100], pause_s=600, analysis={"interval_s": 2, "min_requests": 5})
    r = env.cli("deploy", "--yes")
    assert r.returncode == 0, r.stderr
    v1 = env.current(env.names[0])

    deploy = env.popen("deploy", "--yes", "--canary", "10")
    wait_for(lambda: _canary_running(env, v1), 240, "the canary at 10%", deploy)
    r = env.cli("abort")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("aborted"), r.stdout
    _, err = deploy.communicate(timeout=60)
    assert deploy.returncode == 6, err
    assert "rollout aborted: aborted by" in err.strip().splitlines()[-1]
    _consistent_on(env, v1)

    deploy = env.popen("deploy", "--yes", "--canary", "10")
    wait_for(lambda: _canary_running(env, v1), 240, "the second canary at 10%", deploy)
    deploy.send_signal(signal.SIGINT)
    _, err = deploy.communicate(timeout=120)
    assert deploy.returncode == 130, err
    last = err.strip().splitlines()[-1]
    assert f"deploy interrupted: traffic back on {v1}" in last and "deployctl status" in last
    _consistent_on(env, v1)
    st = env.status()
    assert st["lock"] is None and st["rollout"]["status"] == "interrupted"
    results = [(h["action"], h["result"]) for h in env.history()]
    assert ("deploy", "aborted") in results and ("deploy", "interrupted") in results

    r = env.cli("promote")
    assert r.returncode == 0 and "no rollout in progress" in r.stdout
