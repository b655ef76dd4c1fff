"""Start and stop the runtime on a host through the Host layer, by the release layout's conventions
(/work/INTERFACES.md, templates/launch.sh.j2): the release's ``launch.sh start`` / ``launch.sh stop`` (supervisor
pid in ``shared/run/runtime.pid``, its process group holds the runtime), or, for a release without launch.sh,
``python -m deployctl_runtime serve --config current/runtime.yaml`` started detached with the same pidfile and log.
"""
from __future__ import annotations

import shlex

from deployctl.errors import RemoteError


def start(t, *, timeout: float = 60) -> str:
    """Start the runtime on target ``t``; returns a one-line account. Raises RemoteError."""
    v = t.variables
    host = t.host
    current = v["current"]
    if host.exists(f"{current}/launch.sh"):
        res = host.run(["bash", f"{current}/launch.sh", "start"], timeout=timeout)
        pid = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else "?"
        return f"started the runtime on {t.host_cfg.name} with launch.sh (supervisor pid {pid})"
    if not host.exists(v["runtime_yaml"]):
        raise RemoteError(f"{t.host_cfg.name}: {v['runtime_yaml']} is missing, nothing to start",
                          fix="install a release first (`deployctl deploy`)")
    env_file = f"{current}/runtime.env" if host.exists(f"{current}/runtime.env") else None
    argv = [v["python"], "-m", "deployctl_runtime", "serve", "--config", v["runtime_yaml"]]
    pid = host.start_background(argv, log_file=v["log_file"], pid_file=v["pid_file"], env_file=env_file, cwd=current)
    return f"started the runtime on {t.host_cfg.name} (pid {pid})"


def stop(t, *, timeout: float = 60) -> str:
    """Stop the runtime: ``launch.sh stop`` (drain, then SIGKILL by the supervisor), then SIGTERM/SIGKILL to the
    pidfile's process group for whatever is left (a runtime without launch.sh, a hung supervisor). Removes the
    pidfile. A missing or dead pid is not an error."""
    v = t.variables
    notes = []
    if t.host.exists(f"{v['current']}/launch.sh"):
        res = t.host.run(["bash", f"{v['current']}/launch.sh", "stop"], timeout=timeout + 10, check=False)
        notes.append("launch.sh stop" + ("" if res.exit_code == 0 else f" failed ({res.stderr.strip()[-120:]})"))
    res = t.host.run(f"cat {shlex.quote(v['pid_file'])} 2>/dev/null || true", timeout=30)
    pid = res.stdout.strip().split()[0] if res.stdout.strip() else ""
    if pid.isdigit():
        how = kill(t, int(pid), timeout=timeout, group=True)
        if how != "gone":
            notes.append(f"pid {pid} {'SIGKILL' if how == 'KILL' else 'SIGTERM'}")
    t.host.run(["rm", "-f", v["pid_file"], v["child_pid_file"]], timeout=30)
    return "stopped the runtime" + (f" ({', '.join(notes)})" if notes else " (it was not running)")


def kill(t, pid: int, *, timeout: float = 30, group: bool = False) -> str:
    """SIGTERM ``pid`` (its process group when ``group``), wait up to ``timeout`` s, then SIGKILL.
    Returns "gone" (it was not running), "TERM" or "KILL": how it ended."""
    target = f"-{pid}" if group else str(pid)
    zombie = f"grep -q '^State:.*Z' /proc/{pid}/status 2>/dev/null"
    script = (
        f"kill -0 {pid} 2>/dev/null && ! {zombie} || {{ echo gone; exit 0; }}; "
        f"kill -TERM -- {target} 2>/dev/null || kill -TERM {pid}; "
        f"end=$(( $(date +%s) + {int(timeout)} )); "
        f"while kill -0 {pid} 2>/dev/null && ! {zombie} && [ \"$(date +%s)\" -lt $end ]; do sleep 0.2; done; "
        f"if kill -0 {pid} 2>/dev/null && ! {zombie}; then "
        f"kill -KILL -- {target} 2>/dev/null || kill -KILL {pid}; echo KILL; else echo TERM; fi"
    )
    return t.host.run(script, timeout=timeout + 30).stdout.strip().splitlines()[-1]
