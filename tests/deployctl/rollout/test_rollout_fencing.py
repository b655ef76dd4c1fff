"""Fencing (issue 41) on the sshd fleet with real nginx and the stand-in engine: a detached runner stopped with
SIGSTOP (the test hook DEPLOYCTL_TEST_STOP_AT stops it right after it journals the start of its 50% step, so that
its next act is a router switch) is taken over by `rollback`, or by `deploy --resume` once its lease expired; when
it is continued (SIGCONT) it changes nothing, neither nginx, nor the hosts' engines and releases, nor the state files,
and exits 7 naming who took over."""
from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from support.rollout import assert_consistent_on, rollout_state, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

LEASE_S = 10
STOP_AT = {"DEPLOYCTL_TEST_STOP_AT": "begin:weight:0"}


def _control(env) -> Path:
    return Path(os.environ["DEPLOYCTL_STATE"]) / env.cfg["service"]["name"]


def _stopped(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
    except OSError:
        return False


def _snapshot(env) -> dict:
    """What a ghost must not change: nginx's upstream conf and split, each host's release link, the release its
    engine serves and its pidfiles, every state file on every host."""
    snap = {"nginx": env.upstream_conf(), "split": Path(env.nginx.upstream_conf.as_posix() + ".state.json").read_text()}
    for n in env.names:
        root = Path(env.host(n)["deploy_root"])
        snap[n] = {"current": env.current(n), "served": env.release_served(n),
                   "pids": {p.name: p.read_text() for p in sorted((root / "shared" / "run").glob("*.pid"))},
                   "state": {p.name: p.read_text() for p in sorted((root / "state").iterdir())
                             if p.name != "lock"}}
    return snap


def _start_stopped_canary(env):
    """Deploy v1, then v2 detached; returns (v1, the runner's pid) once the runner stopped itself at its 50% step."""
    assert env.cli("deploy", "--yes").returncode == 0
    v1 = env.current(env.names[0])
    env.cfg["engine"]["max_num_seqs"] = 6  # v2: another config
    env.write()
    r = env.cli("deploy", "--detach", "--yes", env=STOP_AT, timeout=60)
    assert r.returncode == 0, r.stderr
    runner = int((_control(env) / "runner.pid").read_text())
    wait_for(lambda: _stopped(runner), 240, "the detached runner stopped at its 50% step")
    return v1, runner


def _continue_ghost(env, runner: int, before: dict) -> str:
    """SIGCONT the stopped runner, wait for its exit code; it must be 7 and nothing may have changed."""
    os.kill(runner, signal.SIGCONT)
    f = _control(env) / "runner.exit"
    wait_for(lambda: f.exists(), 60, "the continued runner's exit")
    log = (_control(env) / "runner.log").read_text()
    assert f.read_text().strip() == "7", log[-3000:]
    assert _snapshot(env) == before
    return log


def test_runner_stopped_in_its_canary_continued_after_a_rollback_changes_nothing(rollout_env, monkeypatch):
    monkeypatch.setenv("DEPLOYCTL_LOCK_MAX_AGE_S", "600")  # the rollback takes the live lock over after its grace
    env = rollout_env(2, engine="standin", steps=[{"weight": 50, "pause": 600}, {"weight": 100, "pause": 0}],
                      analysis={"interval_s": 1, "min_requests": 1, "min_client_requests": 1})
    v1, runner = _start_stopped_canary(env)
    try:
        r = env.cli("rollback", timeout=300)
        assert r.returncode == 0, r.stderr
        assert_consistent_on(env, v1)
        assert rollout_state(env)["status"] == "rolled_back"
        before = _snapshot(env)
    except BaseException:
        os.kill(runner, signal.SIGCONT)
        raise
    took = [h for h in env.history() if h.get("action") == "takeover"]
    assert took and took[-1]["by"] == "rollback" and f"pid {runner}" in took[-1]["reason"], took
    log = _continue_ghost(env, runner, before)
    assert "taken over by rollback of" in log and "refused" in log, log[-3000:]
    assert_consistent_on(env, v1)


def test_resume_takes_over_a_stopped_runner_once_its_lease_expired(rollout_env, monkeypatch):
    monkeypatch.setenv("DEPLOYCTL_LOCK_MAX_AGE_S", str(LEASE_S))  # a stopped runner's lease
    env = rollout_env(2, engine="standin", steps=[{"weight": 50, "pause": 600}, {"weight": 100, "pause": 0}],
                      analysis={"interval_s": 1, "min_requests": 1, "min_client_requests": 1})
    v1, runner = _start_stopped_canary(env)
    try:
        r = env.cli("deploy", "--resume", timeout=60)  # at once: refused while the lease runs, saying the runner
        assert r.returncode == 1, r.stderr  # is stopped, not that it "still runs"
        assert f"(pid {runner}) is stopped (SIGSTOP)" in r.stderr and "still runs" not in r.stderr, r.stderr
        assert "its lease expires" in r.stderr and f"kill -CONT {runner}" in r.stderr, r.stderr
        r = env.cli("deploy", "--resume", "--detach", timeout=60)  # a second runner is never spawned beside it
        assert r.returncode == 1 and f"is stopped (SIGSTOP) as pid {runner}" in r.stderr, r.stderr
        env.cfg["engine"]["max_num_seqs"] = 4  # deploy.yaml changed: the resume rolls back
        env.write()
        wait_for(lambda: all(i for i in _lock_ages(env)), 60, "the stopped runner's lease expired")
        r = env.cli("deploy", "--resume", timeout=300)
        assert r.returncode == 6, r.stderr
        assert "cannot continue" in r.stderr and f"traffic back on {v1}" in r.stderr, r.stderr[-3000:]
        assert_consistent_on(env, v1)
        before = _snapshot(env)
    except BaseException:
        os.kill(runner, signal.SIGCONT)
        raise
    took = [h for h in env.history() if h.get("action") == "takeover"]
    assert took and took[-1]["by"] == "deploy" and f"pid {runner}" in took[-1]["reason"], took
    assert "no heartbeat" in took[-1]["reason"], took
    log = _continue_ghost(env, runner, before)
    assert "taken over by deploy of" in log, log[-3000:]


def _lock_ages(env) -> list[bool]:
    """Per host: whether its lock file's heartbeat is older than the lease (True when there is no lock)."""
    import time

    out = []
    for n in env.names:
        p = Path(env.host(n)["deploy_root"]) / "state" / "lock"
        try:
            out.append(time.time() - p.stat().st_mtime > LEASE_S + 1)
        except FileNotFoundError:
            out.append(True)
    return out
