"""The previous release kept asleep on a host's second port (issue 25, docs/DESIGN.md "Rollback: a wake").

With ``hosts[].spare_port``, an engine with a sleep mode (its adapter's ``sleep``) and ``rollout.standby_s`` > 0, a
deploy starts the new release on the port the runtime is not using (``hostops.activate_beside``), verifies it, then
puts the old runtime to sleep instead of stopping it (``POST /sleep?level=1``: KV cache freed, weights offloaded to
host RAM on a GPU) and records it in ``shared/run/standby.json``: ``{"release", "port", "since", "expires_at"}``
(Unix seconds, deployctl's clock); where two copies do not fit on the host's GPU the drained old runtime sleeps
first and the new one starts beside the sleeper. A rollback to that release inside the window wakes it
(``/wake_up``, then one small request) instead of starting it; an abort stops the canary and wakes the old release. A deploy
or rollback that finds a standby of another release, an expired one or one that no longer answers stops it first.

Pidfiles: the sleeping supervisor keeps ``runtime.<port>.pid`` (a copy is made when it was the plain
``runtime.pid``); ``runtime.pid`` links to the serving one's (launcher.adopt).
"""
from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass, replace
from typing import Callable, Optional

from deployctl.config import DeployConfig, layout
from deployctl.engines import standby_enabled
from deployctl.errors import DeployctlError, HealthError
from deployctl.rollout import hostops, release
from deployctl.service import launcher
from deployctl.service import standby as svc
from deployctl.service.verify import Verified, verify


@dataclass(frozen=True)
class Standby:
    release: str
    port: int
    since: float  # Unix seconds
    expires_at: float  # Unix seconds

    @property
    def expired(self) -> bool:
        return time.time() >= self.expires_at

    def to_json(self) -> dict:
        from datetime import datetime, timezone

        iso = datetime.fromtimestamp(self.expires_at, timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
        return {"release": self.release, "port": self.port, "since": self.since, "expires_at": self.expires_at,
                "expires": iso, "expired": self.expired}


def keeps(cfg: DeployConfig, host, release_id: str) -> bool:
    """Whether a deploy of ``release_id`` on ``host`` keeps the old release asleep: standby_s > 0, the engine has a
    sleep mode, and a start beside is possible (process launcher, spare_port, a launch.sh that knows
    DEPLOYCTL_LAUNCH_PORT). Raises RemoteError."""
    if not standby_enabled(cfg):
        return False
    return launcher.supports_beside(host, cfg, layout.release_dir(host.config, release_id))


def read(host) -> Optional[Standby]:
    """The host's standby record, or None (none, or unreadable). Raises RemoteError."""
    r = host.run(f"cat {shlex.quote(layout.standby_file(host.config))} 2>/dev/null || true", timeout=15)
    try:
        d = json.loads(r.stdout)
        return Standby(str(d["release"]), int(d["port"]), float(d["since"]), float(d["expires_at"]))
    except (ValueError, KeyError, TypeError):
        return None


def _write(host, rec: Standby) -> None:
    host.put_text(json.dumps(rec.to_json(), sort_keys=True) + "\n", layout.standby_file(host.config), mode=0o644)


def _clear(host) -> None:
    host.run(["rm", "-f", layout.standby_file(host.config)], timeout=15)


def asleep(host, cfg: DeployConfig, rec: Standby) -> bool:
    """Whether the standby's runtime answers on its port and says it sleeps."""
    return standby_enabled(cfg) and svc.is_sleeping(host, cfg, rec.port) is True


def _do(host, cfg: DeployConfig, action: str, port: int) -> float:
    """svc.sleep / svc.wake on ``port``; the engine's seconds. Raises HealthError with the engine's reason."""
    r = (svc.sleep if action == "sleep" else svc.wake)(host, cfg, port)
    if not r.ok:
        raise HealthError(f"{host.name}: {action} of the runtime on port {port} failed: {r.reason}",
                          fix=f"see the runtime log on {host.name}")
    return r.seconds


def stop(host, cfg: DeployConfig, rec: Standby) -> float:
    """Stop the standby's runtime and forget it. A supervisor that was started as the service removes the
    ``runtime.pid`` link on exit: the serving runtime's link is made again. Returns the seconds. Raises
    RemoteError."""
    t0 = time.monotonic()
    launcher.stop(host, cfg, port=rec.port, beside=True, timeout=5)
    _clear(host)
    active = host.config._active_port
    if active and active != rec.port:
        launcher.adopt(host, cfg, active)
    return round(time.monotonic() - t0, 2)


def _own_pidfiles(host, port: int) -> None:
    """Give the runtime serving on ``port`` pidfiles of its own (``runtime.<port>.pid``) when it has the plain
    ``runtime.pid``, so that ``adopt`` can link runtime.pid to the new one and the sleeper stays stoppable."""
    h = host.config
    q = shlex.quote
    cmds = []
    for plain, own in ((layout.pid_file(h), layout.spare_pid_file(h, port)),
                       (layout.child_pid_file(h), layout.spare_pid_file(h, port, True))):
        cmds.append(f"if [ -f {q(plain)} ] && [ ! -L {q(plain)} ]; then cp {q(plain)} {q(own)}; fi")
    host.run("; ".join(cmds), timeout=15)


def activate(host, cfg: DeployConfig, release_id: str, *, should_stop: Optional[Callable[[], None]] = None,
             on_switch: Optional[Callable[[str], None]] = None,
             say: Optional[Callable[..., None]] = None) -> Verified:
    """Make ``release_id`` run on ``host`` for a deploy: a standby found there is stopped first (the release it
    kept is older than the one now serving); then, when ``keeps``, the new release starts beside the serving one
    and the old one goes to sleep (timings gain ``sleep_s``) — or, where two copies do not fit on the host's GPU
    (rollout.gpufit), the drained old one sleeps first and the new one starts beside the sleeper
    (``_sleep_then_start``); else ``hostops.activate`` (stop, start). A sleep after the start that fails stops the
    old runtime instead (said through ``say``). Raises RemoteError (4) or HealthError (5)."""
    h = host.config
    old = read(host)
    if old is not None:
        stop(host, cfg, old)
        if say:
            say("host", f"{host.name}: stopped the standby of {old.release} (port {old.port})", host=host.name)
    was = release.current_release(host)
    progress = hostops.install_progress(host, say)
    if not was or not keeps(cfg, host, release_id) or not launcher.is_running(host, cfg):
        return hostops.activate(host, cfg, release_id, should_stop=should_stop, on_switch=on_switch,
                                on_progress=progress)
    old_port, new_port = layout.service_port(cfg, h), launcher.beside_port(cfg, h)
    if on_switch:
        on_switch(host.name)
    from deployctl.rollout.gpufit import wake_fit

    fit = wake_fit(host, cfg, None)
    if not fit.beside:
        return _sleep_then_start(host, cfg, was, release_id, old_port, new_port, fit, should_stop, say)
    v = hostops.activate_beside(host, cfg, release_id, new_port, should_stop=should_stop, on_progress=progress)
    _own_pidfiles(host, old_port)
    timings = dict(v.timings)
    try:
        t0 = time.monotonic()
        _do(host, cfg, "sleep", old_port)
        timings["sleep_s"] = round(time.monotonic() - t0, 2)
        now = time.time()
        _write(host, Standby(was, old_port, now, now + cfg.rollout.standby_s))
    except DeployctlError as e:
        launcher.stop(host, cfg, port=old_port, beside=True)
        if say:
            say("warn", f"{host.name}: {was} could not sleep, stopped instead ({e})", host=host.name)
    launcher.adopt(host, cfg, new_port)
    return replace(v, timings=timings)


def _sleep_drained(host, cfg: DeployConfig, port: int) -> float:
    """Sleep the drained runtime on ``port``, retrying while requests are still in flight there (409
    ``requests_in_flight``, up to server.drain_timeout_s). Returns the seconds. Raises HealthError."""
    t0 = time.monotonic()
    end = t0 + max(1.0, cfg.server.drain_timeout_s)
    while True:
        r = svc.sleep(host, cfg, port)
        if r.ok:
            return round(time.monotonic() - t0, 2)
        if r.code != "requests_in_flight" or time.monotonic() > end:
            raise HealthError(f"{host.name}: sleep of the runtime on port {port} failed: {r.reason}",
                              fix=f"see the runtime log on {host.name}")
        time.sleep(0.2)


def _sleep_then_start(host, cfg: DeployConfig, was: str, release_id: str, old_port: int, new_port: int, fit,
                      should_stop, say) -> Verified:
    """Two copies do not fit on the host's GPU (``fit``, rollout.gpufit): the drained old runtime sleeps first
    (its GPU memory freed but the residue), then the new release starts beside it. A start that fails wakes the
    old one again before the error is raised: the host is as it was. Raises RemoteError / HealthError."""
    if say:
        say("host", f"{host.name}: {fit.why}: {was} sleeps before {release_id} starts beside it", host=host.name)
    _own_pidfiles(host, old_port)
    sleep_s = _sleep_drained(host, cfg, old_port)
    try:
        v = hostops.activate_beside(host, cfg, release_id, new_port, should_stop=should_stop,
                                    on_progress=hostops.install_progress(host, say))
    except BaseException:
        _do(host, cfg, "wake", old_port)  # activate_beside stopped the new one: the old one serves as before
        raise
    now = time.time()
    _write(host, Standby(was, old_port, now, now + cfg.rollout.standby_s))
    launcher.adopt(host, cfg, new_port)
    return replace(v, timings={**v.timings, "sleep_s": sleep_s})


def _verify_woken(host, cfg: DeployConfig, rec: Standby, timeout: float) -> Verified:
    """Verify a runtime whose wake answered 2xx: the engines' wake routes answer once the weights and the KV pool
    are back, so the sample request goes first (``ready_s`` 0: no /readyz round trip); an answer other than the
    release's 200 falls back to the full verify (wait for /readyz, then the sample). Raises HealthError."""
    from deployctl.service.verify import sample_inference

    try:
        tokens, got, path = sample_inference(host, cfg, timeout=min(60.0, timeout), port=rec.port)
        if got is None or got == rec.release:
            return Verified(host.name, 0.0, tokens, got, endpoint=path)
    except HealthError:
        pass
    return verify(host, cfg, timeout=timeout, expect_release=rec.release, port=rec.port)


def wake(host, cfg: DeployConfig, rec: Standby, *, timeout: float = 120) -> Verified:
    """Wake the standby and verify it on its port (one small request answered by ``rec.release``; readiness
    waited for only when that fails: ``_verify_woken``). The serving runtime is left alone: ``retire`` once the
    router moved. Timings: wake_s, ready_s, verify_s (seconds). Raises HealthError naming why."""
    t0 = time.monotonic()
    _do(host, cfg, "wake", rec.port)
    t1 = time.monotonic()
    v = _verify_woken(host, cfg, rec, timeout)
    t2 = time.monotonic()
    golden_s = hostops.golden_check(host, cfg, rec.release, rec.port, "after the wake")
    return replace(v, timings={"wake_s": round(t1 - t0, 2), "ready_s": round(v.ready_s, 2),
                               "verify_s": round(max(0.0, t2 - t1 - v.ready_s), 2), "golden_s": golden_s})


def retire(host, cfg: DeployConfig, rec: Standby) -> float:
    """After the router moved to the woken standby: ``current`` to its release (wheel installed when it differs),
    the serving runtime drained and stopped, the woken one made the service, the record cleared. Returns the
    seconds. Raises RemoteError."""
    t0 = time.monotonic()
    release.switch_and_install(host, rec.release)
    launcher.stop(host, cfg)
    launcher.adopt(host, cfg, rec.port)
    _clear(host)
    return round(time.monotonic() - t0, 2)


def wake_back(host, cfg: DeployConfig, rec: Standby, *, timeout: float = 120) -> Verified:
    """Abort on a drained canary host: stop the new release first (on a GPU it holds the memory the wake needs),
    then wake the standby, verify it, make it current and the service. Raises HealthError / RemoteError."""
    t0 = time.monotonic()
    launcher.stop(host, cfg)
    t1 = time.monotonic()
    v = wake(host, cfg, rec, timeout=timeout)
    release.switch_and_install(host, rec.release)
    launcher.adopt(host, cfg, rec.port)
    _clear(host)
    return replace(v, timings={"stop_s": round(t1 - t0, 2), **v.timings})


def restore(host, cfg: DeployConfig, release_id: str, *, say: Optional[Callable[..., None]] = None) -> Verified:
    """Put ``release_id`` back on ``host`` (abort): by waking its standby when one sleeps there, else (a standby
    of another release stopped first) ``hostops.activate``. A wake that fails falls back to the start, said
    through ``say``. Raises RemoteError / HealthError."""
    rec = read(host)
    if rec is not None and rec.release == release_id and asleep(host, cfg, rec):
        try:
            return wake_back(host, cfg, rec)
        except DeployctlError as e:
            if say:
                say("warn", f"{host.name}: waking {release_id} failed ({e}); starting it instead", host=host.name)
    if read(host) is not None:
        stop(host, cfg, read(host))
    return hostops.activate(host, cfg, release_id, golden="after the abort's restart")
