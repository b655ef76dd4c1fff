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
             "state": state, "env": env, "cfg": cfg}
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


def test_a_stale_pidfile_whose_number_another_process_has_now_blocks_no_start_and_kills_no_stranger(release):
    """A pidfile outlives its supervisor (a reboot, a SIGKILL before cleanup) and the kernel hands its number to
    another process (pid_max 32768 wraps within minutes on a busy machine): before, `launch.sh start` took the
    stranger for the running supervisor and started nothing, and deployctl's stop SIGKILLed the stranger's
    process group."""
    from deployctl.hosts import Host
    from deployctl.service.engine import Engine

    cfg = release["cfg"]
    stranger = subprocess.Popen(["sleep", "300"], start_new_session=True)  # leads a process group, as setsid does
    host = Host.from_config(cfg.hosts[0])
    try:
        release["pid"].parent.mkdir(parents=True, exist_ok=True)
        release["pid"].write_text(f"{stranger.pid}\n")
        assert not Engine(host, cfg).running()
        assert Engine(host, cfg).stop(timeout=3) == "not running"
        assert stranger.poll() is None and not release["pid"].exists()  # the stranger lives; the stale file went

        release["pid"].write_text(f"{stranger.pid}\n")
        started = subprocess.run([str(release["launch"]), "start"], capture_output=True, text=True,
                                 env=release["env"], timeout=30)
        assert started.returncode == 0, started.stderr
        supervisor = int(started.stdout.strip())
        assert supervisor != stranger.pid and _alive(supervisor)
        _wait_for(release["state"] / "ready")  # a real start: the runtime runs
        assert Engine(host, cfg).running()
        assert Engine(host, cfg).stop(timeout=10) == "stopped" and not _alive(supervisor)
        assert stranger.poll() is None
    finally:
        host.close()
        stranger.kill()
        stranger.wait()


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


def test_launcher_restarts_the_real_runtime_after_a_sticky_engine_error(tmp_path, rollout_model):
    """Issue 27: the bundled runtime ends itself with exit 3 when its device is poisoned (a sticky CUDA error, here
    the runtime's own fault switch), and launch.sh brings it back: a second runtime process serves the next request."""
    import sys

    import httpx

    from support.ports import free_port

    root, port = tmp_path / "root", free_port()
    _, rel = local_release(root, sys.executable, api_key=None,
                           model={"path": str(rollout_model), "served_name": "tiny-chat", "dtype": "float32"},
                           engine={"max_model_len": 256, "max_num_seqs": 4, "num_gpu_blocks_override": 64},
                           server={"port": port})
    poison = 7  # the forward raises "CUDA error: ..." whenever its batch holds this token id
    env = {**os.environ, "DEPLOYCTL_LAUNCH_BACKOFF_S": "0.1", "DEPLOYCTL_RUNTIME_FAULT": f"cuda_error_on_token={poison}"}
    child_file, log = root / "shared/run/runtime.child.pid", root / "shared/logs/runtime.log"
    url = f"http://127.0.0.1:{port}"

    def ready_child() -> int:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/readyz", timeout=5).status_code == 200:
                    return int(child_file.read_text())
            except (httpx.TransportError, OSError, ValueError):
                pass
            time.sleep(0.2)
        raise AssertionError("the runtime did not become ready:\n" + log.read_text()[-3000:])

    started = subprocess.run([str(rel / "launch.sh"), "start"], capture_output=True, text=True, env=env, timeout=30)
    assert started.returncode == 0, started.stderr
    supervisor = int(started.stdout.strip())
    try:
        first = ready_child()
        body = {"model": "tiny-chat", "max_tokens": 2}
        bad = httpx.post(url + "/v1/completions", json={**body, "prompt": [50, 51, poison, 52]}, timeout=60)
        assert bad.status_code == 500 and "CUDA error" in bad.json()["error"]["message"], bad.text
        second = ready_child()  # exit 3, then launch.sh's restart: a new process serves
        assert second != first and not _alive(first) and _alive(supervisor)
        ok = httpx.post(url + "/v1/completions", json={**body, "prompt": [100, 101, 102]}, timeout=60)
        assert ok.status_code == 200 and ok.json()["choices"][0]["text"] is not None, ok.text
        text = log.read_text()
        assert "the engine died" in text and "runtime exited with 3; restart 1/4" in text, text[-3000:]
    finally:
        subprocess.run([str(rel / "launch.sh"), "stop"], capture_output=True, env=env, timeout=60)


def test_the_runtime_log_is_capped_by_copytruncate_while_the_runtime_runs(tmp_path):
    """Issue 27: launch.sh appended the engine's output to one file with no cap. With logs.max_bytes 8 KiB and two
    backups, a runtime printing steadily never stops or restarts, runtime.log stays near the cap, at most two
    copies are kept, and the newest lines are still in runtime.log."""
    root = tmp_path / "root"
    chatty = tmp_path / "chatty-python"
    chatty.write_text("#!/bin/bash\ni=0; trap 'exit 0' TERM\n"
                      "while :; do i=$((i+1)); printf 'line %06d %0100d\\n' $i 0; sleep 0.002; done\n")
    chatty.chmod(0o755)
    _, rel = local_release(root, str(chatty), api_key=None, logs={"max_bytes": 8192, "backup_count": 2})
    env = {**os.environ, "DEPLOYCTL_LAUNCH_LOG_CHECK_S": "0.2"}
    log = root / "shared/logs/runtime.log"
    started = subprocess.run([str(rel / "launch.sh"), "start"], capture_output=True, text=True, env=env, timeout=30)
    assert started.returncode == 0, started.stderr
    try:
        deadline = time.monotonic() + 30
        while not (root / "shared/logs/runtime.log.2").exists():
            assert time.monotonic() < deadline, sorted(p.name for p in log.parent.iterdir())
            time.sleep(0.1)
        time.sleep(1.5)
        child = int((root / "shared/run/runtime.child.pid").read_text())
        names = sorted(p.name for p in log.parent.iterdir())
        assert names == ["runtime.log", "runtime.log.1", "runtime.log.2"], names
        # a 0.2 s check at ~50 lines/s of 112 bytes stays within a few KiB of the cap
        assert log.stat().st_size < 8192 + 16384, log.stat().st_size
        for p in log.parent.iterdir():
            assert p.stat().st_size < 8192 + 16384, (p.name, p.stat().st_size)
        newest = [int(l.split()[1]) for l in log.read_text().splitlines() if l.startswith("line ")]
        older = [int(l.split()[1]) for l in (log.parent / "runtime.log.1").read_text().splitlines() if l.startswith("line ")]
        assert newest and older and min(newest) > max(older) - 50  # runtime.log holds what came after .1
        assert "rotated to" in (log.parent / "runtime.log.1").read_text() + log.read_text()
        assert _alive(child) and int((root / "shared/run/runtime.child.pid").read_text()) == child  # never restarted
    finally:
        stopped = subprocess.run([str(rel / "launch.sh"), "stop"], capture_output=True, text=True, env=env, timeout=60)
    assert stopped.returncode == 0, stopped.stderr
    time.sleep(0.5)
    leftover = subprocess.run(["pgrep", "-f", str(rel / "launch.sh")], capture_output=True, text=True).stdout.split()
    assert leftover == [], leftover  # the keeper ends with its supervisor
    # the systemd launcher's timer runs the same rule once: `launch.sh rotate-log`
    log.write_text("x" * 9000 + "\n")
    for _ in range(3):
        assert subprocess.run([str(rel / "launch.sh"), "rotate-log"], env=env, timeout=30).returncode == 0
    assert "x" * 100 not in log.read_text() and (log.parent / "runtime.log.1").read_text().startswith("x" * 9000)
    assert sorted(p.name for p in log.parent.iterdir()) == ["runtime.log", "runtime.log.1", "runtime.log.2"]
