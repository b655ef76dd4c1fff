"""Start, stop and restart the runtime on a host.

``launcher: process``: ``current/launch.sh`` (rendered per release: supervisor loop, pidfile, log file) started
detached through ``Host.start_background`` (setsid, stdin /dev/null, output appended to shared/logs/runtime.log)
with PYTHONPATH removed so the installed wheel is what runs; its pid (the process group leader) goes to
shared/run/launcher.pid. Stop: SIGTERM to the process group, wait up to the drain timeout for the group to exit
(the runtime drains in-flight requests), then SIGKILL.
``launcher: systemd``: the release's unit installed under /etc/systemd/system and ``sudo -n systemctl``.
"""
from __future__ import annotations

import posixpath
import shlex

from deployctl.config import DeployConfig
from deployctl.rollout.paths import current_link, log_file, shared_dir


def launcher_pid_file(h) -> str:
    return shared_dir(h, "run", "launcher.pid")


def _unit(cfg: DeployConfig) -> str:
    return f"{cfg.service.name}.service"


def start(host, cfg: DeployConfig) -> None:
    """Start the release ``current`` points at. Raises RemoteError."""
    h = host.config
    cur = current_link(h)
    if h.launcher == "systemd":
        unit = _unit(cfg)
        host.sudo(["install", "-m", "0644", posixpath.join(cur, unit), f"/etc/systemd/system/{unit}"])
        host.sudo(["systemctl", "daemon-reload"])
        host.sudo(["systemctl", "restart", unit], timeout=120)
        return
    host.run(["mkdir", "-p", shared_dir(h, "logs"), shared_dir(h, "run")], timeout=30)
    # launch.sh lives in the release dir; resolve the link now so a later switch cannot change what runs
    rdir = host.run(["readlink", "-f", cur], timeout=30).stdout.strip()
    host.start_background(["env", "-u", "PYTHONPATH", "bash", posixpath.join(rdir, "launch.sh")],
                          log_file=log_file(h), pid_file=launcher_pid_file(h), cwd=rdir)


def stop(host, cfg: DeployConfig, *, timeout: float | None = None) -> str:
    """Stop the runtime: SIGTERM, wait for the drain (``server.drain_timeout_s`` + 5 s unless ``timeout``),
    then SIGKILL. Returns "stopped", "killed" or "not running". Raises RemoteError."""
    h = host.config
    wait = cfg.server.drain_timeout_s + 5 if timeout is None else timeout
    if h.launcher == "systemd":
        host.sudo(["systemctl", "stop", _unit(cfg)], timeout=wait + 30)
        return "stopped"
    pidf = shlex.quote(launcher_pid_file(h))
    ticks = max(1, int(wait * 10))
    script = f"""
pidf={pidf}
[ -f "$pidf" ] || {{ echo "not running"; exit 0; }}
pid=$(cat "$pidf")
if ! kill -0 -- "-$pid" 2>/dev/null; then rm -f "$pidf"; echo "not running"; exit 0; fi
kill -TERM -- "-$pid" 2>/dev/null
i=0
while kill -0 -- "-$pid" 2>/dev/null; do
  sleep 0.1; i=$((i+1))
  if [ $i -ge {ticks} ]; then kill -KILL -- "-$pid" 2>/dev/null; sleep 0.2; rm -f "$pidf"; echo killed; exit 0; fi
done
rm -f "$pidf"; echo stopped
"""
    r = host.run(script, timeout=wait + 30)
    return r.stdout.strip().splitlines()[-1] if r.stdout.strip() else "stopped"


def is_running(host, cfg: DeployConfig) -> bool:
    """Whether the runtime's process group (or systemd unit) is alive."""
    h = host.config
    if h.launcher == "systemd":
        return host.sudo(["systemctl", "is-active", "--quiet", _unit(cfg)], check=False).exit_code == 0
    pidf = shlex.quote(launcher_pid_file(h))
    r = host.run(f'[ -f {pidf} ] && kill -0 -- "-$(cat {pidf})" 2>/dev/null', timeout=30, check=False)
    return r.exit_code == 0


def restart(host, cfg: DeployConfig) -> None:
    stop(host, cfg)
    start(host, cfg)


def log_tail(host, lines: int = 15) -> str:
    """The last lines of the runtime log on the host ("" when unreadable)."""
    try:
        r = host.run(f"tail -n {int(lines)} {shlex.quote(log_file(host.config))} 2>/dev/null || true", timeout=15)
        return r.stdout.strip()
    except Exception:
        return ""
