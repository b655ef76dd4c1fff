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
from deployctl.errors import CheckFailed, DeployctlError, HealthError
from deployctl.rollout import hostops, release
from deployctl.service import launcher
from deployctl.service.engine import Engine
from deployctl.service.verify import Verified


@dataclass(frozen=True)
class Standby:
    release: str
    port: int
    since: float  # Unix seconds
    expires_at: float  # Unix seconds
    # rollout.residue.Residue.to_json(): {"residue_bytes": {"<gpu>": bytes}, "measured": {"how", "reads", "seconds",
    # "stable", "free_bytes"}, "engine_resident_bytes"?}; None: not measured (a record of an older deployctl)
    residue: Optional[dict] = None

    @property
    def expired(self) -> bool:
        return time.time() >= self.expires_at

    @property
    def residue_bytes(self) -> Optional[dict]:
        """The measured residue per GPU (``{"<gpu>": bytes}``), None when not measured."""
        rb = (self.residue or {}).get("residue_bytes")
        return rb or None

    def to_json(self) -> dict:
        from datetime import datetime, timezone

        iso = datetime.fromtimestamp(self.expires_at, timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
        return {"release": self.release, "port": self.port, "since": self.since, "expires_at": self.expires_at,
                "expires": iso, "expired": self.expired, **(self.residue or {"residue_bytes": None})}


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
        residue = {k: d[k] for k in ("residue_bytes", "measured", "engine_resident_bytes") if d.get(k) is not None}
        return Standby(str(d["release"]), int(d["port"]), float(d["since"]), float(d["expires_at"]),
                       residue if residue.get("residue_bytes") else None)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def _write(host, rec: Standby) -> None:
    host.put_text(json.dumps(rec.to_json(), sort_keys=True) + "\n", layout.standby_file(host.config), mode=0o644)
    host.run(["rm", "-f", _none_file(host.config)], timeout=15)


def _clear(host) -> None:
    host.run(["rm", "-f", layout.standby_file(host.config)], timeout=15)


def _none_file(h) -> str:
    """Why the last deploy on the host made no standby: shared/run/no-standby.json."""
    return layout.no_standby_file(h)


def note_none(host, release_id: str, why: str, residue: Optional[dict] = None) -> None:
    """Record that ``release_id`` was not kept asleep on ``host`` and why (``status`` shows "no standby: <why>"); a
    residue measured on the way (Residue.to_json) is kept for the next deploy's fit. Raises RemoteError."""
    doc = {"release": release_id, "why": why, "at": time.time(), **(residue or {})}
    host.put_text(json.dumps(doc, sort_keys=True) + "\n", _none_file(host.config), mode=0o644)


def read_none(host) -> Optional[dict]:
    """The host's no-standby note (``{"release", "why", "at", "residue_bytes"?, ...}``), or None. Raises
    RemoteError."""
    r = host.run(f"cat {shlex.quote(_none_file(host.config))} 2>/dev/null || true", timeout=15)
    try:
        d = json.loads(r.stdout)
        return d if isinstance(d, dict) and d.get("why") else None
    except ValueError:
        return None


def recorded_residue(host, rec: Optional[Standby] = None) -> Optional[dict]:
    """The residue per GPU measured at this host's last sleep (the standby record ``rec``, else the no-standby
    note), or None. Raises RemoteError."""
    if rec is not None and rec.residue_bytes:
        return rec.residue_bytes
    note = read_none(host)
    rb = (note or {}).get("residue_bytes")
    return rb if isinstance(rb, dict) and rb else None


def asleep(host, cfg: DeployConfig, rec: Standby) -> bool:
    """Whether the standby's runtime answers on its port and says it sleeps."""
    return standby_enabled(cfg) and Engine(host, cfg, rec.port, release=rec.release, role="standby").is_sleeping() is True


def _do(host, cfg: DeployConfig, action: str, port: int, release: str) -> float:
    """Engine.sleep / Engine.wake on ``port`` of the engine of ``release`` (its identity checked first); the
    engine's seconds. Raises HealthError with the engine's reason (identity.IdentityMismatch: another engine is
    there)."""
    e = Engine(host, cfg, port, release=release, role="standby")
    r = e.sleep() if action == "sleep" else e.wake()
    if not r.ok:
        raise HealthError(f"{host.name}: {action} of the runtime on port {port} failed: {r.reason}",
                          fix=f"see the runtime log on {host.name}")
    return r.seconds


def stop(host, cfg: DeployConfig, rec: Standby) -> float:
    """Stop the standby's runtime and forget it. A supervisor that was started as the service removes the
    ``runtime.pid`` link on exit: the serving runtime's link is made again. Returns the seconds. Raises
    RemoteError."""
    t0 = time.monotonic()
    Engine(host, cfg, rec.port, beside=True).stop(timeout=5)
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
             say: Optional[Callable[..., None]] = None,
             on_ready: Optional[Callable[[str], None]] = None) -> Verified:
    """Make ``release_id`` run on ``host`` for a deploy: a standby found there is stopped first (the release it
    kept is older than the one now serving); then, when ``keeps``, the new release starts beside the serving one
    and the old one goes to sleep (timings gain ``sleep_s``) — or, where two copies do not fit on the host's GPU
    (rollout.gpufit), the drained old one sleeps first and the new one starts beside the sleeper
    (``_sleep_then_start``); else ``hostops.activate`` (stop, start). The sleep waits for the old release's
    in-flight requests (``_sleep_drained``); the sleeper's GPU residue is measured (rollout.residue) and recorded.
    A standby that could not be made is said through ``say`` (event data ``no_standby``: why) and noted on the
    host (``read_none``), never silently turned into a stop. ``on_ready(host name)``: called once the new release
    is verified beside the old one, before the old one sleeps, with the host's active port already the new one —
    a deploy whose old release is still in the router (in place, one host) moves the router there, so that the old
    release's weight is 0 before it sleeps. Raises RemoteError (4), HealthError (5), CheckFailed
    (1: rollout.standby_misfit ``fail`` and the new release does not fit beside the sleeper)."""
    h = host.config
    old = read(host)
    recorded = recorded_residue(host, old) if standby_enabled(cfg) else None
    if old is not None:
        stop(host, cfg, old)
        if say:
            say("host", f"{host.name}: stopped the standby of {old.release} (port {old.port})", host=host.name)
    was = release.current_release(host)
    progress = hostops.install_progress(host, say)
    if not was or not keeps(cfg, host, release_id) or not Engine(host, cfg).running():
        return hostops.activate(host, cfg, release_id, should_stop=should_stop, on_switch=on_switch,
                                on_progress=progress)
    old_port, new_port = layout.service_port(cfg, h), launcher.beside_port(cfg, h)
    if on_switch:
        on_switch(host.name)
    from deployctl.rollout.gpufit import wake_fit

    fit = wake_fit(host, cfg, None)
    if not fit.beside:
        return _sleep_then_start(host, cfg, was, release_id, old_port, new_port, fit, should_stop, say, recorded)
    v = hostops.activate_beside(host, cfg, release_id, new_port, should_stop=should_stop, on_progress=progress)
    _own_pidfiles(host, old_port)
    timings = dict(v.timings)
    if on_ready:
        _route_first(host, cfg, was, old_port, new_port, on_ready)
    try:
        sleep_s, body = _sleep_drained(host, cfg, old_port, was)
    except DeployctlError as e:
        Engine(host, cfg, old_port, beside=True).stop()
        _no_standby(host, was, f"{e.message}; {was} was stopped instead", say)
    else:
        timings["sleep_s"] = sleep_s
        _keep(host, cfg, was, old_port, _measure(host, old_port, body), say)
    launcher.adopt(host, cfg, new_port)
    return replace(v, timings=timings)


def _route_first(host, cfg: DeployConfig, was: str, old_port: int, new_port: int,
                 on_ready: Callable[[str], None]) -> None:
    """Point the host's active port at the verified new release and let ``on_ready`` move the router there. When
    that fails the new release is stopped and ``current`` put back: the old one serves as before; then raise."""
    h = host.config
    h._active_port = new_port
    try:
        on_ready(host.name)
    except BaseException:
        h._active_port = old_port
        Engine(host, cfg, new_port, beside=True).stop()
        release.switch_current(host, was)
        raise


def _no_standby(host, was: str, why: str, say, residue: Optional[dict] = None) -> None:
    """Say and note that ``was`` is not kept asleep on ``host`` (``no_standby`` in the event's data)."""
    note_none(host, was, why, residue)
    if say:
        say("warn", f"{host.name}: no standby: {why}", host=host.name, no_standby=why)


def _measure(host, port: int, body: Optional[dict]):
    """rollout.residue.measure of the sleeper on ``port``, an unknown Residue when the host cannot be read."""
    from deployctl.rollout import residue as rs

    try:
        return rs.measure(host, port, reported=rs.reported_bytes(body))
    except DeployctlError:
        return rs.Residue(reported=rs.reported_bytes(body))


def _keep(host, cfg: DeployConfig, was: str, port: int, res, say) -> None:
    """Record ``was`` asleep on ``port`` with its measured residue ``res`` (rollout.residue.Residue)."""
    now = time.time()
    _write(host, Standby(was, port, now, now + cfg.rollout.standby_s, res.to_json() if res.known else None))
    if say:
        say("host", f"{host.name}: {was} asleep on port {port}, measured GPU residue {res.text()}", host=host.name,
            residue=res.to_json())


def drain_bound_s(cfg: DeployConfig) -> float:
    """Seconds the old release gets to end its in-flight requests before it sleeps: rollout.standby_drain_s, else
    server.drain_timeout_s (at least 1)."""
    bound = cfg.rollout.standby_drain_s if cfg.rollout.standby_drain_s is not None else cfg.server.drain_timeout_s
    return max(1.0, float(bound))


def _sleep_drained(host, cfg: DeployConfig, port: int, release: str) -> tuple[float, dict]:
    """Sleep the drained runtime on ``port`` (out of the router), retrying while requests are still in flight there
    (409 ``requests_in_flight``) up to ``drain_bound_s``. Returns (seconds, the engine's answer). Raises
    HealthError naming the requests still running past the bound, or the engine's reason."""
    t0 = time.monotonic()
    bound = drain_bound_s(cfg)
    while True:
        r = Engine(host, cfg, port, release=release, role="standby").sleep()
        if r.ok:
            return round(time.monotonic() - t0, 2), dict(r.body or {})
        if r.code != "requests_in_flight":
            raise HealthError(f"{host.name}: sleep of the runtime on port {port} failed: {r.reason}",
                              fix=f"see the runtime log on {host.name}")
        if time.monotonic() - t0 > bound:
            raise HealthError(f"requests were still in flight on port {port} {bound:g} s after it left the router "
                              f"({r.reason})", fix="raise rollout.standby_drain_s (default server.drain_timeout_s) "
                                                   "above your longest streams to keep a standby")
        time.sleep(0.2)


def _drop_then_start(host, cfg: DeployConfig, was: str, release_id: str, old_port: int, new_port: int, why: str,
                     should_stop, say, residue: Optional[dict] = None) -> Verified:
    """No standby (``why``): stop the old runtime on ``old_port`` (asleep or awake, drained) and start the new
    release beside nothing on ``new_port`` — a cold start. Raises RemoteError / HealthError."""
    _no_standby(host, was, why, say, residue)
    t0 = time.monotonic()
    Engine(host, cfg, old_port, beside=True).stop()
    stop_s = round(time.monotonic() - t0, 2)
    v = hostops.activate_beside(host, cfg, release_id, new_port, should_stop=should_stop,
                                on_progress=hostops.install_progress(host, say))
    launcher.adopt(host, cfg, new_port)
    return replace(v, timings={"stop_s": stop_s, **v.timings})


def _misfit_error(host, cfg: DeployConfig, why: str, was: str) -> CheckFailed:
    return CheckFailed(f"{host.name}: {why}; rollout.standby_misfit is fail: the deploy stops here, {was} serves "
                       "as before",
                       fix="set rollout.standby_misfit: drop (the standby is stopped and the new release starts "
                           "cold), lower engine.gpu_memory_utilization, or set rollout.standby_s: 0")


def _sleep_then_start(host, cfg: DeployConfig, was: str, release_id: str, old_port: int, new_port: int, fit,
                      should_stop, say, recorded: Optional[dict] = None) -> Verified:
    """Two copies do not fit on the host's GPU (``fit``, rollout.gpufit): the drained old runtime sleeps first
    (its GPU memory freed but the residue), its residue is measured, then the new release starts beside it. Where
    the new release does not fit beside the residue (measured now, or ``recorded`` at the host's last sleep and
    known before anything changes): rollout.standby_misfit ``drop`` stops the old runtime and starts cold (said),
    ``fail`` raises CheckFailed with the old release serving (woken again when it had slept). A start that fails
    wakes the old one again before the error is raised: the host is as it was. Raises RemoteError / HealthError /
    CheckFailed."""
    from deployctl.rollout import residue as rs

    _own_pidfiles(host, old_port)
    ahead = rs.predicted_misfit(recorded, fit.free_bytes)
    if ahead:
        if cfg.rollout.standby_misfit == "fail":
            raise _misfit_error(host, cfg, ahead, was)
        return _drop_then_start(host, cfg, was, release_id, old_port, new_port,
                                f"{ahead}: {was} stopped, {release_id} starts cold", should_stop, say)
    if say:
        say("host", f"{host.name}: {fit.why}: {was} sleeps before {release_id} starts beside it", host=host.name)
    try:
        sleep_s, body = _sleep_drained(host, cfg, old_port, was)
    except DeployctlError as e:
        return _drop_then_start(host, cfg, was, release_id, old_port, new_port,
                                f"{e.message}; {was} stopped, {release_id} starts cold", should_stop, say)
    res = _measure(host, old_port, body)
    why = rs.misfit(res, fit.need_bytes)
    if why:
        if cfg.rollout.standby_misfit == "fail":
            _do(host, cfg, "wake", old_port, was)
            note_none(host, was, why, res.to_json())  # the next deploy knows before it changes anything
            raise _misfit_error(host, cfg, why, was)
        return _drop_then_start(host, cfg, was, release_id, old_port, new_port,
                                f"{why}: {was} stopped, {release_id} starts cold", should_stop, say, res.to_json())
    try:
        v = hostops.activate_beside(host, cfg, release_id, new_port, should_stop=should_stop,
                                    on_progress=hostops.install_progress(host, say))
    except BaseException:
        _do(host, cfg, "wake", old_port, was)  # activate_beside stopped the new one: the old one serves as before
        raise
    _keep(host, cfg, was, old_port, res, say)
    launcher.adopt(host, cfg, new_port)
    return replace(v, timings={**v.timings, "sleep_s": sleep_s})


def _verify_woken(host, cfg: DeployConfig, rec: Standby, timeout: float) -> Verified:
    """Verify a runtime whose wake answered 2xx: the engines' wake routes answer once the weights and the KV pool
    are back, so the sample request goes first (``ready_s`` 0: no /readyz round trip); an answer other than the
    release's 200 falls back to the full verify (wait for /readyz, then the sample). Raises HealthError."""
    e = Engine(host, cfg, rec.port, release=rec.release, role="standby", beside=True)
    try:
        tokens, got, path = e.sample(timeout=min(60.0, timeout))
        if got is None or got == rec.release:
            return Verified(host.name, 0.0, tokens, got, endpoint=path)
    except HealthError:
        pass
    return e.verify(timeout=timeout)


def wake(host, cfg: DeployConfig, rec: Standby, *, timeout: float = 120) -> Verified:
    """Wake the standby and verify it on its port (one small request answered by ``rec.release``; readiness
    waited for only when that fails: ``_verify_woken``). The serving runtime is left alone: ``retire`` once the
    router moved. Timings: wake_s, ready_s, verify_s (seconds). Raises HealthError naming why."""
    t0 = time.monotonic()
    _do(host, cfg, "wake", rec.port, rec.release)
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
    # the bad release serves on the other port (the router already names the woken one's: the host's active port is
    # rec.port by now); stopping "the service" at rec.port would end the woken engine's marked processes too
    h = host.config
    bad_port = h.spare_port if rec.port != h.spare_port else layout.configured_port(cfg, h)
    Engine(host, cfg, bad_port).stop()
    launcher.adopt(host, cfg, rec.port)
    _clear(host)
    return round(time.monotonic() - t0, 2)


def wake_back(host, cfg: DeployConfig, rec: Standby, *, timeout: float = 120) -> Verified:
    """Abort on a drained canary host: stop the new release first (on a GPU it holds the memory the wake needs),
    then wake the standby, verify it, make it current and the service. Raises HealthError / RemoteError."""
    t0 = time.monotonic()
    Engine(host, cfg).stop()
    t1 = time.monotonic()
    v = wake(host, cfg, rec, timeout=timeout)
    release.switch_and_install(host, rec.release)
    launcher.adopt(host, cfg, rec.port)
    _clear(host)
    return replace(v, timings={"stop_s": round(t1 - t0, 2), **v.timings})


def restore(host, cfg: DeployConfig, release_id: str, *, say: Optional[Callable[..., None]] = None) -> Verified:
    """Put ``release_id`` back on ``host`` (abort): by waking its standby when one sleeps there; else, when the
    host already serves ``release_id`` (``current`` names it and the runtime answers with it: a sleep-first start
    that failed woke it again, or the switch never happened), by verifying it as it is — not restarted; else (a
    standby of another release stopped first) ``hostops.activate``. A wake that fails falls back to the start.
    Each host's path is said through ``say`` (event data ``path``: "wake", "serving" or "start", and ``why``).
    Raises RemoteError / HealthError."""
    def path(kind: str, why: str) -> None:
        if say:
            say("host", f"{host.name}: back to {release_id} by {kind}: {why}", host=host.name, path=kind, why=why)

    rec = read(host)
    failed = ""
    if rec is not None and rec.release == release_id and asleep(host, cfg, rec):
        try:
            v = wake_back(host, cfg, rec)
            path("wake", f"its standby slept on port {rec.port}")
            return v
        except DeployctlError as e:
            failed = f"waking {release_id} failed ({e}); "
            if say:
                say("warn", f"{host.name}: waking {release_id} failed ({e}); starting it instead", host=host.name)
    if read(host) is not None:
        stop(host, cfg, read(host))
    if not failed and release.current_release(host) == release_id and Engine(host, cfg).running():
        from deployctl.service.verify import RELEASE_HEADER

        serving = Engine(host, cfg, release=release_id)
        if serving.http("GET", "/healthz", timeout=5).header(RELEASE_HEADER) == release_id:
            try:
                v = serving.verify(timeout=60)
                # it may have been woken again after a failed sleep-first start: its answers are checked too
                hostops.golden_check(host, cfg, release_id, layout.service_port(cfg, host.config),
                                     "as it serves after the abort")
                path("serving", f"{release_id} already serves there: verified, not restarted")
                return v
            except HealthError as e:
                failed = f"{e}; "
    v = hostops.activate(host, cfg, release_id, golden="after the abort's restart")
    path("start", failed + ("no standby of it asleep there" if rec is None or rec.release != release_id
                            else "its standby was not asleep"))
    return v
