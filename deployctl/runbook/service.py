"""Start and stop the runtime on a runbook's host: the rollout's launcher (deployctl.rollout.launcher: the release's
launch.sh for ``launcher: process``, systemctl for ``launcher: systemd``), plus ``kill`` for a foreign process
that holds the service port."""
from __future__ import annotations


def start(t) -> str:
    """Start the release ``current`` points at on target ``t``. Raises RemoteError."""
    from deployctl.rollout import launcher

    launcher.start(t.host, t.cfg)
    return f"started the runtime on {t.host_cfg.name} ({t.host_cfg.launcher} launcher)"


def stop(t) -> str:
    """Stop the runtime (drain, then SIGKILL to its process group after the drain timeout). Raises RemoteError."""
    from deployctl.rollout import launcher

    how = launcher.stop(t.host, t.cfg)
    return "the runtime was not running" if how == "not running" else f"runtime {how}"


def kill(t, pid: int, *, timeout: float = 30) -> str:
    """SIGTERM ``pid``, wait up to ``timeout`` s, then SIGKILL. Returns "gone" (it was not running), "TERM" or
    "KILL": how it ended. Raises RemoteError."""
    zombie = f"grep -q '^State:.*Z' /proc/{pid}/status 2>/dev/null"
    running = f"kill -0 {pid} 2>/dev/null && ! {zombie}"
    script = (
        f"{running} || {{ echo gone; exit 0; }}; kill -TERM {pid}; "
        f"end=$(( $(date +%s) + {int(timeout)} )); "
        f"while {running} && [ \"$(date +%s)\" -lt $end ]; do sleep 0.2; done; "
        f"if {running}; then kill -KILL {pid}; echo KILL; else echo TERM; fi"
    )
    return t.host.run(script, timeout=timeout + 30).stdout.strip().splitlines()[-1]
