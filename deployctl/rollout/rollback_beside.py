"""A rollback onto ``hosts[].spare_port`` (docs/DESIGN.md "Rollback"): when no host is on the target yet and every
host can start it on its second port, all of them start it beside the serving runtime at once, the router moves
over, and the old runtimes drain and stop."""
from __future__ import annotations

import time

from deployctl.config import layout
from deployctl.errors import about
from deployctl.rollout import hostops, release
from deployctl.rollout.fleet import Fleet
from deployctl.rollout.servedname import as_release
from deployctl.service.engine import Engine


def start_beside(fleet: Fleet, cfg, target: str, current: dict, names: list[str], ports: dict, say, route,
                 phases: dict) -> list[str]:
    """Every host at once: the target starts on its second port while the old runtime keeps serving
    (hostops.activate_beside), the router moves each verified host to its new port, then the old runtimes drain
    and stop (hostops.retire). A host whose start fails keeps serving its old release at its old port; the
    problem names it. Returns the problems."""
    for n in names:
        say("host", f"{n}: starting {target} on port {ports[n]} beside the serving runtime, verifying", host=n)
    tb = time.monotonic()
    ok, bad = fleet.on_hosts([fleet.hosts[n] for n in names],
                               lambda h: hostops.activate_beside(h, as_release(cfg, h, target), target,
                                                                  ports[h.name],
                                                                  golden="after its start beside the serving release"))
    phases["batches"].append({"wall_s": round(time.monotonic() - tb, 2), "mode": "beside",
                              "hosts": {n: v.timings for n, v in ok.items()}})
    for n, v in ok.items():
        say("host", f"{n}: ready in {v.ready_s:.1f} s on port {ports[n]} "
                    f"({', '.join(f'{k} {x:g}' for k, x in v.timings.items())})", host=n, timings=v.timings)
    problems = [f"{about(n, e)}; {n} still serves its previous release on port "
                f"{layout.service_port(cfg, fleet.hosts[n].config)}" for n, e in bad.items()]
    if not ok:
        return problems
    olds = {n: layout.service_port(cfg, fleet.hosts[n].config) for n in ok}
    for n in ok:  # the router renders each host at the port it is told; the old runtimes drain after the reload
        fleet.hosts[n].config._active_port = ports[n]
    try:
        route(names)
    except BaseException:
        for n, p in olds.items():
            fleet.hosts[n].config._active_port = p
        for n in ok:  # nothing moved: the old runtimes serve on, as before the rollback
            Engine(fleet.hosts[n], cfg, ports[n], beside=True).stop(timeout=5)
            release.switch_current(fleet.hosts[n], current[n])
        raise
    td = time.monotonic()
    done, failed = fleet.on_hosts([fleet.hosts[n] for n in ok], lambda h: hostops.retire(h, cfg, ports[h.name], olds[h.name]))
    phases["drain_s"] = round(time.monotonic() - td, 2)
    problems += [f"{about(n, e)} (stopping the previous runtime; the new one serves)" for n, e in failed.items()]
    return problems
