"""The supervisor's host-level pieces: what the engine handle (deployctl.service.engine: ``Engine.start``,
``stop``, ``running``, ``liveness``, ``start_in_place``) runs, and the host's ports and pidfiles (which port serves,
``adopt``, ``supports_beside``, who holds the port, the runtime's pid and log).

``launcher: process``: the release's ``launch.sh`` (rendered by deployctl.render: a supervisor loop with pidfile
shared/run/runtime.pid, log shared/logs/runtime.log, restart on failure with backoff) run as ``launch.sh start``
(it detaches itself with setsid, stdin /dev/null, output to the log) with PYTHONPATH removed so the installed wheel
is what runs. Stop: SIGTERM to the supervisor (it forwards one SIGTERM to the runtime, which drains), wait up to
the drain timeout + 5 s for the whole process group to exit, then SIGKILL the group and the engine's processes
outside it (launch.sh marks them by their environment: hostscripts.snippets SH_ENGINE_PIDS); ``StopResult`` says
what had to be killed.
``launcher: systemd``: the release's unit installed under /etc/systemd/system and ``sudo -n systemctl``
(``reset-failed`` before every start, so a unit left failed by a crash loop or a configuration error starts again).
"""
from __future__ import annotations

import posixpath
import shlex
from typing import Optional

from deployctl.hostscripts.snippets import SH_ALIVE
from deployctl.config import DeployConfig
from deployctl.config.layout import (child_pid_file, configured_port, log_file, pid_file, service_port, shared_dir,
                                     spare_pid_file)

EXIT_MARKERS = ("runtime exited with", "giving up", "Traceback (most recent call last)")


def unit_of(cfg: DeployConfig, h) -> str:
    from deployctl.config.layout import unit_name

    return unit_name(cfg, h)


def log_size(host) -> int:
    r = host.run(f"stat -c %s {shlex.quote(log_file(host.config))} 2>/dev/null || echo 0", timeout=15)
    try:
        return int(r.stdout.strip() or 0)
    except ValueError:
        return 0


# What a runtime started by launch.sh keeps of the environment of the command that starts it (deployctl's own on
# ``address: local`` hosts, the SSH login's elsewhere): the login basics and launch.sh's own knobs. Everything else
# a runtime gets comes from its release's runtime.env (and launch.sh's exports), so an operator's proxy, token or
# test fault switch never reaches a release it was not rendered into (a restored stable one included).
START_ENV_ALLOW = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE",
                   "LC_MESSAGES", "TZ", "TMPDIR", "DEPLOYCTL_LAUNCH_BACKOFF_S", "DEPLOYCTL_LAUNCH_MAX_FAILURES",
                   "DEPLOYCTL_LAUNCH_STOP_TIMEOUT_S", "DEPLOYCTL_LAUNCH_LOG_CHECK_S")


def clean_env_prefix() -> str:
    """``env -i NAME="$NAME" ...`` for the START_ENV_ALLOW names that are set (POSIX ``${NAME+...}``: an unset
    name is left out, an empty one kept), to put before a command in a shell line."""
    return "env -i " + " ".join(f'${{{n}+"{n}=${n}"}}' for n in START_ENV_ALLOW)


def supports_beside(host, cfg: DeployConfig, release_dir: str) -> bool:
    """Whether a start on a second port is possible on ``host`` for the release in ``release_dir``: the process
    launcher, ``spare_port`` set, and that release's launch.sh knows DEPLOYCTL_LAUNCH_PORT (releases rendered
    for the bundled runtime by this deployctl or later). Raises RemoteError."""
    h = host.config
    if h.launcher != "process" or not h.spare_port:
        return False
    r = host.run(f"grep -qs DEPLOYCTL_LAUNCH_PORT {shlex.quote(release_dir + '/launch.sh')} && echo yes || true",
                 timeout=15)
    return r.stdout.strip() == "yes"


def beside_port(cfg: DeployConfig, h) -> Optional[int]:
    """The port a start beside the serving runtime uses: ``spare_port`` while the runtime is on its configured
    port, else the configured one (the two alternate); None without ``spare_port``."""
    if not h.spare_port:
        return None
    return h.spare_port if service_port(cfg, h) != h.spare_port else configured_port(cfg, h)


def remember_port(h, link: str) -> Optional[int]:
    """Note on ``h`` (HostConfig) the port in a pidfile link target (``runtime.<port>.pid``; none: 0, the
    configured port — read, unlike None, which means not read from the host in this process)."""
    import re

    m = re.search(r"runtime\.(\d+)\.pid$", link.strip())
    h._active_port = int(m.group(1)) if m else 0
    return h._active_port or None


def load_port(host, cfg: DeployConfig) -> int:
    """Read which port the runtime serves on from the host (the target of the ``runtime.pid`` link after a
    rollback onto a second port) and keep it on ``host.config`` for ``layout.service_port``. Returns the port.
    Raises RemoteError."""
    h = host.config
    if h.launcher == "process" and h.spare_port:
        remember_port(h, host.run(f"readlink {shlex.quote(pid_file(h))} || true", timeout=15).stdout)
    return service_port(cfg, h)


def adopt(host, cfg: DeployConfig, port: int) -> None:
    """Make the supervisor started on ``port`` the service (after the old one is stopped): ``runtime.pid`` and
    ``runtime.child.pid`` become links to its pidfiles, atomically (new link, then rename over). Raises
    RemoteError."""
    h = host.config
    q = shlex.quote
    cmds = []
    for link, target in ((pid_file(h), spare_pid_file(h, port)), (child_pid_file(h), spare_pid_file(h, port, True))):
        cmds.append(f"ln -sfn {q(posixpath.basename(target))} {q(link + '.new')} && mv -T {q(link + '.new')} {q(link)}")
    host.run(" && ".join(cmds), timeout=15)
    h._active_port = port


class StopResult(str):
    """What ``stop`` did, as the string existing callers compare: "stopped", "killed" or "not running".

    ``drained``: the runtime's main process ended within the drain bound (False: it was wedged and got SIGKILL; the
    caller may want to say so: its in-flight requests were cut). ``killed``: the processes that got SIGKILL after the drain bound or
    were found outside the supervisor's process group afterwards (a worker in a session of its own, the orphans of
    a killed supervisor), each "PID (name)"; they make the value "killed" too. ``detail``: one line for a person."""

    drained: bool
    killed: tuple[str, ...]

    def __new__(cls, value: str, *, drained: bool = True, killed: tuple[str, ...] = ()) -> "StopResult":
        obj = super().__new__(cls, value)
        obj.drained, obj.killed = drained, tuple(killed)
        return obj

    @property
    def detail(self) -> str:
        if self == "not running":
            return "not running"
        why = "drained" if self.drained else "did not drain within the drain bound: SIGKILL"
        return f"{self} ({why})" + (f"; killed {', '.join(self.killed)}" if self.killed else "")


def kill_pid(host, pid: int, *, timeout: float = 30) -> str:
    """SIGTERM ``pid`` on ``host``, wait up to ``timeout`` s, then SIGKILL (a foreign process holding the service
    port). Returns "gone" (it was not running), "TERM" or "KILL": how it ended. Raises RemoteError."""
    running = f"alive {pid}"
    script = (
        f"{SH_ALIVE}; {running} || {{ echo gone; exit 0; }}; kill -TERM {pid}; "
        f"end=$(( $(date +%s) + {int(timeout)} )); "
        f"while {running} && [ \"$(date +%s)\" -lt $end ]; do sleep 0.2; done; "
        f"if {running}; then kill -KILL {pid}; echo KILL; else echo TERM; fi"
    )
    return host.run(script, timeout=timeout + 30).stdout.strip().splitlines()[-1]


def port_holder(host, cfg: DeployConfig, *, timeout: float = 30) -> dict:
    """Who holds the service port on ``host`` (the probe's port and service sections, run there):
    ``{"value": "free" | "runtime" | "other", "pid", "process", "pidfile_pid"}``; "runtime" when the holder is the
    launcher's process group (pidfile and descendants) or runs in the systemd unit's cgroup. Raises RemoteError."""
    import json

    from deployctl.hostscripts import probe
    from deployctl.hostscripts.snippets import module_argv

    h = host.config
    params = {"sections": ["port", "service"], "deploy_root": h.deploy_root, "bind": cfg.server.bind,
              "port": service_port(cfg, h), "unit": unit_of(cfg, h) if h.launcher == "systemd" else ""}
    r = host.run(module_argv(h.python, probe, json.dumps(params)), timeout=timeout)
    facts = json.loads(r.stdout.strip().splitlines()[-1])
    holders, ours = facts["port"]["holders"], set(facts["service"]["pids"])
    first = holders[0] if holders else {}
    value = "free" if not holders else ("runtime" if first.get("pid") in ours else "other")
    return {"value": value, "pid": first.get("pid"), "process": first.get("name"), "pidfile_pid": facts["service"]["pid"]}


def runtime_pid(host, cfg: DeployConfig) -> Optional[int]:
    """The runtime process's pid (launch.sh's child pidfile, or systemd's MainPID); None when not running."""
    h = host.config
    if h.launcher == "systemd":
        r = host.run(["systemctl", "show", "-p", "MainPID", "--value", unit_of(cfg, host.config)], timeout=15, check=False)
    else:
        child = shlex.quote(shared_dir(h, "run", "runtime.child.pid"))
        r = host.run(f'{SH_ALIVE}; p=$(cat {child} 2>/dev/null) && alive "$p" && echo "$p" || true', timeout=15)
    try:
        pid = int(r.stdout.strip() or 0)
    except ValueError:
        return None
    return pid or None


def log_tail(host, lines: int = 15) -> str:
    """The last lines of the runtime log on the host ("" when unreadable)."""
    try:
        r = host.run(f"tail -n {int(lines)} {shlex.quote(log_file(host.config))} 2>/dev/null || true", timeout=15)
        return r.stdout.strip()
    except Exception:
        return ""
