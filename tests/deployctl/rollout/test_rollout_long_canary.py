"""A canary step longer than the lock's bound (issue 28: steps may pause 24 h), on a local fleet with the stand-in
engine and real nginx: the paused deploy's heartbeat keeps its lock fresh past DEPLOYCTL_LOCK_MAX_AGE_S (here 2 s,
for 6 h), so `status` shows it held and not stale, a second `deploy` is refused as in progress, and `deploy
--resume` from another shell refuses, naming the live deploy's pid, instead of breaking the lock and running a
second step machine on the same fleet. A deploy killed near the end of such a step and resumed waits only what is
left of the step's pause (the journal's ``pause`` point says when it began), and says so."""
from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from deployctl.demo.run import Traffic
from support.rollout import assert_consistent_on, rollout_state, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

HOUR = 3600


def _journal(env) -> list[dict]:
    p = Path(os.environ["DEPLOYCTL_STATE"]) / env.cfg["service"]["name"] / "journal.jsonl"
    return [json.loads(line) for line in p.read_text().splitlines()]


def _fleet(rollout_env):
    env = rollout_env(2, engine="standin", steps=[{"weight": 50, "pause": HOUR}, 100], pause_s=0,
                      analysis={"interval_s": 0.5, "min_requests": 1, "min_client_requests": 0,
                                "outputs": {"enabled": False}})
    env.make_local()
    return env


def _released_with_traffic(rollout_env):
    """The fleet on release 1 with client traffic running, deploy.yaml already changed for release 2."""
    env = _fleet(rollout_env)
    assert env.cli("deploy", "--yes").returncode == 0
    v1 = env.current(env.names[0])
    traffic = Traffic(env.url, "tiny-chat", workers=1, completion_workers=1).start()
    env.cfg["engine"]["max_num_seqs"] = 5
    env.write()
    return env, v1, traffic


def test_a_paused_deploy_keeps_its_lock_and_a_resume_beside_it_is_refused(rollout_env, monkeypatch):
    monkeypatch.setenv("DEPLOYCTL_LOCK_MAX_AGE_S", "2")  # the deploy's own bound, scaled to a test
    env, v1, traffic = _released_with_traffic(rollout_env)
    try:
        deploy = env.popen("deploy", "--yes")  # the operator's first shell: paused at 50% for an hour
        wait_for(lambda: rollout_state(env).get("weight") == 50 and rollout_state(env).get("status") == "running",
                 120, "the deploy at its 50% step", deploy)
        time.sleep(3)  # past the bound since the lock was taken
        lock = env.status()["lock"]
        assert lock and lock["pid"] == deploy.pid and not lock["stale"], lock
        r = env.cli("deploy", "--yes")
        assert r.returncode == 1 and "[in progress]" in r.stderr, r.stderr[-2000:]
        r = env.cli("deploy", "--resume")  # a second shell thinks the deploy died
        assert r.returncode == 1, r.stderr[-2000:]
        assert "the deploy that holds the lock on" in r.stderr and f"pid {deploy.pid} (deploy)" in r.stderr, r.stderr[-2000:]
        assert "nothing to resume" in r.stderr and "rollout watch" in r.stderr, r.stderr[-2000:]
        kinds = [(x["kind"], x.get("step")) for x in _journal(env)]
        assert kinds.count(("begin", "weight:0")) == 1 and ("resume", None) not in kinds, kinds
        assert deploy.poll() is None  # the first deploy goes on
        assert env.cli("promote").returncode == 0
        _, err = deploy.communicate(timeout=120)
        assert deploy.returncode == 0, err[-3000:]
    finally:
        traffic.stop()
    v2 = env.current(env.names[0])
    assert v2 != v1
    assert_consistent_on(env, v2)
    _, failed = traffic.snapshot()
    assert not failed, dict(failed)


def test_a_resumed_step_waits_only_what_is_left_of_its_pause(rollout_env):
    env, v1, traffic = _released_with_traffic(rollout_env)
    try:
        deploy = env.popen("deploy", "--yes")
        wait_for(lambda: any(r.get("what") == "window" and r.get("result") == "pass" for r in _journal(env)), 120,
                 "a passed analysis window in the 50% step", deploy)
        deploy.send_signal(signal.SIGKILL)
        deploy.wait(timeout=30)
        # as if the deploy had been killed 8 s before its hour at 50% ended: the pause began an hour ago, less 8 s
        path = Path(os.environ["DEPLOYCTL_STATE"]) / env.cfg["service"]["name"] / "journal.jsonl"
        recs = _journal(env)
        pause = next(r for r in recs if r.get("what") == "pause")
        assert pause["pause_s"] == HOUR and pause["weight"] == 50, pause
        pause["began"] -= HOUR - 8
        path.write_text("".join(json.dumps(r) + "\n" for r in recs))
        r = env.cli("deploy", "--resume", timeout=120)  # the whole hour again would time out here
        assert r.returncode == 0, r.stderr[-3000:]
    finally:
        traffic.stop()
    m = re.search(r"step 1 \(50%\): (\d+)s of its 1h pause left \(it began [^)]+\); (\d+) analysis window", r.stderr)
    assert m and int(m.group(1)) <= 8 and int(m.group(2)) >= 1, r.stderr[-3000:]
    assert "resuming " in r.stderr and "from the journal at weight step 1/2 (50%)" in r.stderr, r.stderr[-3000:]
    v2 = env.current(env.names[0])
    assert v2 != v1
    assert_consistent_on(env, v2)
    kinds = [(x["kind"], x.get("step") or x.get("what")) for x in _journal(env)]
    assert kinds.count(("point", "pause")) == 1 and kinds[-1] == ("finish", None), kinds  # the pause kept its start
    _, failed = traffic.snapshot()
    assert not failed, dict(failed)
