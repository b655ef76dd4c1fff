"""Issue 39: a stopped engine is gone. launch.sh (the process launcher) run for real against a stand-in engine whose
two workers ignore SIGTERM, one of them in a session of its own (setsid, as engines' worker pools may do): after
`launch.sh stop`, after a `kill -9` of the supervisor and a new `launch.sh start`, after a `kill -9` of the main
engine process, and after deployctl's own stop (launcher.stop), none of the engine's processes is left (/proc). The
engine is found by the marker launch.sh puts in its environment (DEPLOYCTL_INSTANCE / DEPLOYCTL_INSTANCE_PORT);
a process of another deploy root (the replica root below this one) with the same kind of marker is never touched.
`launch.sh stop` also stops the standby asleep on the other port."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from support.render import API_KEY, local_release

# Stands in for `python -m deployctl_runtime serve --config X`: starts two workers that ignore SIGTERM (one in the
# runtime's process group, one in a session of its own), records every pid, then serves until SIGTERM (exit 0 at
# once, leaving the workers: a drain that forgot its pool) or, with FAKE_WEDGED, ignores SIGTERM too.
FAKE_ENGINE = r"""#!/bin/bash
n=$(( $(cat "$FAKE_STATE/starts" 2>/dev/null || echo 0) + 1 )); echo "$n" > "$FAKE_STATE/starts"
echo $$ >> "$FAKE_STATE/pids"; echo $$ > "$FAKE_STATE/main.$n"
( trap '' TERM; echo $BASHPID >> "$FAKE_STATE/pids"; exec sleep 600 ) &
setsid bash -c 'trap "" TERM; echo $$ >> "$FAKE_STATE/pids"; echo $$ > "$FAKE_STATE/session-worker.'$n'"; exec sleep 600' &
if [ -n "${FAKE_WEDGED:-}" ]; then trap 'echo ignoring SIGTERM' TERM; else trap 'echo drained; exit 0' TERM; fi
while [ ! -s "$FAKE_STATE/session-worker.$n" ]; do sleep 0.02; done
touch "$FAKE_STATE/ready.$n"
while :; do sleep 0.05; done
"""


def _alive(pid: int) -> bool:
    """A live process (a zombie holds no memory and is not counted)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _wait_for(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"{what} within {timeout} s"
        time.sleep(0.05)


@pytest.fixture
def rel(tmp_path):
    root = tmp_path / "root"
    fake = tmp_path / "fake-python"
    fake.write_text(FAKE_ENGINE)
    fake.chmod(0o755)
    cfg, rdir = local_release(root, str(fake), api_key=API_KEY)
    state = tmp_path / "state"
    state.mkdir()
    env = {**os.environ, "FAKE_STATE": str(state), "DEPLOYCTL_LAUNCH_BACKOFF_S": "0.1",
           "DEPLOYCTL_LAUNCH_STOP_TIMEOUT_S": "2"}
    for k in ("DEPLOYCTL_INSTANCE", "DEPLOYCTL_INSTANCE_PORT"):
        env.pop(k, None)
    d = {"root": root, "launch": str(rdir / "launch.sh"), "state": state, "env": env, "cfg": cfg,
         "run": root / "shared/run", "log": root / "shared/logs/runtime.log"}
    yield d
    for pid in _pids(d) + _supervisors(d):  # never leave a process behind, even when the test failed
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _pids(d) -> list[int]:
    f = d["state"] / "pids"
    return [int(x) for x in f.read_text().split()] if f.exists() else []


def _supervisors(d) -> list[int]:
    out = []
    for f in d["run"].glob("runtime*.pid") if d["run"].exists() else []:
        try:
            out.append(int(f.read_text().strip()))
        except (OSError, ValueError):
            pass
    return out


def _launch(d, *args, env=None, timeout=60):
    return subprocess.run([d["launch"], *args], capture_output=True, text=True, env=env or d["env"], timeout=timeout)


def _start(d, n: int = 1, env=None) -> int:
    r = _launch(d, "start", env=env)
    assert r.returncode == 0, r.stderr
    _wait_for(lambda: (d["state"] / f"ready.{n}").exists(), 30, f"engine start {n}")
    return int(r.stdout.strip())


def _survivors(pids) -> list[int]:
    return [p for p in pids if _alive(p)]


def test_launch_sh_stop_leaves_no_worker_even_one_in_its_own_session(rel):
    sup = _start(rel)
    engine = _pids(rel)
    assert len(engine) == 3 and all(_alive(p) for p in engine)
    worker = int((rel["state"] / "session-worker.1").read_text())
    assert os.getsid(worker) == worker != os.getsid(sup)  # it left the supervisor's session: no group kill reaches it
    environ = Path(f"/proc/{worker}/environ").read_bytes().split(b"\0")
    assert f"DEPLOYCTL_INSTANCE={rel['root']}".encode() in environ and b"DEPLOYCTL_INSTANCE_PORT=8080" in environ

    r = _launch(rel, "stop")
    assert r.returncode == 0, r.stderr
    assert _survivors(engine + [sup]) == []
    log = rel["log"].read_text()
    assert "killed leftovers of the engine on port 8080 after" in log and f"{worker} (sleep)" in log, log[-2000:]
    assert _launch(rel, "status").returncode == 1


def test_kill_9_of_the_supervisor_then_start_ends_the_old_engine_first(rel):
    sup = _start(rel)
    old = _pids(rel)
    os.kill(sup, signal.SIGKILL)
    time.sleep(0.3)
    assert _survivors(old) == old  # the engine and both workers outlive their supervisor: orphans

    sup2 = _start(rel, 2)
    assert sup2 != sup
    assert _survivors(old) == []  # the new start ended them before starting the engine again
    new = [p for p in _pids(rel) if p not in old]
    assert len(new) == 3 and all(_alive(p) for p in new)
    assert "killed leftovers of the engine on port 8080" in rel["log"].read_text()

    r = _launch(rel, "stop")
    assert r.returncode == 0, r.stderr
    assert _survivors(_pids(rel) + [sup2]) == []


def test_kill_9_of_the_main_engine_process_restarts_without_its_orphans(rel):
    sup = _start(rel)
    main1 = int((rel["state"] / "main.1").read_text())
    old = _pids(rel)
    os.kill(main1, signal.SIGKILL)
    _wait_for(lambda: (rel["state"] / "ready.2").exists(), 30, "the restart")
    assert _survivors(old) == [] and _alive(sup)  # the workers of the killed runtime are gone before the restart
    assert "runtime exited with 137" in rel["log"].read_text()
    assert _launch(rel, "stop").returncode == 0
    assert _survivors(_pids(rel) + [sup]) == []


def test_deployctl_stop_reports_the_leftovers_it_killed_and_a_wedged_engine(rel):
    from deployctl.hosts import Host
    from deployctl.service.engine import Engine

    cfg = rel["cfg"]
    host = Host.from_config(cfg.hosts[0])
    try:
        # the supervisor killed (kill -9): its group's leader is gone, the engine and its session worker are not
        sup = _start(rel)
        os.kill(sup, signal.SIGKILL)
        time.sleep(0.2)
        old = _pids(rel)
        how = Engine(host, cfg).stop(timeout=3)
        assert how == "killed" and how.drained, how.detail
        worker = int((rel["state"] / "session-worker.1").read_text())
        assert f"{worker} (sleep)" in how.killed, how.killed
        assert _survivors(old) == []

        # a wedged engine (ignores SIGTERM): the drain bound passes, SIGKILL; the caller sees it did not drain
        env = {**rel["env"], "FAKE_WEDGED": "1", "DEPLOYCTL_LAUNCH_STOP_TIMEOUT_S": "30"}
        sup = _start(rel, 2, env=env)
        every = _pids(rel)
        how = Engine(host, cfg).stop(timeout=1.5)
        assert how == "killed" and not how.drained, how.detail
        assert "did not drain" in how.detail and how.killed
        assert _survivors(every + [sup]) == []

        # an engine that drains and leaves nothing: "stopped", nothing killed
        assert Engine(host, cfg).stop(timeout=3) == "not running"
    finally:
        host.close()


def test_launch_sh_stop_stops_the_standby_too_and_never_a_stranger(rel, tmp_path):
    sup = _start(rel)
    spare = 18123
    standby = _start(rel, 2, env={**rel["env"], "DEPLOYCTL_LAUNCH_PORT": str(spare)})
    assert standby != sup and (rel["run"] / f"runtime.{spare}.pid").read_text().strip() == str(standby)
    (rel["run"] / "standby.json").write_text(json.dumps({"release": "r0", "port": spare, "since": 0,
                                                        "expires_at": time.time() + 3600}, sort_keys=True))
    # strangers: a replica root below this one, and no marker at all
    replica = subprocess.Popen(["sleep", "300"], env={"DEPLOYCTL_INSTANCE": f"{rel['root']}/r1",
                                                      "DEPLOYCTL_INSTANCE_PORT": "8080"}, start_new_session=True)
    plain = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        every = _pids(rel)
        assert len(every) == 6
        r = _launch(rel, "stop")
        assert r.returncode == 0, r.stderr
        assert _survivors(every + [sup, standby]) == []
        assert not (rel["run"] / "standby.json").exists()
        assert "stopped the standby on port 18123" in rel["log"].read_text()
        assert replica.poll() is None and plain.poll() is None
    finally:
        for p in (replica, plain):
            p.kill()
            p.wait()


def test_standby_stop_command_stops_the_standby_inside_its_window_and_records_it(rel, tmp_path):
    """`deployctl standby stop --host NAME`: the standby (a launch.sh supervisor on the spare port, asleep in
    production) stops with every engine process of it, standby.json goes, history has a standby-stop record; the
    serving runtime on the configured port is untouched. An unknown --host is a usage error naming the hosts."""
    import yaml

    from support.cli import deployctl
    from support.render import config_dict

    spare = 18124
    doc = config_dict(engine={"device": "cpu"}, server={"bind": "127.0.0.1", "api_key_env": None},
                      hosts=[{"name": "h", "address": "local", "deploy_root": str(rel["root"]),
                              "python": rel["cfg"].hosts[0].python, "launcher": "process", "spare_port": spare}])
    deploy_yaml = tmp_path / "deploy.yaml"
    deploy_yaml.write_text(yaml.safe_dump(doc, sort_keys=False))
    sup = _start(rel)
    serving = _pids(rel)
    standby = _start(rel, 2, env={**rel["env"], "DEPLOYCTL_LAUNCH_PORT": str(spare)})
    sleeper = [p for p in _pids(rel) if p not in serving]
    (rel["run"] / "standby.json").write_text(json.dumps({"release": "r0", "port": spare, "since": time.time(),
                                                        "expires_at": time.time() + 3600}, sort_keys=True))

    r = deployctl("standby", "stop", "-c", str(deploy_yaml), "--host", "nope")
    assert r.returncode == 2 and "--host 'nope' is not a host of deploy.yaml (h)" in r.stderr, r.stderr

    r = deployctl("standby", "stop", "-c", str(deploy_yaml), "--host", "h", "--reason", "RAM wanted", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["hosts"] == [{"host": "h", "release": "r0", "port": spare, "expired": False,
                                              "seconds": json.loads(r.stdout)["hosts"][0]["seconds"]}]
    assert _survivors(sleeper + [standby]) == []  # the standby and its session worker are gone
    assert _survivors(serving + [sup]) == serving + [sup]  # the service runs on
    assert not (rel["run"] / "standby.json").exists()
    history = [json.loads(line) for line in (rel["root"] / "state/history.jsonl").read_text().splitlines()]
    assert [(h["action"], h["release"], h["host"], h["port"], h["reason"]) for h in history] == \
        [("standby-stop", "r0", "h", spare, "RAM wanted")]
    assert "standby-stop" in deployctl("history", "-c", str(deploy_yaml)).stdout

    r = deployctl("standby", "stop", "-c", str(deploy_yaml))  # nothing left to stop: says so, exit 0
    assert r.returncode == 0 and "h: no standby" in r.stdout, r.stdout + r.stderr
    assert _launch(rel, "stop").returncode == 0


def test_a_start_never_ends_the_engine_of_another_live_supervisor_on_its_port(rel):
    """The leftovers a start ends are those of a dead supervisor: a live one serving the same port (here one started
    with DEPLOYCTL_LAUNCH_PORT=8080 beside a plain start on the configured 8080) keeps its engine."""
    first = _start(rel, env={**rel["env"], "DEPLOYCTL_LAUNCH_PORT": "8080"})
    engine = _pids(rel)
    second = _start(rel, 2)
    assert second != first
    assert _survivors(engine + [first]) == engine + [first]
    assert f"port 8080 is served by supervisor pid {first}: its engine is left alone" in rel["log"].read_text()
    assert _launch(rel, "stop").returncode == 0  # the documented stop: every supervisor of the root, both here
    assert _survivors(_pids(rel) + [first, second]) == []
