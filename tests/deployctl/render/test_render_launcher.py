"""launch.sh, the process launcher for hosts without systemd, run for real against a fake runtime executable:
pidfile, log file, restart on failure with backoff, the env file sourced, SIGTERM forwarded for the drain."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from support.render import API_KEY, local_release

FAKE_RUNTIME = r"""#!/bin/bash
# Stands in for `python -m deployctl_runtime serve --config X`: the first $FAKE_FAILS starts crash (exit 3),
# later ones serve until SIGTERM, then drain for 0.3 s and exit 0.
n=$(( $(cat "$FAKE_STATE/starts" 2>/dev/null || echo 0) + 1 )); echo "$n" > "$FAKE_STATE/starts"
echo "fake runtime start $n: $*"
[ "${DEPLOYCTL_RUNTIME_API_KEY:-}" = "$EXPECT_KEY" ] && touch "$FAKE_STATE/key-ok.$n"
[ "$n" -le "${FAKE_FAILS:-0}" ] && exit "${FAKE_RC:-3}"
[ "$n" -le "${FAKE_KILLED:-0}" ] && kill -KILL $$  # a crash by signal (OOM killer, segfault)
if [ -n "${FAKE_HANG:-}" ]; then  # a drain that never ends, with a worker process of its own
  trap 'echo ignoring SIGTERM' TERM; sleep 300 & echo $! > "$FAKE_STATE/worker"
else
  trap 'echo draining; sleep 0.3; touch "$FAKE_STATE/drained"; exit 0' TERM
fi
touch "$FAKE_STATE/ready"
while :; do sleep 0.05; done
"""


@pytest.fixture
def release(tmp_path):
    root = tmp_path / "root"
    fake = tmp_path / "fake-python"
    fake.write_text(FAKE_RUNTIME)
    fake.chmod(0o755)
    cfg, rel = local_release(root, str(fake), api_key=API_KEY)
    state = tmp_path / "state"
    state.mkdir()
    env = {**os.environ, "FAKE_STATE": str(state), "EXPECT_KEY": API_KEY, "DEPLOYCTL_LAUNCH_BACKOFF_S": "0.1"}
    paths = {"launch": rel / "launch.sh", "pid": root / "shared/run/runtime.pid",
             "child": root / "shared/run/runtime.child.pid", "log": root / "shared/logs/runtime.log",
             "state": state, "env": env}
    yield paths
    for key in ("child", "pid"):  # never leave a supervisor behind, even when the test failed
        try:
            os.kill(int(paths[key].read_text()), signal.SIGKILL)
        except (OSError, ValueError):
            pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def _wait_for(path: Path, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear within {timeout} s"
        time.sleep(0.05)


def test_launcher_restarts_on_failure_and_drains_on_stop(release):
    env = {**release["env"], "FAKE_FAILS": "1"}
    started = subprocess.run([str(release["launch"]), "start"], capture_output=True, text=True, env=env, timeout=30)
    assert started.returncode == 0, started.stderr
    supervisor = int(started.stdout.strip())
    _wait_for(release["state"] / "ready")
    assert (release["state"] / "starts").read_text().strip() == "2"  # crashed once, restarted
    assert (release["state"] / "key-ok.2").exists()  # runtime.env was sourced
    assert int(release["pid"].read_text()) == supervisor and _alive(supervisor)
    child = int(release["child"].read_text())
    assert _alive(child)
    # One process group led by the supervisor: a SIGKILL to the group (the rollout's last resort) takes all.
    assert os.getpgid(supervisor) == supervisor == os.getpgid(child)
    log = release["log"].read_text()
    assert "runtime exited with 3; restart 1/4 in 0.1s" in log and "fake runtime start 2" in log
    assert subprocess.run([str(release["launch"]), "status"], env=env, timeout=10).returncode == 0

    stopped = subprocess.run([str(release["launch"]), "stop"], capture_output=True, text=True, env=env, timeout=30)
    assert stopped.returncode == 0, stopped.stderr
    assert (release["state"] / "drained").exists()  # SIGTERM reached the runtime and it finished its drain
    assert not _alive(supervisor) and not _alive(child)
    assert not release["pid"].exists()
    assert "runtime stopped (exit 0)" in release["log"].read_text()
    assert subprocess.run([str(release["launch"]), "status"], env=env, timeout=10).returncode == 1


def test_launcher_gives_up_after_repeated_failures_with_growing_backoff(release):
    env = {**release["env"], "FAKE_FAILS": "100", "DEPLOYCTL_LAUNCH_MAX_FAILURES": "3"}
    done = subprocess.run([str(release["launch"]), "run"], capture_output=True, text=True, env=env, timeout=30)
    assert done.returncode == 1
    assert (release["state"] / "starts").read_text().strip() == "3"
    log = release["log"].read_text()
    assert "restart 1/2 in 0.1s" in log and "restart 2/2 in 0.2s" in log
    assert "runtime failed 3 times in a row (last exit 3); giving up" in log
    assert not release["pid"].exists()


def test_launcher_restarts_a_runtime_killed_by_a_signal_but_not_a_config_error(release):
    env = {**release["env"], "FAKE_KILLED": "2"}
    started = subprocess.run([str(release["launch"]), "start"], capture_output=True, text=True, env=env, timeout=30)
    assert started.returncode == 0, started.stderr
    _wait_for(release["state"] / "ready")
    log = release["log"].read_text()
    assert "runtime exited with 137; restart 1/4 in 0.1s" in log and "restart 2/4 in 0.2s" in log  # backoff grows
    assert subprocess.run([str(release["launch"]), "stop"], env=env, timeout=30).returncode == 0

    (release["state"] / "starts").unlink()
    env = {**release["env"], "FAKE_FAILS": "100", "FAKE_RC": "2"}
    done = subprocess.run([str(release["launch"]), "run"], capture_output=True, text=True, env=env, timeout=30)
    assert done.returncode == 2 and (release["state"] / "starts").read_text().strip() == "1"
    assert "runtime exited with 2 (configuration error); not restarting" in release["log"].read_text()


def test_launcher_kills_the_runtime_group_after_the_stop_timeout(release):
    env = {**release["env"], "FAKE_HANG": "1", "DEPLOYCTL_LAUNCH_STOP_TIMEOUT_S": "1"}
    started = subprocess.run([str(release["launch"]), "start"], capture_output=True, text=True, env=env, timeout=30)
    assert started.returncode == 0, started.stderr
    _wait_for(release["state"] / "ready")
    _wait_for(release["state"] / "worker")
    child, worker = int(release["child"].read_text()), int((release["state"] / "worker").read_text())
    t0 = time.monotonic()
    stopped = subprocess.run([str(release["launch"]), "stop"], capture_output=True, text=True, env=env, timeout=30)
    assert stopped.returncode == 0, stopped.stderr
    assert time.monotonic() - t0 < 10
    assert not _alive(child) and not _alive(worker)  # the whole process group, not only the runtime
    assert "still running after 1s: SIGKILL" in release["log"].read_text()
