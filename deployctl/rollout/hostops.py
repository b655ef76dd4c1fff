"""Operations on one host that deploy, abort and rollback share, and running them on several hosts at once."""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable, Optional

from deployctl import settings
from deployctl.config import DeployConfig
from deployctl.service import launcher
from deployctl.rollout import release
from deployctl.service.verify import Verified, verify


def verify_timeout(cfg: DeployConfig) -> float:
    """Seconds a start may take before verification fails: DEPLOYCTL_VERIFY_TIMEOUT_S, else
    server.startup_timeout_s."""
    return settings.current().verify_timeout_s or cfg.server.startup_timeout_s


def activate(host, cfg: DeployConfig, release_id: str, *, should_stop: Optional[Callable[[], None]] = None,
             on_switch: Optional[Callable[[str], None]] = None) -> Verified:
    """Make ``release_id`` run on ``host``: switch ``current``, install its wheel, stop the old runtime (drain),
    start the new one, verify (ready + sample inference, release header checked). Raises RemoteError (4) or
    HealthError (5); ``should_stop`` may raise to interrupt the wait for readiness."""
    t = [time.monotonic()]
    if on_switch:  # before the switch: if it fails half-way, the abort still looks at this host
        on_switch(host.name)
    release.switch_and_install(host, release_id)
    t.append(time.monotonic())
    launcher.stop(host, cfg)
    t.append(time.monotonic())
    offset = launcher.start(host, cfg)
    t.append(time.monotonic())
    v = verify(host, cfg, timeout=verify_timeout(cfg), expect_release=release_id, should_stop=should_stop,
               log_offset=offset)
    t.append(time.monotonic())
    from deployctl.service.startlog import start_phases

    # seconds per phase: install, stop (drain), start (launcher), ready (start → /readyz 200; the runtime's own
    # boot / load (weights, KV) / warm-up split from its log), verify (the sample inference)
    timings = {"install_s": t[1] - t[0], "stop_s": t[2] - t[1], "start_s": t[3] - t[2], "ready_s": v.ready_s,
               "verify_s": t[4] - t[3] - v.ready_s, **start_phases(host, offset)}
    return replace(v, timings={k: round(max(0.0, x), 2) for k, x in timings.items()})


def activate_beside(host, cfg: DeployConfig, release_id: str, port: int) -> Verified:
    """Start ``release_id`` on ``host`` at ``port`` while the runtime there keeps serving (``current`` switched,
    wheel installed, a second supervisor started, verified there: ready + one short sample inference). The old
    runtime is left running: ``retire`` it once the router sends traffic to ``port``. On failure the new one is
    stopped and ``current`` points back at what still serves, then the error is raised (RemoteError 4 or
    HealthError 5): nothing changed for the clients."""
    was = release.current_release(host)
    t = [time.monotonic()]
    release.switch_and_install(host, release_id)
    t.append(time.monotonic())
    try:
        offset = launcher.start(host, cfg, port=port)
        t.append(time.monotonic())
        v = verify(host, cfg, timeout=verify_timeout(cfg), expect_release=release_id, log_offset=offset, port=port)
    except BaseException:
        try:
            launcher.stop(host, cfg, port=port, beside=True, timeout=5)
        finally:
            if was:
                release.switch_current(host, was)
        raise
    t.append(time.monotonic())
    from deployctl.service.startlog import start_phases

    timings = {"install_s": t[1] - t[0], "stop_s": 0.0, "start_s": t[2] - t[1], "ready_s": v.ready_s,
               "verify_s": t[3] - t[2] - v.ready_s, **start_phases(host, offset)}
    return replace(v, timings={k: round(max(0.0, x), 2) for k, x in timings.items()})


def retire(host, cfg: DeployConfig, port: int, old_port: int) -> float:
    """After the router moved to ``port``: drain and stop the runtime that served on ``old_port``
    (``launcher.stop``), then make the one on ``port`` the service (``launcher.adopt``). Returns the seconds it
    took. Raises RemoteError."""
    t0 = time.monotonic()
    launcher.stop(host, cfg, port=old_port)
    launcher.adopt(host, cfg, port)
    return round(time.monotonic() - t0, 2)


def on_hosts(hosts: list, fn) -> tuple[dict, dict]:
    """Run ``fn(host)`` on every host in parallel. Returns ({name: value}, {name: error})."""
    from deployctl.hosts import run_on_hosts

    if not hosts:
        return {}, {}
    outcomes = run_on_hosts(hosts, fn)
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
