"""``deployctl hosts cordon NAME`` / ``uncordon NAME`` (issue 42): take a host out of the router for maintenance and
put it back.

Cordon, under the deploy lock: the router gives the host weight 0 (the split's ``drained``; nginx reloads, open
connections finish on the old workers), then the host's in-flight requests are awaited up to
``standby.drain_bound_s`` (rollout.standby_drain_s, else server.drain_timeout_s) from the engine's
``running`` metric; those still running then are said as cut. The engine keeps running (for debugging) unless
``stop``. The record (by, reason, since, stopped) goes to every host's state/cordon.json (deployctl.rollout.members)
and the history; ``deploy`` and ``rollback`` then leave the host out and say so.

Uncordon, under the lock: the engine is started if it was stopped (or if nothing runs), verified (ready + a sample
inference, the release header) and asked the release's recorded golden answers (goldenrecord.check); only then
does the router give it its share back. A mismatch raises GoldenMismatch (exit 5) and the host stays cordoned.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from deployctl import settings
from deployctl.config import DeployConfig
from deployctl.engines import of
from deployctl.errors import CheckFailed, UsageError
from deployctl.rollout import join, members, standby
from deployctl.rollout.fleet import Fleet, majority
from deployctl.rollout.router import Split
from deployctl.rollout.state import now_iso
from deployctl.service.engine import Engine


@dataclass
class CordonResult:
    host: str
    cut: int = 0  # requests still running when the drain bound ended
    drain_s: float = 0.0
    stopped: bool = False
    timings: dict = field(default_factory=dict)


def adapt(say: Callable) -> Callable[..., None]:
    """A Fleet ``say(kind, message, **data)`` from a one-argument ``say`` (print by default); warnings prefixed."""
    return lambda kind, message, **_: say(("warning: " if kind == "warn" else "") + message)


def running(host, cfg: DeployConfig, port: Optional[int] = None) -> Optional[int]:
    """Requests in flight on the engine of ``host`` (its ``running`` metric: vllm:num_requests_running and the
    like, engines/); None when it has no such metric or does not answer."""
    a = of(cfg)
    name = a.metrics["running"] if a.metrics_route else None
    if name is None:
        return None
    r = Engine(host, cfg, port).http("GET", a.metrics_route, timeout=5)
    if r.status != 200 or not r.body:
        return None
    m = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})?\s+([0-9.eE+-]+)\s*$", r.body, re.M)
    return int(float(m.group(1))) if m else None


def wait_drained(host, cfg: DeployConfig, bound_s: float) -> tuple[int, float]:
    """Poll ``running`` every 0.2 s until 0 or ``bound_s`` seconds. Returns (requests still running, seconds)."""
    t0 = time.monotonic()
    while True:
        n = running(host, cfg) or 0
        if n == 0 or time.monotonic() - t0 >= bound_s:
            return n, round(time.monotonic() - t0, 2)
        time.sleep(0.2)


def _split(fleet: Fleet, *, drain: tuple = (), undrain: tuple = ()) -> Split:
    """The router's last split with ``drain`` added to its drained hosts and ``undrain`` taken out of them (added to
    the stable side when the split does not name them)."""
    last = fleet.router.read_split() or {}
    stable = [n for n in last.get("stable", []) if n in fleet.hosts]
    canary = [n for n in last.get("canary", []) if n in fleet.hosts]
    for n in undrain:
        if n not in stable + canary:
            stable.append(n)
    drained = [n for n in last.get("drained", []) if n in stable + canary and n not in undrain]
    drained += [n for n in drain if n not in drained]
    return Split(tuple(stable), tuple(canary), int(last.get("weight", 0)) if canary else 0, tuple(drained))


def _host(fleet: Fleet, name: str):
    if name not in fleet.hosts:
        raise UsageError(f"host {name!r} is not in deploy.yaml",
                         fix=f"use one of: {', '.join(fleet.hosts)}")
    return fleet.hosts[name]


def cordon(cfg: DeployConfig, name: str, *, reason: str = "", stop: bool = False, say: Callable = print,
           fleet: Optional[Fleet] = None) -> CordonResult:
    """Cordon ``name`` (module doc). ``fleet``: a connected, locked Fleet to work in (scale in); else one is
    made and locked here. Raises UsageError (unknown host, or the last host serving), LockHeld, CheckFailed,
    RemoteError."""
    own = fleet is None
    if own:
        fleet = Fleet(cfg, adapt(say))
        fleet.connect()
    try:
        host = _host(fleet, name)
        if fleet.router is None:
            raise CheckFailed("deploy.yaml has no router: cordon takes a host out of the router",
                              fix="add a router: section")
        if own:
            fleet.lock("cordon")
        split = _split(fleet, drain=(name,))
        live = [n for n, s in split.shares().items() if s > 0]
        if not live:
            raise UsageError(f"cordoning {name} would leave no host serving",
                             fix="uncordon or scale out another host first")
        fleet.router.apply(split, guard_certificate=False)
        say(f"{name}: router weight 0 ({', '.join(f'{n} {s:g}%' for n, s in split.shares().items() if s)})")
        bound = standby.drain_bound_s(cfg)
        cut, waited = wait_drained(host, cfg, bound)
        res = CordonResult(name, cut=cut, drain_s=waited)
        say(f"{name}: drained in {waited:.2f} s" if not cut else
            f"warning: {name}: {cut} requests still running {bound:g} s after it left the router: cut")
        if stop:
            Engine(host, cfg).stop()
            res.stopped = True
            say(f"{name}: engine stopped")
        rec = {"by": settings.operator(), "reason": reason, "since": now_iso(), "stopped": res.stopped}
        members.set_cordon(fleet.store, name, rec)
        fleet.store.append_history("cordon", release=None, result="ok", reason=reason, host=name, cut=cut,
                                   stopped=res.stopped, drain_s=waited)
        say(f"{name}: cordoned by {rec['by']} ({reason or 'no reason given'}); deploy and rollback leave it out "
            f"until `deployctl hosts uncordon {name}`")
        return res
    finally:
        if own:
            fleet.unlock()
            fleet.close()


def uncordon(cfg: DeployConfig, name: str, *, say: Callable = print) -> dict:
    """Uncordon ``name`` (module doc): verify, golden answers, then weight back. Returns the timings. Raises
    UsageError (not cordoned), GoldenMismatch / HealthError (exit 5; it stays cordoned), LockHeld, RemoteError."""
    fleet = Fleet(cfg, adapt(say))
    fleet.connect()
    try:
        host = _host(fleet, name)
        cordoned, _, active = members.view(cfg, fleet.store)
        if name not in cordoned:
            raise UsageError(f"{name} is not cordoned", fix="`deployctl status` shows the cordoned hosts")
        fleet.lock("uncordon")
        cur = fleet.current_releases()
        others = [n for n in active if n != name]
        target = majority(cur[n] for n in others)
        say(f"{name}: verifying {target or 'its release'} (ready, sample inference, golden answers)")
        peers = [fleet.hosts[n] for n in others]
        timings = join.bring_up(fleet, host, cfg, target, peers, when="before its uncordon")
        say(f"{name}: verified ({', '.join(f'{k} {v:g}' for k, v in timings.items())})")
        split = _split(fleet, undrain=(name,))
        fleet.router.apply(split, guard_certificate=False)
        members.set_cordon(fleet.store, name, None)
        fleet.store.append_history("uncordon", release=target, result="ok", host=name, timings=timings)
        say(f"{name}: uncordoned, router weight {split.shares().get(name, 0):g}%")
        return timings
    finally:
        fleet.unlock()
        fleet.close()
