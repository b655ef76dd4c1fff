"""One engine on one host: the handle every verb deployctl sends an engine goes through (issue 39).

As fabric's Connection is one host's, an ``Engine`` is one engine instance's on that host: its ``port`` (where it
answers: the serving port by default, the standby's or a start-beside's when given), the ``release`` it must run,
its ``replica`` index (deploy.yaml's ``hosts[].replicas``) and ``role`` (serving, canary, standby), and its verbs:

- ``http``: one request to it, made on its host (service/http.py's probe: loopback binds included);
- ``identity`` / ``expect``: who answers on the port (GET /identity: release, replica, instance), and the check that
  comes before every control call: a mismatch is refused naming expected and found, nothing sent;
- ``sleep`` / ``wake`` / ``is_sleeping``: the engine adapter's sleep mode (service/standby.py has the results);
- ``wait_ready`` / ``sample`` / ``verify``: readiness and a sample inference (service/verify.py has the result);
- ``start`` / ``stop`` / ``running`` / ``liveness``: its supervisor (service/launcher.py: launch.sh or systemd).

Making one costs nothing (no remote call); the port is read from the host's ``config`` when not given
(``layout.service_port``: a rollback may have left the serving runtime on ``spare_port``).
"""
from __future__ import annotations

import json
import posixpath
import shlex
import time
from typing import Callable, Optional

from deployctl.config import DeployConfig, layout
from deployctl.config.layout import (child_pid_file, current_link, log_file, pid_file, runtime_address, service_port,
                                     shared_dir, spare_pid_file)
from deployctl.engines import adapter, of
from deployctl.hostscripts.snippets import SH_ALIVE, SH_ENGINE_PIDS, SH_OURS
from deployctl.service.launcher import (EXIT_MARKERS, StopResult, adopt, clean_env_prefix, log_size, remember_port,
                                        unit_of)
from deployctl.service.http import HttpResult, api_key, request
from deployctl.service.identity import INSTANCE_HEADER, Identity, IdentityMismatch
from deployctl.service.standby import SLEEP_TIMEOUT_S, WAKE_TIMEOUT_S, SleepResult, sleep_mode, sleep_result
from deployctl.service.verify import CHAT, COMPLETIONS, RELEASE_HEADER, Verified, fail, no_chat_template


class Engine:
    """One engine instance on ``host`` (deployctl.hosts.Host) of the service ``cfg`` (module doc). ``port`` None:
    the port the host's runtime serves on now; ``beside``: the supervisor started on ``port`` beside the serving
    one (its own pidfiles, ``layout.spare_pid_file``)."""

    def __init__(self, host, cfg: DeployConfig, port: Optional[int] = None, *, release: Optional[str] = None,
                 role: str = "serving", beside: bool = False):
        self.host, self.cfg = host, cfg
        self._port = int(port) if port else None
        self.release, self.role, self.beside = release, role, beside

    def __repr__(self) -> str:
        return f"Engine({self.host.name}:{self.port}, release={self.release}, replica={self.replica}, {self.role})"

    @property
    def name(self) -> str:
        return self.host.name

    @property
    def port(self) -> int:
        return self._port or layout.service_port(self.cfg, self.host.config)

    @property
    def replica(self) -> int:
        """The replica index deploy.yaml gives this host entry (0 when it has none)."""
        return getattr(self.host.config, "replica", None) or 0

    # ------------------------------------------------------------------------------------------ HTTP
    def http(self, method: str, path: str, body=None, *, timeout: float = 10) -> HttpResult:
        """One HTTP request (``body``: JSON-serialisable or None) to this engine, made on its host within
        ``timeout`` seconds; the API key (server.api_key_env, else the release's runtime.env) sent. Connection
        failures are a status of 0 with ``error``. Raises RemoteError (SSH trouble)."""
        h = self.host.config
        return request(self.host, layout.base_url(self.cfg, h, self.port) + path, method, body, timeout=timeout,
                       key=api_key(self.cfg), env_file=f"{layout.current_link(h)}/runtime.env")

    # ------------------------------------------------------------------------------------------ identity
    def identity(self, *, timeout: float = 10) -> Identity:
        """What the engine on the port says it is: GET /identity; without that route the release header of
        /healthz (``source`` "header"), or nothing ("none"). Raises RemoteError."""
        r = self.http("GET", "/identity", timeout=timeout)
        if r.status == 200:
            try:
                d = r.json()
                replica = d.get("replica")
                return Identity(self.port, d.get("release") or None, int(replica) if replica is not None else None,
                                d.get("instance") or None, int(d["pid"]) if d.get("pid") else None, d.get("phase"),
                                "route")
            except (ValueError, TypeError, AttributeError):
                pass
        h = self.http("GET", "/healthz", timeout=timeout)
        release = h.header(RELEASE_HEADER)
        if release or h.status:
            return Identity(self.port, release, instance=h.header(INSTANCE_HEADER),
                            source="header" if release else "none")
        return Identity(self.port)

    def holder(self, *, timeout: float = 30) -> Optional[str]:
        """For an engine without /identity: None when the process listening on the port belongs to the supervisor
        deployctl started there (``runtime.<port>.pid``'s process group, or ``runtime.pid``'s on the configured
        port; the systemd unit's cgroup), or nothing listens; else that process in words ("pid 4242 (python3)").
        Raises RemoteError."""
        from deployctl.hostscripts import probe
        from deployctl.hostscripts.snippets import module_argv

        h, port = self.host.config, self.port
        files = [layout.spare_pid_file(h, port)] + ([layout.pid_file(h)]
                                                     if port == layout.configured_port(self.cfg, h) else [])
        unit = layout.unit_name(self.cfg, h) if h.launcher == "systemd" else ""
        params = {"sections": ["port", "pids", "service"], "bind": self.cfg.server.bind, "port": port,
                  "pid_files": files, "deploy_root": "", "unit": unit}
        r = self.host.run(module_argv(h.python, probe, json.dumps(params)), timeout=timeout)
        facts = json.loads(r.stdout.strip().splitlines()[-1])
        ours = {p for pids in facts["pids"].values() for p in pids} | set(facts["service"]["pids"])
        others = [x for x in facts["port"]["holders"] if x.get("pid") and x["pid"] not in ours]
        return ", ".join(f"pid {x['pid']} ({x.get('name') or '?'})" for x in others) or None

    def _expected(self) -> str:
        parts = [f"{self.name}'s engine", f"release {self.release or 'any'}"]
        if getattr(self.host.config, "replica", None) is not None:
            parts.append(f"replica {self.replica}")
        return ", ".join(parts)

    def expect(self, action: str) -> Identity:
        """Check, before ``action`` ("sleep", "wake", "drain", "stop") is sent, that the engine on the port is
        this host's (its replica index) and runs ``release`` (None: any); an engine without the /identity route
        must at least hold the port from the supervisor deployctl started there (``holder``). Returns what was
        found. Raises IdentityMismatch (exit 5) naming both, RemoteError on SSH trouble."""
        found = self.identity()
        fix = (f"the host's run files on {self.name} point at another engine's port (shared/run/*.pid, "
               "standby.json); check `deployctl status` and each engine's GET /identity, then run the command again")
        if found.source != "route":
            other = self.holder()
            if other:
                raise IdentityMismatch(
                    f"{self.name}: refusing to {action} the engine on port {self.port}: expected {self._expected()} "
                    f"(the process deployctl started there), found {other} holding the port; nothing was sent to it",
                    expected=self._expected(), found=other,
                    fix=f"see who that is on {self.name} (`ss -ltnp`); stop it, or fix deploy.yaml's ports")
        wrong = []
        if self.release and found.release and found.release != self.release:
            wrong.append("release")
        if found.replica is not None and found.replica != self.replica:
            wrong.append("replica")
        if wrong:
            raise IdentityMismatch(
                f"{self.name}: refusing to {action} the engine on port {self.port}: expected {self._expected()}, "
                f"found {found.describe()} ({' and '.join(wrong)} differ); nothing was sent to it",
                expected=self._expected(), found=found.describe(), fix=fix)
        return found

    # ------------------------------------------------------------------------------------------ sleep mode
    def _sleep_call(self, route: tuple[str, str], action: str, timeout: float) -> SleepResult:
        self.expect(action)
        method, path = route
        # SGLang's release/resume routes read a JSON body (tags optional); the others take none
        body = {} if self.cfg.engine.kind == "sglang" else None
        return sleep_result(action, self.http(method, path, body, timeout=timeout), path)

    def sleep(self, *, timeout: float = SLEEP_TIMEOUT_S) -> SleepResult:
        """Level 1 (weights to host RAM, KV cache discarded), after ``expect``. An HTTP refusal is ``ok`` False
        with the engine's reason (409 requests_in_flight...). Raises ConfigError for an engine without a sleep
        mode, IdentityMismatch when another engine holds the port, RemoteError on SSH trouble."""
        return self._sleep_call(sleep_mode(self.cfg).sleep, "sleep", timeout)

    def wake(self, *, timeout: float = WAKE_TIMEOUT_S) -> SleepResult:
        """Weights back on the GPU, a new (empty) KV pool, after ``expect``. A wake that no longer fits is ``ok``
        False with the engine's reason (503 gpu_memory_exhausted). Raises as ``sleep``."""
        return self._sleep_call(sleep_mode(self.cfg).wake, "wake", timeout)

    def is_sleeping(self, *, timeout: float = 10) -> Optional[bool]:
        """True / False from the engine's state route; None when it has none or gave no usable answer. Raises
        ConfigError for an engine without a sleep mode, RemoteError on SSH trouble."""
        route = sleep_mode(self.cfg).state
        if route is None:
            return None
        r = self.http(route[0], route[1], timeout=timeout)
        if r.status != 200:
            return None
        try:
            value = json.loads(r.body).get("is_sleeping")
        except (ValueError, AttributeError):
            return None
        return value if isinstance(value, bool) else None

    # ------------------------------------------------------------------------------------------ readiness
    def _check_device(self, ready: HttpResult) -> None:
        """The runtime's /readyz says where it runs (device, device_name, dtype; older runtimes say nothing and
        pass). Raises HealthError when it is not the engine.device deploy.yaml asked for (cuda asked, cpu
        running)."""
        if not of(self.cfg).config_file:
            return  # a foreign engine's readiness route says nothing about its device
        try:
            body = ready.json()
        except ValueError:
            return
        got = body.get("device") if isinstance(body, dict) else None
        if got is not None and got != self.cfg.engine.device:
            raise fail(self.host, f"runs on {got} ({body.get('device_name') or 'unknown device'}, {body.get('dtype')}) "
                                  f"but deploy.yaml asks for engine.device {self.cfg.engine.device}")

    def ready_answer(self) -> HttpResult:
        """GET the readiness route: the bundled runtime's /readyz first (a host may still run a release of another
        engine, e.g. while an engine switch is restored), the configured engine's route when that route is unknown
        (404): vLLM, SGLang and transformers serve /health (the runtime's /health, too, is 503 until it serves)."""
        first = adapter("deployctl-runtime").ready_route
        r = self.http("GET", first, timeout=3)
        a = of(self.cfg)
        if r.status == 404 and a.ready_route != first:  # SGLang's /health runs a generation: its probe_timeout_s
            r = self.http("GET", a.ready_route, timeout=max(3, a.probe_timeout_s))
        return r

    def wait_ready(self, *, timeout: float, should_stop: Callable[[], None] | None = None,
                   log_offset: Optional[int] = None, deadline_why: str = "") -> float:
        """Poll the readiness route until 200, every 0.15 s (the supervisor's liveness every third poll). Calls
        ``should_stop()`` between polls (it raises to interrupt). Returns the seconds waited. Raises HealthError on
        timeout (naming ``deadline_why``, the derivation of a multi-GPU start's deadline, when given), or when the
        runtime exits (its log since ``log_offset`` shows an exit, or the process group is gone)."""
        t0 = time.monotonic()
        last = ""
        polls = 0
        while True:
            if should_stop:
                should_stop()
            r = self.ready_answer()
            if r.status == 200:
                self._check_device(r)
                return time.monotonic() - t0
            last = f"HTTP {r.status}" if r.status else (r.error or "no answer")
            polls += 1
            if log_offset is not None and polls % 3 == 1:
                alive, crash = self.liveness(log_offset)
                if crash:
                    raise fail(self.host, f"the runtime exited while starting ({crash[:200]})")
                if not alive:
                    raise fail(self.host, f"the runtime is not running (last /readyz: {last})")
            if time.monotonic() - t0 > timeout:
                if deadline_why:  # alive, silent, never ready: what a hung NCCL rendezvous looks like
                    raise fail(self.host, f"not ready after {timeout:.0f} s, {deadline_why}; the engine is still "
                                          f"running but never became ready (a hung NCCL init?; last readiness "
                                          f"answer: {last})",
                               fix="see the log; run the engine with NCCL_DEBUG=INFO, check `nvidia-smi topo -m` "
                                   "and that no earlier rank holds one of the GPUs")
                raise fail(self.host, f"not ready after {timeout:.0f} s (last /readyz: {last})")
            time.sleep(0.15)

    def sample(self, *, timeout: float = 30) -> tuple[int, Optional[str], str]:
        """One short chat completion; /v1/completions when the model has no chat template. Returns (completion
        tokens, release header, endpoint path). Raises HealthError."""
        body = of(self.cfg).sample_body(self.cfg.model.name)
        path = CHAT
        r = self.http("POST", path, body, timeout=timeout)
        if no_chat_template(r):
            path = COMPLETIONS
            common = {k: v for k, v in body.items() if k != "messages"}
            r = self.http("POST", path, {**common, "prompt": "Hello"}, timeout=timeout)
        if r.status != 200:
            detail = r.body[:300] if r.body else r.error
            raise fail(self.host, f"sample inference ({path}) failed: HTTP {r.status} {detail}")
        try:
            data = r.json()
            tokens = int((data.get("usage") or {}).get("completion_tokens") or 0)
            choice = data["choices"][0]
            text = choice["message"].get("content") if path == CHAT else choice.get("text")
            if not tokens and text:
                tokens = 1
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            raise fail(self.host, f"sample inference answered 200 with an unexpected body: {r.body[:200]}") from None
        if tokens < 1:
            raise fail(self.host, "sample inference returned no tokens")
        return tokens, r.header(RELEASE_HEADER), path

    def verify(self, *, timeout: float = 120, should_stop: Callable[[], None] | None = None,
               log_offset: Optional[int] = None, deadline_why: str = "") -> Verified:
        """Readiness then a sample inference; with ``release`` set the answer's release header must match.
        Raises HealthError."""
        ready_s = self.wait_ready(timeout=timeout, should_stop=should_stop, log_offset=log_offset,
                                  deadline_why=deadline_why)
        tokens, release, path = self.sample(timeout=min(60.0, timeout))
        if self.release and release and release != self.release:
            raise fail(self.host, f"serves release {release}, expected {self.release}")
        return Verified(self.name, ready_s, tokens, release, endpoint=path)

    # ------------------------------------------------------------------------------------------ supervisor
    def start(self) -> int:
        """Start the release ``current`` points at (launch.sh for ``launcher: process``, systemctl for ``launcher:
        systemd``). Returns the log size before the start (for ``liveness``). ``beside`` (process launcher, a release
        whose launch.sh ``launcher.supports_beside``): a second supervisor serving on this ``port`` beside the running one (``DEPLOYCTL_LAUNCH_PORT``), its pidfiles ``layout.spare_pid_file``; ``adopt`` makes it
        the service once the old one is stopped. Without ``port``: pidfile links left dangling by a stopped
        second-port runtime are removed first (a new supervisor must not write through them). Raises RemoteError."""
        host, cfg, port = self.host, self.cfg, (self._port if self.beside else None)
        h = host.config
        cur = current_link(h)
        if h.launcher == "systemd":
            offset = log_size(host)
            unit = unit_of(cfg, h)
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
            remember_port(h, lines[1] if len(lines) > 1 else "")
        try:
            return int(lines[0])
        except (ValueError, IndexError):
            return 0

    def start_in_place(self) -> int:
        """Start the release ``current`` points at on the port the host's runtime serves on (``layout.service_port``):
        after a rollback onto ``spare_port`` that is the spare port — nginx and the readiness checks point there — so
        the runtime starts there (a supervisor with DEPLOYCTL_LAUNCH_PORT) and is adopted as the service; else a
        plain ``start`` on the configured port. For runbooks restarting a runtime where it was; a deploy's ``start``
        returns to the configured port instead. Returns the log size before the start. Raises RemoteError."""
        h = self.host.config
        port = service_port(self.cfg, h)
        if h.launcher != "process" or port == layout.configured_port(self.cfg, h):
            return Engine(self.host, self.cfg).start()
        offset = Engine(self.host, self.cfg, port, beside=True).start()
        adopt(self.host, self.cfg, port)
        return offset

    def stop(self, *, timeout: float | None = None) -> StopResult:
        """Stop the runtime: SIGTERM to the supervisor (the runtime drains: /readyz 503, in-flight requests finish),
        then wait for the process group to exit, up to engines.command.stop_wait_s (server.drain_timeout_s + the
        engine's exit after its drain) + 5 s unless ``timeout``, then
        SIGKILL. Once the runtime's port stops accepting connections the drain is over (the listener closes after the
        last request) and what is left of the process group is killed rather than waited for. Then the engine's
        processes outside the group (marked by launch.sh: hostscripts.snippets SH_ENGINE_PIDS, deploy root and
        ``port``) get SIGKILL too, also when the pidfile names no live group (a supervisor killed with its group
        leader gone, a worker that called setsid).
        ``port``: the port that runtime listens on (default: the one it serves on); ``beside``: the supervisor
        started on ``port`` beside the service (``start`` of a beside engine) rather than the service's own.
        Returns a StopResult: "stopped", "killed" (the drain bound passed, or leftovers outside the group were
        killed; ``.killed`` names them, ``.drained`` says which) or "not running". Raises RemoteError."""
        host, cfg, port, beside = self.host, self.cfg, self._port, self.beside
        h = host.config
        from deployctl.engines.command import stop_wait_s

        wait = stop_wait_s(cfg) + 5 if timeout is None else timeout
        if h.launcher == "systemd":
            host.sudo(["systemctl", "stop", unit_of(cfg, host.config)], timeout=wait + 30)
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

    def running(self) -> bool:
        """Whether the runtime's process group (or systemd unit) is alive."""
        host, cfg = self.host, self.cfg
        h = host.config
        if h.launcher == "systemd":
            # active, or still starting (a Type=notify unit is "activating" until the runtime's READY=1); not the
            # "activating (auto-restart)" pause between two runs of a crash loop
            r = host.sudo(["systemctl", "show", "-p", "ActiveState", "-p", "SubState", unit_of(cfg, host.config)], check=False)
            state = dict(line.partition("=")[::2] for line in (r.stdout or "").splitlines())
            return state.get("ActiveState") in ("active", "reloading") or (
                state.get("ActiveState") == "activating" and state.get("SubState", "").startswith("start"))
        pidf = shlex.quote(pid_file(h))
        r = host.run(f'{SH_ALIVE}; {SH_OURS}; [ -f {pidf} ] && p=$(cat {pidf}) && [ -n "$p" ] && '
                     f'kill -0 -- "-$p" 2>/dev/null && group_ours "$p" {shlex.quote(h.deploy_root)}',
                     timeout=30, check=False)
        return r.exit_code == 0

    def liveness(self, offset: int) -> tuple[bool, str]:
        """(supervisor alive, first log line since ``offset`` that shows the runtime exiting or "") in one command.
        A runtime that exits while starting is a failed start even when the supervisor would restart it. ``beside``:
        the supervisor started on this second port."""
        host, port = self.host, (self._port if self.beside else None)
        grep = (f"tail -c +{int(offset) + 1} {shlex.quote(log_file(host.config))} 2>/dev/null | "
                f"grep -m1 -e {' -e '.join(shlex.quote(m) for m in EXIT_MARKERS)} || true")
        if host.config.launcher == "systemd":
            return self.running(), host.run(grep, timeout=15).stdout.strip()
        pidf = shlex.quote(spare_pid_file(host.config, port) if port else pid_file(host.config))
        # the supervisor itself, not its process group: a runtime whose supervisor died is not a live service (C30)
        r = host.run(f'{SH_ALIVE}; {SH_OURS}; if [ -f {pidf} ] && ours "$(cat {pidf})" '
                     f'{shlex.quote(host.config.deploy_root)}; then echo alive; else echo dead; fi; ' + grep, timeout=15)
        lines = r.stdout.strip().splitlines()
        return (bool(lines) and lines[0] == "alive"), "\n".join(lines[1:]).strip()
