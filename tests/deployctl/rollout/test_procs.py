"""A pid counts as a deploy's runner only while its command line says so (deployctl.rollout.procs), on real
processes: a stranger that got the number in runner.pid (the kernel reuses pids) makes neither `deploy --detach`
refuse nor `rollout watch` wait, nor `status` call the killed deploy alive; the runner of another service is not
this one's; a live runner is."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from deployctl.rollout import detach, journal, procs
from deployctl.rollout.state import RolloutState
from deployctl.rollout.status import journal_status
from support.runner import runner_like

SLEEP = "import time; time.sleep(60)"


@pytest.fixture
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("DEPLOYCTL_STATE", str(tmp_path / "state"))
    monkeypatch.setenv("DEPLOYCTL_DETACH", "process")
    monkeypatch.delenv("DEPLOYCTL_TEST_KILL_AT", raising=False)
    return tmp_path


class _Cfg:
    class service:
        name = "svc"


def test_a_stranger_with_the_runners_pid_is_not_the_runner(state):
    stranger = subprocess.Popen([sys.executable, "-c", SLEEP])
    try:
        f = detach.files("svc")
        f.dir.mkdir(parents=True)
        f.pid.write_text(f"{stranger.pid}\n")  # the runner was killed; the kernel gave its number away
        assert procs.pid_running(stranger.pid) and not procs.is_runner(stranger.pid, "svc")
        assert detach.runner_pid("svc") is None
        t0 = time.monotonic()
        with pytest.raises(detach.RunnerDied):  # not "still runs" until the stranger ends
            detach.watch("svc", lambda line: None, timeout_s=30)
        print(f"\nwatch said the runner died after {time.monotonic() - t0:.2f} s")
        # the journal's deploy process is the stranger's number: status calls the deploy gone and resumable
        journal.Journal("svc").start({"release": {"id": "R2"}, "pid": stranger.pid})
        st = RolloutState(release="R2", status="running", pid=stranger.pid)
        jr = journal_status(_Cfg, st)
        assert jr["runner_alive"] is False and jr["resumable"] is True, jr
        # deploy --detach is not refused: the spawn goes ahead (a runner that exits at once)
        pid, _, how = detach.spawn("svc", ["--version"])
        assert pid != stranger.pid and how == "process"
    finally:
        stranger.kill()
        stranger.wait()


def test_a_live_runner_is_the_runner_and_only_of_its_service(state):
    runner = runner_like(state, "svc", SLEEP)
    other = runner_like(state / "o", "svc-2", SLEEP)
    try:
        time.sleep(0.3)  # exec'd: its command line is the runner's
        f = detach.files("svc")
        f.dir.mkdir(parents=True)
        f.pid.write_text(f"{runner.pid}\n")
        assert detach.runner_pid("svc") == runner.pid
        with pytest.raises(detach.RunnerBusy, match=f"runs as pid {runner.pid}"):
            detach.spawn("svc", ["--version"])
        st = RolloutState(release="R2", status="running", pid=runner.pid)
        journal.Journal("svc").start({"release": {"id": "R2"}, "pid": runner.pid})
        assert journal_status(_Cfg, st)["runner_alive"] is True
        f.pid.write_text(f"{other.pid}\n")  # svc-2's runner is not svc's
        assert detach.runner_pid("svc") is None
        journal.Journal("svc").start({"release": {"id": "R2"}, "pid": other.pid})
        assert journal_status(_Cfg, st)["runner_alive"] is False
    finally:
        for p in (runner, other):
            p.kill()
            p.wait()


@pytest.mark.parametrize("argv, args", [
    (["/usr/bin/python3", "-m", "deployctl", "deploy", "--runner", "s"], ["deploy", "--runner", "s"]),
    (["/venv/bin/python", "/venv/bin/deployctl", "--debug", "deploy"], ["--debug", "deploy"]),
    (["/usr/bin/python3", "-c", "deployctl"], None),
    (["sleep", "60"], None),
])
def test_deployctl_command_lines(argv, args):
    assert procs.deployctl_args(argv) == args


def test_resume_refuses_while_the_detached_runner_runs_naming_it(state):
    """`deploy --resume` beside a live runner would start a second step machine on the same fleet: refused before
    it touches any host, naming the runner's pid and what to do instead."""
    from deployctl.rollout.resume import take_lock

    class Cfg:
        class service:
            name = "svc"

    runner = runner_like(state, "svc", SLEEP)
    try:
        time.sleep(0.3)
        f = detach.files("svc")
        f.dir.mkdir(parents=True)
        f.pid.write_text(f"{runner.pid}\n")
        class Fleet:  # the hosts hold no lock of the runner's: its lease has not expired, nothing is taken over
            def inspect_lock(self):
                return []

            def lock(self, *a, **k):
                raise AssertionError("a live runner's lock was taken")

        with pytest.raises(detach.RunnerBusy) as e:
            take_lock(Fleet(), Cfg)  # refused before any lock is taken
        assert f"still runs as pid {runner.pid}" in e.value.message and "nothing to resume" in e.value.message
        assert "rollout watch" in e.value.fix and "abort" in e.value.fix
    finally:
        runner.kill()
        runner.wait()


def test_rollout_watch_timeout_exits_1_and_leaves_the_runner_running(state):
    runner = runner_like(state, "svc", SLEEP)
    try:
        time.sleep(0.3)  # exec'd: its command line is the runner's
        f = detach.files("svc")
        f.dir.mkdir(parents=True)
        f.pid.write_text(f"{runner.pid}\n")
        f.log.write_text("step 1/2\n")
        cfg = state / "deploy.yaml"
        cfg.write_text(f"service: {{name: svc}}\nmodel: {{path: /m}}\n"
                       f"hosts: [{{name: a, address: local, deploy_root: {state}/a}}]\n")
        r = subprocess.run([sys.executable, "-m", "deployctl", "rollout", "watch", "--timeout", "1", "-c", str(cfg)],
                           capture_output=True, text=True, timeout=60, env={**os.environ})
        assert r.returncode == 1, r.stderr
        assert "step 1/2" in r.stderr and f"the detached rollout (pid {runner.pid}) still runs after 1 s" in r.stderr
        assert runner.poll() is None  # the watch ended, the rollout goes on
    finally:
        runner.kill()
        runner.wait()
