"""``rollback``, ``abort`` and ``promote``: the commands that act on the fleet from any shell.

rollback [--to ID]: make the previous release (the one the last deploy started from, or ID) current on every host,
restart, verify, and restore the weights. It wins over a deploy in progress (C20): it first bumps the generation
in state/control.json (the deploy stops within a second or two and releases its lock), routes all traffic to the
hosts already on the target at once (``nginx -t`` then reload), then switches the others in parallel. When no
host is on the target yet: with ``hosts[].spare_port`` on every host (and a target whose launch.sh can start on it)
all hosts start the target beside the serving runtime at once, the router moves over, the old runtimes drain
(``rollback_beside``, docs/DESIGN.md "Rollback"); else two batches (a third, then the rest), so something always
serves. Standbys of the target are woken instead (``rollback_wake``).
A stale lock is broken; a live one is taken over after ``GRACE_S``. When every host already runs the target and
traffic is split evenly, it is a no-op.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import NamedTuple, Optional

from deployctl.config import DeployConfig
from deployctl.errors import CheckFailed, DeployctlError, HealthError, about
from deployctl.rollout.servedname import as_release
from deployctl.rollout import gpufit, hostops, release, rollback_beside, rollback_wake, standby
from deployctl.service import launcher
from deployctl.service.engine import Engine
from deployctl.rollout.events import Progress, emitter
from deployctl.rollout.fleet import Fleet, majority
from deployctl.config.layout import release_dir
from deployctl.rollout.router import Split
from deployctl.rollout.state import RolloutState

GRACE_S = 10.0


@dataclass
class RollbackResult:
    target: str
    noop: bool
    changed: list[str] = field(default_factory=list)
    duration_s: float = 0.0
    problems: list[str] = field(default_factory=list)
    # seconds per phase (``rollback --json``): prepare_s (connect, state, checks), lock_s (wait for a deploy to let
    # go, take the lock), router_s (every nginx render + reload), batches [{"wall_s", "hosts": {host: timings}}]
    # (hostops.activate: install, stop, start, ready with boot/load/warmup, verify), record_s (state + history),
    # serving_s (from the start until nginx last moved: the rollback done for its users; draining and stopping the
    # bad release, drain_s, and record_s follow it), paths ({host: {"path", "why"}})
    phases: dict = field(default_factory=dict)


def _target(fleet: Fleet, st: Optional[RolloutState], to: Optional[str]) -> str:
    if to:
        return to
    if st is not None:
        if st.action == "rollback" and st.release:
            return st.release
        if st.from_release:
            return st.from_release
    for rec in reversed(fleet.store.read_history()):
        if rec.get("action") == "deploy" and rec.get("from_release"):
            return rec["from_release"]
    raise CheckFailed("nothing to roll back to: no earlier release recorded", fix="pass --to RELEASE_ID")


def _engines(fleet: Fleet, releases: dict, kind: str) -> frozenset:
    """Engine kinds of ``releases`` ({host: release id}; key "": the target, read on any host that has it) other
    than ``kind``: one release.json read per distinct release."""
    kinds, seen = set(), set()
    for name, rid in releases.items():
        if not rid or rid in seen:
            continue
        seen.add(rid)
        h = fleet.hosts.get(name) or next(iter(fleet.hosts.values()))
        kinds.add(release.engine_of(h, rid)[0] or kind)
    return frozenset(kinds - {kind})


def _wait_for_lock(fleet: Fleet, say, grace: float) -> None:
    end = time.monotonic() + grace
    while time.monotonic() < end:
        infos = fleet.inspect_lock()
        if not infos or all(i.stale for i in infos):
            return
        time.sleep(0.25)
    say("warn", f"the deploy did not let go within {grace:.0f} s: taking over its lock")


class _Look(NamedTuple):
    """What a rollback reads from one host before it acts."""

    current: Optional[str]  # the release ``current`` points at
    has_target: bool  # the target release is installed there
    beside: bool  # a start beside the serving runtime is possible (launcher.supports_beside)
    standby: Optional[standby.Standby]  # standby.read's record, or None
    wakeable: bool  # that standby is the target, valid and asleep
    fit: Optional[gpufit.WakeFit]  # gpufit.wake_fit's verdict for a wakeable standby
    served: Optional[str]  # the release the runtime answers with (None: not answering)
    running: bool  # a runtime answers, or its supervisor runs (a foreign engine that names no release)


def rollback(cfg: DeployConfig, *, to: Optional[str] = None, progress: Optional[Progress] = None,
             grace_s: float = GRACE_S, fetch: bool = False) -> RollbackResult:
    say = emitter(progress)
    t0 = time.monotonic()
    fleet = Fleet(cfg, say)
    try:
        fleet.connect()
        fleet.leave_out()  # cordoned and not-serving hosts are left out, said (issue 42)
        cfg = fleet.cfg
        st = fleet.store.read_rollout(on_bad=lambda msg: say("warn", msg))
        target = _target(fleet, st, to)

        def look(h):
            rdir = release_dir(h.config, target)
            rec = standby.read(h)
            cur = release.current_release(h)
            wakeable = (rec is not None and rec.release == target and not rec.expired and cur != target
                        and standby.asleep(h, cfg, rec))
            fit = gpufit.wake_fit(h, cfg, rec.port, recorded=rec.residue_bytes) if wakeable else None
            served = _served(h, cfg)
            return _Look(cur, h.exists(rdir + "/release.json"), launcher.supports_beside(h, cfg, rdir), rec, wakeable,
                         fit, served, served is not None or Engine(h, cfg).running())

        found, bad = fleet.on_hosts(list(fleet.hosts.values()), look)
        if bad:
            name, err = next(iter(bad.items()))
            raise err if isinstance(err, DeployctlError) else DeployctlError(about(name, err))
        # a host whose ``current`` was switched but whose runtime still serves another release (a rollback killed
        # between its switch and its restart) counts as on the release it serves, so that it is restarted
        # and a host where nothing runs (a rollback killed after its stop, before its start) is on no release:
        # `current` names the target there, but only a start makes it serve
        current = {n: (found[n].served or found[n].current) if found[n].running else None for n in fleet.hosts}
        for n in fleet.hosts:
            if not found[n].running:
                say("warn", f"{n}: no runtime runs there (current: {found[n].current}); it is started", host=n)
        split = fleet.router.read_split() if fleet.router else None
        even = split is None or (not split.get("canary") and sorted(split.get("stable", [])) == sorted(current))
        in_progress = st is not None and st.in_progress
        if (all(v == target for v in current.values()) and even and not in_progress
                and not fleet.inspect_lock()):
            say("info", f"every host already runs {target}: nothing to do")
            return RollbackResult(target, True)
        missing = [n for n in fleet.hosts if current[n] != target and not found[n].has_target]
        if missing:
            raise CheckFailed(f"release {target} is not on {', '.join(missing)}",
                              fix="pick one that is: `deployctl history` lists them; pass --to RELEASE_ID")
        if cfg.model.source:  # issue 43: the target's model version may have been pruned from a host's store
            from deployctl.weights.fetch import pruned_model_check

            pruned_model_check([h for n, h in fleet.hosts.items() if current[n] != target], cfg.model, target,
                               fetch=fetch, say=say)
        if fleet.router:  # the engines behind nginx while it runs (keep-alive: deployctl.engines.keepalive)
            fleet.router.engines_behind = _engines(fleet, {**current, "": target}, cfg.engine.kind)
        phases = {"prepare_s": 0.0, "lock_s": 0.0, "router_s": 0.0, "batches": [], "record_s": 0.0}
        phases["prepare_s"] = time.monotonic() - t0
        gen = fleet.store.send("rollback", reason=target).generation
        say("info", f"rolling back to {target} (generation {gen})")
        on_target = [n for n, r in current.items() if r == target]
        if fleet.router and on_target:
            # traffic first: the hosts already on the target take it all now; a running deploy stops at its next
            # check (within a second or two) and touches nothing more; we route again once we hold the lock
            tr = time.monotonic()
            shares = fleet.router.apply(Split(tuple(on_target), (), 0), guard_certificate=False)
            phases["router_s"] += time.monotonic() - tr
            say("router", "traffic: " + ", ".join(f"{h} {w:g}%" for h, w in shares.items() if w), shares=shares)
        tl = time.monotonic()
        _wait_for_lock(fleet, say, grace_s)
        fleet.lock("rollback", break_stale=True, take_over=True)
        phases["lock_s"] = time.monotonic() - tl
        try:
            wakeable = {n: found[n].standby for n in fleet.hosts if found[n].wakeable}
            phases["paths"] = {n: rollback_wake.why_not(found[n].standby, target) for n in fleet.hosts
                               if current[n] != target}
            phases["paths"].update({n: {"path": "wake" if found[n].fit.beside else "wake_after_stop",
                                        "why": found[n].fit.why} for n in wakeable})
            fits = {n: found[n].fit for n in wakeable}
            rollback_wake.stop_stale(fleet, cfg, {n: found[n].standby for n in fleet.hosts
                                                  if found[n].standby and n not in wakeable}, target, say, phases)
            beside = {n: launcher.beside_port(cfg, fleet.hosts[n].config) for n in fleet.hosts
                      if found[n].beside and found[n].running}  # nothing to start beside where nothing runs
            return _do(fleet, cfg, target, current, gen, say, t0, phases, beside, wakeable, fits)
        finally:
            fleet.unlock()
    finally:
        fleet.close()


def _do(fleet: Fleet, cfg, target: str, current: dict, gen: int, say, t0: float, phases: dict,
        beside: dict, wakeable: Optional[dict] = None, fits: Optional[dict] = None) -> RollbackResult:
    st = RolloutState(action="rollback", release=target, from_release=majority(current.values()), generation=gen)
    fleet.store.write_rollout(st)
    on_target = [n for n, r in current.items() if r == target]
    others = [n for n in current if n not in on_target]
    changed = others

    def route(names: list[str]) -> None:
        if fleet.router and names:
            tr = time.monotonic()
            shares = fleet.router.apply(Split(tuple(names), (), 0), guard_certificate=False)
            phases["router_s"] += time.monotonic() - tr
            phases["serving_s"] = round(time.monotonic() - t0, 2)  # the last move: users are on what serves now
            st.weights = shares
            say("router", "traffic: " + ", ".join(f"{h} {w:g}%" for h, w in shares.items() if w), shares=shares)

    if fleet.router and wakeable:
        fits = fits or {}
        near = {n: r for n, r in wakeable.items() if fits.get(n) is None or fits[n].beside}
        swap = {n: r for n, r in wakeable.items() if n not in near}
        woken, problems = rollback_wake.wake(fleet, cfg, target, current, near, say, route, phases, keep=tuple(swap)) \
            if near else ([], [])
        if swap:
            rest = [n for n in others if n not in woken and n not in swap]
            done, more = rollback_wake.wake_after_stop(fleet, cfg, target, swap, on_target + woken, rest, say,
                                                       route, phases)
            woken, problems = woken + done, problems + more
            phases["paths"].update({n: {"path": "start", "why": f"the wake after the stop failed, cold-started: "
                                                                f"{phases['wake_failed'][n]}"}
                                    for n in swap if n in phases["wake_failed"]})
        cold = [n for n in others if n not in woken and n not in swap]
        if not cold or problems:
            return _finish(fleet, st, target, current, others, problems, say, t0, phases)
        changed = list(others)
        on_target = on_target + woken  # the hosts whose wake failed: a cold start (stop, then start)
        for n in woken:
            current[n] = target
        others = cold
        # not beside the bad release: a wake that did not fit would not fit as a second start either
        beside = {n: p for n, p in beside.items() if n not in phases.get("wake_failed", {})}
        phases["paths"].update({n: {"path": "start", "why": f"the wake failed: {phases['wake_failed'][n]}"}
                                for n in cold if n in phases.get("wake_failed", {})})
    if fleet.router and not on_target and others and all(beside.get(n) for n in others):
        phases.setdefault("paths", {}).update(
            {n: {"path": "beside", "why": f"{(phases['paths'].get(n) or {}).get('why') or 'no standby to wake'}: "
                                          f"started beside the serving release on port {beside[n]}"} for n in others})
        problems = rollback_beside.start_beside(fleet, cfg, target, current, others, beside, say, route, phases)
        return _finish(fleet, st, target, current, changed, problems, say, t0, phases)
    serving = list(on_target)
    route(serving)
    # none on the target yet: a small first batch restarts while the rest keep serving, then the rest at once
    first = max(1, len(others) // 3)
    batches = [others] if on_target or len(others) < 2 else [others[:first], others[first:]]
    problems: list[str] = []
    for batch in batches:
        rest = [n for n in others if n not in batch and n not in serving]
        if not on_target and rest and batch is batches[0]:
            route(rest)  # the second half keeps serving while the first one restarts
        for n in batch:
            say("host", f"{n}: switching to {target}, restarting, verifying", host=n)
        tb = time.monotonic()
        ok, bad = fleet.on_hosts([fleet.hosts[n] for n in batch], lambda h: hostops.activate(h, as_release(cfg, h, target), target,
                                                              golden="after the rollback's cold start"))
        phases["batches"].append({"wall_s": round(time.monotonic() - tb, 2),
                                  "hosts": {n: v.timings for n, v in ok.items()}})
        for n, v in ok.items():
            say("host", f"{n}: ready in {v.ready_s:.1f} s ({', '.join(f'{k} {x:g}' for k, x in v.timings.items())})",
                host=n, timings=v.timings)
        problems += [about(n, e) for n, e in bad.items()]
        serving += list(ok)
        route(serving)
    return _finish(fleet, st, target, current, changed, problems, say, t0, phases)


def _finish(fleet: Fleet, st: RolloutState, target: str, current: dict, others: list[str], problems: list[str],
            say, t0: float, phases: dict) -> RollbackResult:
    trec = time.monotonic()
    st.status = "rolled_back" if not problems else "failed"
    st.reason = "; ".join(problems) or None
    fleet.store.write_rollout(st)
    dur = time.monotonic() - t0
    fleet.store.append_history("rollback", release=target, result="ok" if not problems else "failed",
                               reason="; ".join(problems), from_release=st.from_release, duration_s=round(dur, 2),
                               hosts=others, paths=phases.get("paths") or {})
    phases["record_s"] = time.monotonic() - trec
    phases.update({k: round(v, 2) for k, v in phases.items() if isinstance(v, float)})
    dur = time.monotonic() - t0
    if problems:
        raise HealthError(f"rollback to {target} incomplete: {'; '.join(problems)}",
                          fix="fix those hosts and run `deployctl rollback` again")
    say("done", f"rolled back to {target} on {len(current)} hosts in {dur:.1f} s")
    return RollbackResult(target, False, others, dur, phases=phases)


def _served(h, cfg: DeployConfig) -> Optional[str]:
    """The release the runtime on ``h`` answers with (X-Deployctl-Release of /healthz); None when it does not say
    (no answer, a foreign engine)."""
    from deployctl.service.engine import Engine
    from deployctl.service.verify import RELEASE_HEADER

    return Engine(h, cfg).http("GET", "/healthz", timeout=5).header(RELEASE_HEADER)


def signal(cfg: DeployConfig, command: str, *, progress: Optional[Progress] = None, wait_s: float = 120) -> str:
    """``promote`` or ``abort`` a running deploy from another shell. Returns a one-line outcome. ``abort`` waits
    for the deploy to finish aborting; when no live deploy holds the lock, it restores the fleet itself."""
    say = emitter(progress)
    fleet = Fleet(cfg, say)
    try:
        fleet.connect()
        st = fleet.store.read_rollout()
        if st is None or not st.in_progress or st.action != "deploy":
            return f"no rollout in progress: nothing to {command}"
        live = [i for i in fleet.inspect_lock() if not i.stale]
        if command == "promote":
            if not live:
                raise CheckFailed("the deploy that started this rollout is not running; nothing can promote it",
                                  fix="run `deployctl deploy --resume` to continue it, or `deployctl rollback`")
            c = fleet.store.send("promote")
            return f"promote sent (generation {c.generation}); the deploy moves to its next step"
        c = fleet.store.send("abort", reason="abort requested")
        if live:
            say("info", "abort sent; waiting for the deploy to put traffic back on stable")
            end = time.monotonic() + wait_s
            while time.monotonic() < end:
                now = fleet.store.read_rollout()
                if now is not None and not now.in_progress:
                    return f"aborted: {now.status}; traffic on {now.from_release}"
                time.sleep(0.5)
            raise DeployctlError(f"the deploy did not confirm the abort within {wait_s:.0f} s",
                                 fix="run `deployctl rollback`")
        say("warn", "no live deploy holds the lock: restoring the fleet here")
        return f"aborted: {rollback(cfg, progress=progress).target} restored"
    finally:
        fleet.close()
