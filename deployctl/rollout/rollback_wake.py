"""Rollback by a wake where two awake copies do not fit on a host's GPU (issue 25; ``rollout.gpufit``).

A batch at a time (a third of the fleet, at least one host): the batch leaves nginx while every other host keeps
serving, then on each of its hosts at once the bad release drains and stops (its GPU memory freed), the standby
wakes and is verified (ready + one small request, ``standby.wake_back``), and the host rejoins nginx on the woken
release's port. A host whose wake fails there has its standby stopped and the target cold-started in its place
(``hostops.activate``), the engine's reason said.
"""
from __future__ import annotations

import time
from typing import Callable

from deployctl.errors import DeployctlError, about
from deployctl.rollout import hostops, standby


def batch_size(num_hosts: int) -> int:
    """Hosts out of nginx at once: a third of the fleet, at least one (the cold path's first batch)."""
    return max(1, num_hosts // 3)


def _one(host, cfg, rec, target: str, failed: dict) -> dict:
    """Stop the bad release, wake the standby, verify; on a failed wake the cold start. Returns the timings."""
    try:
        return dict(standby.wake_back(host, cfg, rec).timings)
    except DeployctlError as e:
        failed[host.name] = str(e)
    try:
        standby.stop(host, cfg, rec)
    except DeployctlError:
        pass  # the start below names what still holds the port or the memory
    v = hostops.activate(host, cfg, target)
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
