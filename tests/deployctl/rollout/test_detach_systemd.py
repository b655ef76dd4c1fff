"""`deploy --detach` through a systemd transient unit (issue 28): with DEPLOYCTL_DETACH=systemd the runner is
started by `systemd-run` (unit deployctl-rollout-<service>.service, --collect, output appended to runner.log),
deployctl's environment reaches it through a 0600 EnvironmentFile= (a secret with quotes, $ and backslashes arrives
exactly, and is on no command line), the runner writes its own pid and deletes the env file, and `rollout watch`
follows it to exit 0 on the sshd fleet with the stand-in engine and real nginx. A manager that refuses the unit is
an error naming the unit and DEPLOYCTL_DETACH=process; no systemd-run at all is an error too.

This machine's init is not systemd, so `systemd-run` is a stand-in (tests/support/standin_systemd_run.py) that
takes only the options deployctl passes, parses the env file by systemd.exec(5)'s rules and starts the command as
a transient service would. Whether a real manager keeps the runner past logout is systemd's, and not tested here."""
from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

from deployctl.demo.run import Traffic
from deployctl.errors import DeployctlError
from deployctl.rollout import detach
from support.rollout import assert_consistent_on, rollout_state, wait_for

SECRET = 'tok"en$HOME\\x`id`'


@pytest.fixture
def systemd_run(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = Path(__file__).resolve().parents[2] / "support" / "standin_systemd_run.py"
    (bin_dir / "systemd-run").write_text(f"#!/bin/sh\nexec {sys.executable} {script} \"$@\"\n")
    (bin_dir / "systemd-run").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    record = tmp_path / "systemd-run.json"
    monkeypatch.setenv("STANDIN_SYSTEMD_RECORD", str(record))
    return record


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_detached_deploy_runs_in_a_transient_unit_and_is_watched_to_exit_0(rollout_env, systemd_run,
                                                                              monkeypatch):
    env = rollout_env(2, engine="standin")
    monkeypatch.setenv("DEPLOYCTL_DETACH", "systemd")
    monkeypatch.setenv("DEPLOYCTL_TEST_SECRET", SECRET)
    r = env.cli("deploy", "--detach", "--yes", timeout=60)
    assert r.returncode == 0, r.stderr
    unit = "deployctl-rollout-chat-tiny.service"
    assert f"(systemd unit {unit})" in r.stdout, r.stdout
    rec = json.loads(systemd_run.read_text())
    control = Path(os.environ["DEPLOYCTL_STATE"]) / "chat-tiny"
    assert f"--unit={unit}" in rec["argv"] and "--collect" in rec["argv"]
    assert ("--user" in rec["argv"]) == (os.geteuid() != 0)
    assert rec["properties"]["EnvironmentFile"] == str(control / "runner.env") and rec["env_file_mode"] == "0o600"
    assert rec["properties"]["StandardOutput"] == f"append:{control / 'runner.log'}"
    assert rec["env"]["DEPLOYCTL_TEST_SECRET"] == SECRET  # quotes, $, backslash and backquotes arrive as they were
    assert not any("tok" in a for a in rec["argv"])  # the environment is on no command line
    assert rec["argv"][rec["argv"].index("--") + 1:][-3:] == ["--yes", "--runner", "chat-tiny"]
    # the runner wrote its own pid (it is not deployctl's child) and deleted the env file
    assert int((control / "runner.pid").read_text()) == rec["pid"]
    watch = env.cli("rollout", "watch", timeout=300)
    assert watch.returncode == 0, watch.stderr[-3000:]
    assert not (control / "runner.env").exists()
    assert (control / "runner.exit").read_text().strip() == "0"
    release = env.current(env.names[0])
    assert release and f"release {release} serves all traffic" in watch.stderr, watch.stderr[-2000:]
    assert_consistent_on(env, release)


def test_a_refused_unit_or_no_systemd_run_is_an_error_naming_the_way_out(tmp_path, monkeypatch, systemd_run):
    monkeypatch.setenv("DEPLOYCTL_STATE", str(tmp_path / "state"))
    monkeypatch.setenv("DEPLOYCTL_DETACH", "systemd")
    monkeypatch.setenv("STANDIN_SYSTEMD_FAIL", "Failed to connect to bus: No medium found")
    with pytest.raises(DeployctlError) as e:
        detach.spawn("svc", ["--version"])
    assert "systemd-run could not start deployctl-rollout-svc.service: Failed to connect to bus" in e.value.message
    assert "DEPLOYCTL_DETACH=process" in e.value.fix
    assert not (tmp_path / "state" / "svc" / "runner.env").exists()  # the environment is not left on disk
    monkeypatch.setenv("DEPLOYCTL_DETACH", "auto")  # auto: where systemd is not init, the process path
    assert detach.manager() == ("systemd" if os.path.isdir("/run/systemd/system") else "process")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("DEPLOYCTL_DETACH", "systemd")
    with pytest.raises(DeployctlError, match="systemd-run is not on PATH"):
        detach.manager()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_runner_killed_in_its_unit_is_restarted_and_resumes_the_deploy(rollout_env, systemd_run, monkeypatch):
    """Issue 28 audit 3: the unit restarts a runner killed by a signal (Restart=on-failure, deployctl's own exit
    codes excluded, a start limit); its first start was the fresh deploy, the restart finds its spawn's token in the
    unfinished journal and resumes from it, `rollout watch` follows it across the restart, and the deploy finishes.
    A local fleet (address: local) with the stand-in engine and real nginx: the restart is the point here."""
    env = rollout_env(2, engine="standin", steps=[{"weight": 50, "pause": 600}, 100], pause_s=0,
                      analysis={"interval_s": 0.5, "min_requests": 1, "min_client_requests": 0,
                                "outputs": {"enabled": False}})
    env.make_local()
    assert env.cli("deploy", "--yes").returncode == 0
    v1 = env.current(env.names[0])
    env.cfg["engine"]["max_num_seqs"] = 5
    env.write()
    control = Path(os.environ["DEPLOYCTL_STATE"]) / "chat-tiny"
    traffic = Traffic(env.url, "tiny-chat", workers=1, completion_workers=1).start()
    try:
        monkeypatch.setenv("DEPLOYCTL_DETACH", "systemd")
        r = env.cli("deploy", "--detach", "--yes", timeout=60)
        assert r.returncode == 0, r.stderr
        props = json.loads(systemd_run.read_text())["properties"]
        assert props["Restart"] == "on-failure" and props["RestartPreventExitStatus"] == "1 2 3 4 5 6 7 130", props
        assert int(props["StartLimitBurst"]) >= 2 and float(props["RestartSec"]) > 0, props
        token = json.loads((control / "runner.json").read_text())["token"]
        first = json.loads(systemd_run.read_text())["pid"]
        watch = env.popen("rollout", "watch")
        wait_for(lambda: any(x.get("what") == "window" for x in _journal(control)), 120,
                 "the detached deploy's first analysis window at 50%")
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: len(json.loads(systemd_run.read_text()).get("pids", [])) == 2, 60, "the unit's restart")
        second = json.loads(systemd_run.read_text())["pids"][1]
        wait_for(lambda: rollout_state(env).get("pid") == second and rollout_state(env).get("weight") == 50
                 and rollout_state(env).get("status") == "running", 120, "the restarted runner back at 50%")
        assert int((control / "runner.pid").read_text()) == second
        assert env.cli("promote").returncode == 0
        out, err = watch.communicate(timeout=300)
        assert watch.returncode == 0, err[-3000:]
    finally:
        traffic.stop()
    v2 = env.current(env.names[0])
    assert v2 != v1
    assert f"restarted as pid {second}" in err and "continuing the deploy from its journal" in err, err[-3000:]
    assert f"resuming {v2} from the journal at weight step 1/2 (50%)" in err and f"release {v2} serves all traffic" in err
    marks = [(x["kind"], x.get("runner")) for x in _journal(control) if x["kind"] in ("start", "resume")]
    assert marks == [("start", token), ("resume", token)], marks
    # watch ends at runner.exit; the process itself exits a moment later, and only then does the unit record it
    wait_for(lambda: len(json.loads(systemd_run.read_text()).get("ends", [])) == 2, 30, "the restarted runner's end")
    rec = json.loads(systemd_run.read_text())
    assert rec["ends"] == [-signal.SIGKILL, 0] and "failed" not in rec, rec
    assert (control / "runner.exit").read_text().strip() == "0" and not (control / "runner.env").exists()
    assert_consistent_on(env, v2)
    _, failed = traffic.snapshot()
    assert not failed, dict(failed)


def _journal(control: Path) -> list[dict]:
    p = control / "journal.jsonl"
    return [json.loads(line) for line in p.read_text().splitlines()] if p.exists() else []
