"""Start and stop the runtime on a host through the Host layer, by the release layout's conventions
(/work/INTERFACES.md): ``<deploy_root>/current/launch.sh`` when the release has one, else
``python -m deployctl_runtime serve --config current/runtime.yaml`` with ``current/runtime.env``; output appended to
``shared/logs/runtime.log``; the pid in ``shared/run/runtime.pid`` (a session leader, so stop signals its group).
"""
from __future__ import annotations

import time

from deployctl.errors import RemoteError


def start(t) -> str:
    """Start the runtime on target ``t``; returns a one-line account. Raises RemoteError."""
    v = t.variables
    host = t.host
    current = v["current"]
    host.run(["mkdir", "-p", f"{v['deploy_root']}/shared/logs", f"{v['deploy_root']}/shared/run"], timeout=30)
    if host.exists(f"{current}/launch.sh"):
        argv = ["bash", f"{current}/launch.sh"]
    else:
        if not host.exists(v["runtime_yaml"]):
            raise RemoteError(f"{t.host_cfg.name}: {v['runtime_yaml']} is missing, nothing to start",
                              fix="install a release first (`deployctl deploy`)")
        argv = [v["python"], "-m", "deployctl_runtime", "serve", "--config", v["runtime_yaml"]]
    env_file = f"{current}/runtime.env" if host.exists(f"{current}/runtime.env") else None
    pid = host.start_background(argv, log_file=v["log_file"], pid_file=v["pid_file"], env_file=env_file, cwd=current)
    return f"started the runtime on {t.host_cfg.name} (pid {pid})"


def stop(t, *, timeout: float = 30) -> str:
    """Stop the pidfile's runtime (SIGTERM to its process group, SIGKILL after ``timeout``); removes the
    pidfile. A missing or dead pid is not an error."""
    v = t.variables
    res = t.host.run(f"cat {v['pid_file']} 2>/dev/null || true", timeout=30)
    pid = res.stdout.strip().split()[0] if res.stdout.strip() else ""
    if not pid.isdigit():
        return "no runtime pidfile: nothing to stop"
    killed = kill(t, int(pid), timeout=timeout, group=True)
    t.host.run(["rm", "-f", v["pid_file"]], timeout=30)
    return f"stopped the runtime (pid {pid}{', SIGKILL' if killed == 'KILL' else ''})"


def kill(t, pid: int, *, timeout: float = 30, group: bool = False) -> str:
    """SIGTERM ``pid`` (its process group when ``group``), wait up to ``timeout`` s, then SIGKILL.
    Returns "gone", "TERM" or "KILL": how it ended."""
    target = f"-{pid}" if group else str(pid)
    script = (
        f"kill -0 {pid} 2>/dev/null || {{ echo gone; exit 0; }}; kill -TERM -- {target} 2>/dev/null || kill -TERM {pid}; "
        f"end=$(( $(date +%s) + {int(timeout)} )); "
        f"while kill -0 {pid} 2>/dev/null && [ \"$(date +%s)\" -lt $end ]; do "
        f"grep -q '^State:.*Z' /proc/{pid}/status 2>/dev/null && break; sleep 0.2; done; "
        f"if kill -0 {pid} 2>/dev/null && ! grep -q '^State:.*Z' /proc/{pid}/status 2>/dev/null; then "
        f"kill -KILL -- {target} 2>/dev/null || kill -KILL {pid}; echo KILL; else echo TERM; fi"
    )
    return t.host.run(script, timeout=timeout + 30).stdout.strip().splitlines()[-1]


def wait_gone(t, pid: int, timeout: float) -> bool:
    """Poll until ``pid`` is gone on the host; True when it went within ``timeout`` s."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if t.host.run(f"kill -0 {pid} 2>/dev/null && echo alive || echo gone", timeout=30).stdout.strip() == "gone":
            return True
        time.sleep(0.3)
    return False
