"""Start, stop and restart the runtime on a host.

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

from deployctl.hostscripts.snippets import SH_ALIVE, SH_ENGINE_PIDS, SH_OURS
from deployctl.config import DeployConfig, layout
from deployctl.config.layout import (child_pid_file, configured_port, current_link, log_file, pid_file, runtime_address,
                                     service_port, shared_dir, spare_pid_file)

EXIT_MARKERS = ("runtime exited with", "giving up", "Traceback (most recent call last)")


def _unit(cfg: DeployConfig, h) -> str:
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


def start(host, cfg: DeployConfig, *, port: Optional[int] = None) -> int:
    """Start the release ``current`` points at. Returns the log size before the start (for ``liveness``).
    ``port`` (process launcher, a release whose launch.sh ``supports_beside``): a second supervisor serving there
    beside the running one (``DEPLOYCTL_LAUNCH_PORT``), its pidfiles ``layout.spare_pid_file``; ``adopt`` makes it
    the service once the old one is stopped. Without ``port``: pidfile links left dangling by a stopped
    second-port runtime are removed first (a new supervisor must not write through them). Raises RemoteError."""
    h = host.config
    cur = current_link(h)
    if h.launcher == "systemd":
        offset = log_size(host)
        unit = _unit(cfg, h)
        logs = layout.log_cap_units(cfg, h)  # the runtime log's cap (deploy.yaml logs:)
        for name in [unit, *logs]:
            host.sudo(["install", "-m", "0644", posixpath.join(cur, name), f"/etc/systemd/system/{name}"])
        host.sudo(["systemctl", "daemon-reload"])
        host.sudo(["systemctl", "enable", "--now", logs[1]], check=False)
        # a unit left failed (start limit hit, RestartPreventExitStatus) refuses or miscounts the next start
        host.sudo(["systemctl", "reset-failed", unit], check=False)
        # a Type=notify unit (the bundled runtime with its watchdog) is started only at READY=1, after the model
        # load: queue the restart and leave the wait to the readiness check (service.verify), as for Type=exec
        from deployctl.render.release import watchdog_sec

        host.sudo(["systemctl", "restart", *(["--no-block"] if watchdog_sec(cfg) else []), unit], timeout=120)
        return offset
    q = shlex.quote
    log = q(log_file(h))
    # one command: note the log size, then launch.sh start from the resolved release dir (a later switch of
    # ``current`` cannot change what runs), in a clean environment (START_ENV_ALLOW; so without PYTHONPATH: the
    # installed wheel is what runs)
    links = " ".join(q(f) for f in (pid_file(h), child_pid_file(h)))
    env = f"DEPLOYCTL_LAUNCH_PORT={int(port)}" if port else ""
    script = (f"mkdir -p {q(shared_dir(h, 'logs'))} {q(shared_dir(h, 'run'))}; "
              f"stat -c %s {log} 2>/dev/null || echo 0; "
              + ("" if port else f"for f in {links}; do [ -L \"$f\" ] && [ ! -e \"$f\" ] && rm -f \"$f\"; done; ")
              + f"rdir=$(readlink -f {q(cur)}) && {clean_env_prefix()} {env} bash \"$rdir/launch.sh\" start >/dev/null"
              + ("" if port else f"; readlink {q(pid_file(h))} || true"))
    r = host.run(script, timeout=30)
    lines = r.stdout.strip().splitlines()
    if not port:
        _remember(h, lines[1] if len(lines) > 1 else "")
    try:
        return int(lines[0])
    except (ValueError, IndexError):
        return 0


def start_in_place(host, cfg: DeployConfig) -> int:
    """Start the release ``current`` points at on the port the host's runtime serves on (``layout.service_port``):
    after a rollback onto ``spare_port`` that is the spare port — nginx and the readiness checks point there — so
    the runtime starts there (a supervisor with DEPLOYCTL_LAUNCH_PORT) and is adopted as the service; else a plain
    ``start`` on the configured port. For runbooks restarting a runtime where it was; a deploy's ``start`` returns
    to the configured port instead. Returns the log size before the start. Raises RemoteError."""
    h = host.config
    port = service_port(cfg, h)
    if h.launcher != "process" or port == configured_port(cfg, h):
        return start(host, cfg)
    offset = start(host, cfg, port=port)
    adopt(host, cfg, port)
    return offset


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


def _remember(h, link: str) -> Optional[int]:
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
        _remember(h, host.run(f"readlink {shlex.quote(pid_file(h))} || true", timeout=15).stdout)
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


def stop(host, cfg: DeployConfig, *, timeout: float | None = None, port: Optional[int] = None,
         beside: bool = False) -> StopResult:
    """Stop the runtime: SIGTERM to the supervisor (the runtime drains: /readyz 503, in-flight requests finish),
    then wait for the process group to exit, up to engines.command.stop_wait_s (server.drain_timeout_s + the
    engine's exit after its drain) + 5 s unless ``timeout``, then
    SIGKILL. Once the runtime's port stops accepting connections the drain is over (the listener closes after the
    last request) and what is left of the process group is killed rather than waited for. Then the engine's
    processes outside the group (marked by launch.sh: hostscripts.snippets SH_ENGINE_PIDS, deploy root and
    ``port``) get SIGKILL too, also when the pidfile names no live group (a supervisor killed with its group
    leader gone, a worker that called setsid).
    ``port``: the port that runtime listens on (default: the one it serves on); ``beside``: the supervisor
    started on ``port`` beside the service (``start``'s ``port``) rather than the service's own.
    Returns a StopResult: "stopped", "killed" (the drain bound passed, or leftovers outside the group were
    killed; ``.killed`` names them, ``.drained`` says which) or "not running". Raises RemoteError."""
    h = host.config
    from deployctl.engines.command import stop_wait_s

    wait = stop_wait_s(cfg) + 5 if timeout is None else timeout
    if h.launcher == "systemd":
        host.sudo(["systemctl", "stop", _unit(cfg, host.config)], timeout=wait + 30)
        return StopResult("stopped")
    pidf = shlex.quote(spare_pid_file(h, port) if beside and port else pid_file(h))
    childf = shlex.quote(spare_pid_file(h, port, True) if beside and port else child_pid_file(h))
    ticks = max(1, int(wait * 10))
    port = port or service_port(cfg, h)
    addr = runtime_address(cfg)
    root = shlex.quote(h.deploy_root)
    log = shlex.quote(log_file(h))
    script = f"""
{SH_ALIVE}
{SH_OURS}
{SH_ENGINE_PIDS}
pidf={pidf}
off=$(stat -c %s {log} 2>/dev/null || echo 0)
# the engine's processes outside the group (a worker in a session of its own, a killed supervisor's orphans)
sweep() {{ local left; left=$(engine_pids {root} {int(port)}); [ -n "$left" ] || return 0
  echo "killed: $(describe_pids $left)"; kill -KILL $left 2>/dev/null; sleep 0.1; }}
# what the supervisor itself killed during this stop (launch.sh logs it), then the verdict
finish() {{ tail -c +$((off + 1)) {log} 2>/dev/null | sed -n -e "s/.*killed leftovers of the engine[^:]*: /killed: /p" \
    -e "s/.*SIGKILL to the engine's leftovers: /killed: /p" -e "s/.*runtime pid .* still running after .*: SIGKILL$/wedged/p"
  echo "$1"; exit 0; }}
# a group none of whose processes is this deploy root's: the pidfile is stale and its number another's now
pid=$(cat "$pidf" 2>/dev/null)
case "$pid" in ''|*[!0-9]*) pid="";; esac
if [ -z "$pid" ] || ! kill -0 -- "-$pid" 2>/dev/null || ! group_ours "$pid" {root}; then
  # a stale file (or a link to one) goes; a dangling runtime.pid link still names the active port (load_port)
  if [ -f "$pidf" ]; then rm -f "$pidf"; fi
  if [ -n "$(engine_pids {root} {int(port)})" ]; then sweep; echo killed; else echo "not running"; fi; exit 0
fi
listening() {{ (exec 3<>/dev/tcp/{addr}/{port}) 2>/dev/null; }}
was=0; listening && was=1
# the supervisor forwards one SIGTERM to the runtime; a runtime left without it (supervisor killed) gets it directly
# (a dead supervisor may still be a zombie, which kill -0 and kill accept: ask alive)
{{ alive "$pid" && kill -TERM "$pid" 2>/dev/null; }} || kill -TERM -- "-$pid" 2>/dev/null
i=0; closed=0
while kill -0 -- "-$pid" 2>/dev/null; do
  sleep 0.1; i=$((i+1))
  if [ $was = 1 ] && ! listening; then closed=$((closed+1)); else closed=0; fi
  if [ $closed -ge 3 ]; then kill -KILL -- "-$pid" 2>/dev/null; sleep 0.1; rm -f "$pidf"; sweep; finish stopped; fi
  if [ $i -ge {ticks} ]; then
    left=$( (pgrep -g "$pid"; engine_pids {root} {int(port)}) | sort -un)
    echo "killed: $(describe_pids $left)"
    main=$(cat {childf} 2>/dev/null); [ -n "$main" ] && alive "$main" && echo wedged  # the runtime itself did not end
    kill -KILL -- "-$pid" 2>/dev/null; sleep 0.2; rm -f "$pidf"; sweep; finish killed
  fi
done
rm -f "$pidf"; sweep; finish stopped
"""
    r = host.run(["bash", "-c", script], timeout=wait + 30)  # bash: /dev/tcp
    lines = r.stdout.strip().splitlines()
    killed = tuple(n.strip() for line in lines if line.startswith("killed: ")
                   for n in line[len("killed: "):].split(", ") if n.strip())
    value = lines[-1] if lines else "stopped"
    if killed and value == "stopped":
        value = "killed"
    return StopResult(value, drained="wedged" not in lines, killed=tuple(dict.fromkeys(killed)))


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
              "port": service_port(cfg, h), "unit": _unit(cfg, h) if h.launcher == "systemd" else ""}
    r = host.run(module_argv(h.python, probe, json.dumps(params)), timeout=timeout)
    facts = json.loads(r.stdout.strip().splitlines()[-1])
    holders, ours = facts["port"]["holders"], set(facts["service"]["pids"])
    first = holders[0] if holders else {}
    value = "free" if not holders else ("runtime" if first.get("pid") in ours else "other")
    return {"value": value, "pid": first.get("pid"), "process": first.get("name"), "pidfile_pid": facts["service"]["pid"]}


def is_running(host, cfg: DeployConfig) -> bool:
    """Whether the runtime's process group (or systemd unit) is alive."""
    h = host.config
    if h.launcher == "systemd":
        # active, or still starting (a Type=notify unit is "activating" until the runtime's READY=1); not the
        # "activating (auto-restart)" pause between two runs of a crash loop
        r = host.sudo(["systemctl", "show", "-p", "ActiveState", "-p", "SubState", _unit(cfg, host.config)], check=False)
        state = dict(line.partition("=")[::2] for line in (r.stdout or "").splitlines())
        return state.get("ActiveState") in ("active", "reloading") or (
            state.get("ActiveState") == "activating" and state.get("SubState", "").startswith("start"))
    pidf = shlex.quote(pid_file(h))
    r = host.run(f'{SH_ALIVE}; {SH_OURS}; [ -f {pidf} ] && p=$(cat {pidf}) && [ -n "$p" ] && '
                 f'kill -0 -- "-$p" 2>/dev/null && group_ours "$p" {shlex.quote(h.deploy_root)}',
                 timeout=30, check=False)
    return r.exit_code == 0


def liveness(host, cfg: DeployConfig, offset: int, *, port: Optional[int] = None) -> tuple[bool, str]:
    """(supervisor alive, first log line since ``offset`` that shows the runtime exiting or "") in one command.
    A runtime that exits while starting is a failed start even when the supervisor would restart it. ``port``:
    the supervisor started on that second port."""
    grep = (f"tail -c +{int(offset) + 1} {shlex.quote(log_file(host.config))} 2>/dev/null | "
            f"grep -m1 -e {' -e '.join(shlex.quote(m) for m in EXIT_MARKERS)} || true")
    if host.config.launcher == "systemd":
        return is_running(host, cfg), host.run(grep, timeout=15).stdout.strip()
    pidf = shlex.quote(spare_pid_file(host.config, port) if port else pid_file(host.config))
    # the supervisor itself, not its process group: a runtime whose supervisor died is not a live service (C30)
    r = host.run(f'{SH_ALIVE}; {SH_OURS}; if [ -f {pidf} ] && ours "$(cat {pidf})" '
                 f'{shlex.quote(host.config.deploy_root)}; then echo alive; else echo dead; fi; ' + grep, timeout=15)
    lines = r.stdout.strip().splitlines()
    return (bool(lines) and lines[0] == "alive"), "\n".join(lines[1:]).strip()


def runtime_pid(host, cfg: DeployConfig) -> Optional[int]:
    """The runtime process's pid (launch.sh's child pidfile, or systemd's MainPID); None when not running."""
    h = host.config
    if h.launcher == "systemd":
        r = host.run(["systemctl", "show", "-p", "MainPID", "--value", _unit(cfg, host.config)], timeout=15, check=False)
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
