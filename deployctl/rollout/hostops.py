"""Operations on one host that deploy, abort and rollback share, and running them on several hosts at once."""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable, Optional

from deployctl import settings
from deployctl.config import DeployConfig
from deployctl.config.layout import service_port
from deployctl.service import launcher
from deployctl.rollout import kvrecord, release
from deployctl.service.engine import Engine
from deployctl.service.verify import Verified


def checkpoint_bytes(host, cfg: DeployConfig) -> Optional[int]:
    """Bytes of the model directory on ``host`` (``du -sbL``: apparent size, symlinks followed as in a Hugging
    Face cache snapshot); None when it cannot be read."""
    import shlex

    r = host.run(f"du -sbL {shlex.quote(cfg.model.path)} 2>/dev/null | cut -f1", timeout=30, check=False)
    try:
        return int(r.stdout.strip().splitlines()[0])
    except (ValueError, IndexError):
        return None


def verify_timeout(cfg: DeployConfig, host=None) -> tuple[float, str]:
    """(seconds a start may take before verification fails, why): DEPLOYCTL_VERIFY_TIMEOUT_S, else for a
    multi-GPU start (tensor_parallel_size > 1) on ``host`` the deadline derived from the plan's load time
    (deployctl.engines.startup: 2 × (120 s + checkpoint bytes / 125 MiB/s), at most server.startup_timeout_s),
    else server.startup_timeout_s. ``why`` is "" or the deadline's derivation for the failure message."""
    override = settings.current().verify_timeout_s
    if override:
        return override, ""
    cap = cfg.server.startup_timeout_s
    tp = cfg.engine.tensor_parallel_size
    nbytes = checkpoint_bytes(host, cfg) if tp > 1 and host is not None else None
    if nbytes is None:
        return cap, ""
    from deployctl.engines.startup import describe, start_deadline_s

    return start_deadline_s(nbytes, cap), (f"a multi-GPU start (tensor_parallel_size {tp}, GPUs "
                                           f"{','.join(map(str, host.config.gpu_ids))}): {describe(nbytes, cap)}")


# an engine install's progress (pip's lines): one shown per host at most this often, besides its first, its
# errors and its end (8 hosts installing vLLM at once print ~200 lines each)
INSTALL_PROGRESS_EVERY_S = 10.0


def install_progress(host, say: Optional[Callable[..., None]]) -> Optional[Callable[[str], None]]:
    """The ``on_progress`` of release.switch_and_install that tells ``say`` how ``host``'s engine install goes:
    the first line, every error, "Successfully installed ...", and otherwise one line per
    INSTALL_PROGRESS_EVERY_S with the count of lines since the last one shown. None without ``say``."""
    if say is None:
        return None
    last, skipped = [0.0], [0]

    def show(line: str) -> None:
        now = time.monotonic()
        always = not last[0] or "error" in line.lower() or line.startswith(("Successfully", "installing "))
        if not always and now - last[0] < INSTALL_PROGRESS_EVERY_S:
            skipped[0] += 1
            return
        more = f" (+{skipped[0]} lines)" if skipped[0] else ""
        last[0], skipped[0] = now, 0
        say("host", f"{host.name}: engine install: {line}{more}", host=host.name)

    return show


def activate(host, cfg: DeployConfig, release_id: str, *, should_stop: Optional[Callable[[], None]] = None,
             on_switch: Optional[Callable[[str], None]] = None,
             on_progress: Optional[Callable[[str], None]] = None, golden: str = "") -> Verified:
    """Make ``release_id`` run on ``host``: switch ``current``, install its wheel (and a pinned engine the host
    lacks: its lines to ``on_progress``, ``install_progress``), stop the old runtime (drain), start the new one,
    verify (ready + sample inference, release header checked), record the engine's own KV statement against the
    plan (kvrecord: ``<release>/allocated.json``, never fails the start). ``golden`` (where this start happens, in words:
    "after the rollback's cold start"): then ask the release's recorded golden answers too (goldenrecord.check,
    timing ``golden_s``). Raises RemoteError (4) or HealthError (5; goldenrecord.GoldenMismatch when the answers
    differ: the engine is left running, the caller gives it no weight); ``should_stop`` may raise to interrupt the
    wait for readiness."""
    t = [time.monotonic()]
    if on_switch:  # before the switch: if it fails half-way, the abort still looks at this host
        on_switch(host.name)
    release.switch_and_install(host, release_id, timeout=cfg.engine.install_timeout_s, on_progress=on_progress)
    t.append(time.monotonic())
    Engine(host, cfg).stop()
    t.append(time.monotonic())
    new = Engine(host, cfg, release=release_id)
    offset = new.start()
    t.append(time.monotonic())
    timeout, why = verify_timeout(cfg, host)
    v = new.verify(timeout=timeout, should_stop=should_stop, log_offset=offset, deadline_why=why)
    t.append(time.monotonic())
    from deployctl.service.startlog import start_phases

    # seconds per phase: install, stop (drain), start (launcher), ready (start → /readyz 200; the runtime's own
    # boot / load (weights, KV) / warm-up split from its log), verify (the sample inference)
    timings = {"install_s": t[1] - t[0], "stop_s": t[2] - t[1], "start_s": t[3] - t[2], "ready_s": v.ready_s,
               "verify_s": t[4] - t[3] - v.ready_s, **start_phases(host, offset)}
    kvrecord.record(host, cfg, release_id, offset)  # what the engine allocated vs the plan (status reads it)
    if golden:
        timings["golden_s"] = golden_check(host, cfg, release_id, service_port(cfg, host.config), golden)
    return replace(v, timings={k: round(max(0.0, x), 2) for k, x in timings.items()})


def golden_check(host, cfg: DeployConfig, release_id: str, port: int, when: str) -> float:
    """goldenrecord.check of the engine on ``port``; returns its seconds. Raises GoldenMismatch (HealthError)."""
    from deployctl.rollout import goldenrecord

    t0 = time.monotonic()
    goldenrecord.check(host, cfg, release_id, port, when=when)
    return round(time.monotonic() - t0, 2)


def activate_beside(host, cfg: DeployConfig, release_id: str, port: int, *,
                    should_stop: Optional[Callable[[], None]] = None,
                    on_progress: Optional[Callable[[str], None]] = None, golden: str = "") -> Verified:
    """Start ``release_id`` on ``host`` at ``port`` while the runtime there keeps serving (``current`` switched,
    wheel installed, a second supervisor started, verified there: ready + one short sample inference). The old
    runtime is left running: ``retire`` it once the router sends traffic to ``port``. On failure the new one is
    stopped and ``current`` points back at what still serves, then the error is raised (RemoteError 4 or
    HealthError 5): nothing changed for the clients. ``golden``: as ``activate``'s, inside that guard (answers
    that differ stop the new one too)."""
    was = release.current_release(host)
    t = [time.monotonic()]
    release.switch_and_install(host, release_id, timeout=cfg.engine.install_timeout_s, on_progress=on_progress)
    t.append(time.monotonic())
    new = Engine(host, cfg, port, release=release_id, beside=True)
    try:
        offset = new.start()
        t.append(time.monotonic())
        timeout, why = verify_timeout(cfg, host)
        v = new.verify(timeout=timeout, log_offset=offset, deadline_why=why, should_stop=should_stop)
        golden_s = golden_check(host, cfg, release_id, port, golden) if golden else None
    except BaseException:
        try:
            new.stop(timeout=5)
        finally:
            if was:
                release.switch_current(host, was)
        raise
    t.append(time.monotonic())
    from deployctl.service.startlog import start_phases

    timings = {"install_s": t[1] - t[0], "stop_s": 0.0, "start_s": t[2] - t[1], "ready_s": v.ready_s,
               "verify_s": t[3] - t[2] - v.ready_s, **start_phases(host, offset)}
    kvrecord.record(host, cfg, release_id, offset)
    if golden_s is not None:
        timings["golden_s"] = golden_s
        timings["verify_s"] -= golden_s
    return replace(v, timings={k: round(max(0.0, x), 2) for k, x in timings.items()})


def retire(host, cfg: DeployConfig, port: int, old_port: int) -> float:
    """After the router moved to ``port``: drain and stop the runtime that served on ``old_port``
    (``launcher.stop``), then make the one on ``port`` the service (``launcher.adopt``). Returns the seconds it
    took. Raises RemoteError."""
    t0 = time.monotonic()
    Engine(host, cfg, old_port).stop()
    launcher.adopt(host, cfg, port)
    return round(time.monotonic() - t0, 2)


# seconds a group of quick remote reads/writes (state, current, ports) may take before a host is named and left out
QUICK_DEADLINE_S = 120.0


def activate_deadline_s(cfg: DeployConfig) -> float:
    """Seconds ``activate`` may take on one host before the group goes on without it: the sum of the timeouts of
    the remote calls it makes — switch + install (release.switch_and_install: engine.install_timeout_s + 30 s), stop
    (engines.command.stop_wait_s + 5 s + 30 s, launcher.stop), start (30 s), the readiness wait (server.startup_timeout_s, the cap of verify_timeout or
    DEPLOYCTL_VERIFY_TIMEOUT_S) — plus 60 s for the sample inference and the log reads."""
    verify_s = max(settings.current().verify_timeout_s or 0, cfg.server.startup_timeout_s)
    from deployctl.engines.command import stop_wait_s

    return cfg.engine.install_timeout_s + 30 + (stop_wait_s(cfg) + 35) + 30 + verify_s + 60


def on_hosts(hosts: list, fn, *, workers: int, deadline_s: Optional[float] = None,
             what: str = "") -> tuple[dict, dict]:
    """Run ``fn(host)`` on every host in parallel, at most ``workers`` at once (rollout.parallel_hosts), bounded by
    ``deadline_s`` per host from its own start (deployctl.hosts.run_on_hosts: a host that misses it gets a
    HostDeadline error naming it, and its worker goes to the next host). Returns ({name: value}, {name: error})."""
    from deployctl.hosts import run_on_hosts

    if not hosts:
        return {}, {}
    outcomes = run_on_hosts(hosts, fn, max_workers=workers, deadline_s=deadline_s, what=what)
    ok = {o.host: o.value for o in outcomes if o.error is None}
    bad = {o.host: o.error for o in outcomes if o.error is not None}
    return ok, bad


def sleep_checking(seconds: float, check: Callable[[], None], tick: float = 0.25) -> None:
    """Sleep ``seconds`` while calling ``check()`` every ``tick`` seconds (it raises to interrupt)."""
    end = time.monotonic() + seconds
    while True:
        check()
        left = end - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(tick, left))
