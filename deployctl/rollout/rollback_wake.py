"""A rollback's standby paths (issue 25): the standbys that cannot serve it are stopped first (``stop_stale``; a
host without one to wake starts cold, ``why_not`` says why); where the standby fits awake beside the bad release
(``rollout.gpufit``) every such host wakes at once (``wake``).

Where two awake copies do not fit on a host's GPU (``wake_after_stop``): a batch at a time (a third of the fleet,
at least one host): the batch leaves nginx while every other host keeps serving, then on each of its hosts at once
the bad release drains and stops (its GPU memory freed), the standby wakes and is verified (ready + one small
request, ``standby.wake_back``), and the host rejoins nginx on the woken release's port. A host whose wake fails there has its standby stopped and the target cold-started in its place
(``hostops.activate``), the engine's reason said.
"""
from __future__ import annotations

import time
from typing import Callable

from deployctl.config import layout
from deployctl.errors import DeployctlError, about
from deployctl.rollout import hostops, standby
from deployctl.rollout.fleet import Fleet
from deployctl.rollout.servedname import as_release


def why_not(rec, target: str) -> dict:
    """The path of a host without a standby of ``target`` to wake (``phases.paths``): a start, and why."""
    if rec is None:
        why = "no standby on the host"
    elif rec.release != target:
        why = f"its standby is {rec.release}, not {target}"
    else:
        why = "its standby expired" if rec.expired else "its standby does not answer asleep"
    return {"path": "start", "why": why}


def stop_stale(fleet: Fleet, cfg, recs: dict, target: str, say, phases: dict) -> None:
    """Stop the standbys that cannot serve this rollback (another release, expired, not answering asleep): their
    port is the one a start beside needs, their memory the one a start needs."""
    if not recs:
        return
    for n, rec in recs.items():
        why = ("expired" if rec.expired else "not asleep on its port") if rec.release == target else "an older release"
        say("host", f"{n}: stopping the standby of {rec.release} on port {rec.port} ({why})", host=n)
    ts = time.monotonic()
    _, bad = fleet.on_hosts([fleet.hosts[n] for n in recs], lambda h: standby.stop(h, cfg, recs[h.name]))
    phases["standby_stop_s"] = round(time.monotonic() - ts, 2)
    for n, e in bad.items():
        say("warn", f"stopping the standby failed: {about(n, e)}")


def wake(fleet: Fleet, cfg, target: str, current: dict, recs: dict, say, route, phases: dict,
         keep: tuple = ()) -> tuple[list, list]:
    """Every host with a standby of the target that fits awake beside the bad release (rollout.gpufit) at once:
    wake it and verify it on its port (standby.wake), move the router to the woken ports (``keep``: hosts still
    on the bad release that go on serving), then stop the bad release (standby.retire). A host whose wake fails
    has its standby stopped and is left to the cold-start path, the reason said. Returns (woken hosts, problems)."""
    for n, rec in recs.items():
        say("host", f"{n}: waking the standby of {target} on port {rec.port}, verifying", host=n)
    tb = time.monotonic()
    ok, bad = fleet.on_hosts([fleet.hosts[n] for n in recs],  # each verified under the target's own served name
                             lambda h: standby.wake(h, as_release(cfg, h, target), recs[h.name]))
    phases["batches"].append({"wall_s": round(time.monotonic() - tb, 2), "mode": "wake",
                              "hosts": {n: v.timings for n, v in ok.items()}})
    for n, v in ok.items():
        say("host", f"{n}: awake and verified in {sum(v.timings.values()):.2f} s on port {recs[n].port} "
                    f"({', '.join(f'{k} {x:g}' for k, x in v.timings.items())})", host=n, timings=v.timings)
    for n, e in bad.items():
        say("warn", f"{n}: the wake failed, falling back to a cold start: {e}", host=n)
        try:
            standby.stop(fleet.hosts[n], cfg, recs[n])
        except DeployctlError as e2:
            say("warn", f"stopping the standby failed: {about(n, e2)}")
    phases.setdefault("wake_failed", {}).update({n: str(e) for n, e in bad.items()})
    if not ok:
        return [], []
    olds = {n: layout.service_port(cfg, fleet.hosts[n].config) for n in ok}
    for n in ok:
        fleet.hosts[n].config._active_port = recs[n].port
    serving = [n for n, r in current.items() if r == target] + list(ok) + list(keep)
    try:
        route(serving)
    except BaseException:
        for n, p in olds.items():  # nothing moved: the bad release serves on; the woken ones sleep again
            fleet.hosts[n].config._active_port = p
        back_to_sleep(fleet, cfg, {n: recs[n] for n in ok}, say, phases)
        raise
    td = time.monotonic()
    _, failed = fleet.on_hosts([fleet.hosts[n] for n in ok], lambda h: standby.retire(h, cfg, recs[h.name]))
    phases["drain_s"] = round(time.monotonic() - td, 2)
    return list(ok), [f"{about(n, e)} (stopping the bad release; the woken one serves)" for n, e in failed.items()]


def back_to_sleep(fleet: Fleet, cfg, recs: dict, say, phases: dict) -> None:
    """Put the standbys ``recs`` ({host: Standby}) woken for a router switch that failed back to sleep (they hold
    the GPU memory of a full copy beside the bad release, which serves on); their records stay. A host whose sleep
    fails is said and listed in ``phases["resleep_failed"]``. Never raises."""
    from deployctl.service.engine import Engine

    def one(h):
        r = Engine(h, cfg, recs[h.name].port, release=recs[h.name].release, role="standby").sleep()
        if not r.ok:
            raise DeployctlError(f"sleep on port {recs[h.name].port} failed: {r.reason}")

    try:
        ok, bad = fleet.on_hosts([fleet.hosts[n] for n in recs], one)
    except Exception as e:  # noqa: BLE001 - the router's error is the one the caller raises
        ok, bad = {}, {n: e for n in recs}
    for n in ok:
        say("host", f"{n}: the router did not move: the standby of {recs[n].release} sleeps again on port "
                    f"{recs[n].port}", host=n)
    for n, e in bad.items():
        say("warn", f"{n}: the router did not move and the woken standby could not sleep again: {e}", host=n)
    phases["resleep_failed"] = {n: str(e) for n, e in bad.items()}


def batch_size(num_hosts: int) -> int:
    """Hosts out of nginx at once: a third of the fleet, at least one (the cold path's first batch)."""
    return max(1, num_hosts // 3)


def _one(host, cfg, rec, target: str, failed: dict) -> dict:
    """Stop the bad release, wake the standby, verify; on a failed wake the cold start. Returns the timings."""
    cfg = as_release(cfg, host, target)  # verified under the target's own served name (rollout.servedname)
    try:
        return dict(standby.wake_back(host, cfg, rec).timings)
    except DeployctlError as e:
        failed[host.name] = str(e)
    try:
        standby.stop(host, cfg, rec)
    except DeployctlError:
        pass  # the start below names what still holds the port or the memory
    v = hostops.activate(host, cfg, target, golden="after the cold start that replaced its wake")
    return {"cold_start": True, **v.timings}


def wake_after_stop(fleet, cfg, target: str, recs: dict, serving: list[str], keep: list[str], say,
                    route: Callable[[list[str]], None], phases: dict) -> tuple[list[str], list[str]]:
    """Roll ``recs`` ({host: Standby}) back by stopping the bad release first, in batches; ``serving``: the hosts
    already on the target (they and ``keep``, still on the bad release, take the traffic while a batch is out).
    Appends one ``{"mode": "wake_after_stop", ...}`` entry per batch to ``phases["batches"]`` and the engine's
    reasons to ``phases["wake_failed"]``. Returns (hosts now on the target, problems)."""
    names = list(recs)
    size = batch_size(len(fleet.hosts))
    done: list[str] = []
    problems: list[str] = []
    failed = phases.setdefault("wake_failed", {})
    for i in range(0, len(names), size):
        batch = names[i:i + size]
        waiting = [n for n in names[i + size:]]
        route(list(serving) + done + list(keep) + waiting)  # the batch leaves nginx; the rest keep serving
        for n in batch:
            say("host", f"{n}: draining and stopping the serving release, then waking the standby of {target} on "
                        f"port {recs[n].port}, verifying", host=n)
        tb = time.monotonic()
        ok, bad = fleet.on_hosts([fleet.hosts[n] for n in batch],
                                   lambda h: _one(h, cfg, recs[h.name], target, failed))
        phases["batches"].append({"wall_s": round(time.monotonic() - tb, 2), "mode": "wake_after_stop",
                                  "hosts": ok})
        for n, t in ok.items():
            if n in failed:
                say("warn", f"{n}: the wake failed, cold-started instead: {failed[n]}", host=n)
            say("host", f"{n}: on {target} on port {fleet.hosts[n].config._active_port or 'configured'} "
                        f"({', '.join(f'{k} {x:g}' for k, x in t.items() if k != 'cold_start')})", host=n, timings=t)
        problems += [about(n, e) for n, e in bad.items()]
        done += list(ok)
        route(list(serving) + done + list(keep) + waiting)
    return done, problems
