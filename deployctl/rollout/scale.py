"""``deployctl scale out HOST…`` / ``scale in HOST…`` (issue 42), and the warm pool on bare hosts.

Scale out, under the deploy lock: for each host (in parallel) the release the serving hosts run (their majority) is
brought up verified (rollout.join: installed from a peer's release.json when absent, started, ready, sample, the
release's golden answers). A ``hosts[].pool: warm`` host whose engine sleeps with that release is woken instead
(standby.wake: wake, sample, golden answers): seconds instead of a cold start. Then each host is warmed up off the
router (rollout.warmup: requests until its TTFT is within a factor of the fleet's), and only then does the router
give it weight, ramped over ``slow_start_s`` in ``RAMP_STEPS`` equal steps up to its equal share (the new hosts as the
split's canary side: the router never gives a new host a full share at once). nginx's conf is re-rendered for the new
set at every step (``max_conns`` per server, router.max_conns_per_host, on the new servers too).

Scale in, under the lock: the hosts get weight 0 and their in-flight requests are awaited (cordon.wait_drained),
then they leave the router; a ``pool: warm`` host's engine is put to sleep and recorded as its standby (the next
scale out wakes it), any other host's engine is stopped. Its releases stay for a rollback unless ``purge``
(``<deploy_root>/releases`` and ``current`` removed). Refused when no host would be left serving.

``prime`` (``scale warm``) starts the warm pool once and puts it to sleep the same way, off the router.

Both record membership in state/members.json (rollout.members), their steps per host in state/scale.json (what a
rerun of the same command skips: an installed release, a verified engine), and one history record each
(``scale-out`` / ``scale-in``: hosts, release, path per host, timings).
"""
from __future__ import annotations

import shlex
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from deployctl.config import DeployConfig, layout
from deployctl.errors import CheckFailed, DeployctlError, UsageError, about
from deployctl.rollout import join, members, standby
from deployctl.rollout.cordon import adapt, wait_drained
from deployctl.rollout.fleet import Fleet, majority
from deployctl.rollout.router import Split
from deployctl.rollout.state import StateStore, read_doc, write_doc
from deployctl.rollout.warmup import warm_up
from deployctl.service.engine import Engine

SLOW_START_S = 30.0  # deployctl's default ramp: HAProxy's `slowstart` and Envoy's slow_start_window have none
RAMP_STEPS = 4
POOL_EXPIRY_S = 10 * 365 * 86400  # a warm-pool engine is kept asleep until scale out or scale in --purge


@dataclass
class ScaleResult:
    """``action`` out | in; ``paths`` {host: wake | start | sleep | stop}; ``timings`` {host: {phase: seconds}};
    ``to_serving_s`` {host: seconds from the command's start to the engine verified (before warm-up)};
    ``ramp`` [(seconds since start, percent per new host)]; ``cut`` {host: requests cut by the drain}."""

    action: str
    hosts: list[str]
    release: Optional[str]
    paths: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)
    to_serving_s: dict = field(default_factory=dict)
    warmup: dict = field(default_factory=dict)
    ramp: list = field(default_factory=list)
    cut: dict = field(default_factory=dict)
    duration_s: float = 0.0

    def to_json(self) -> dict:
        return dict(self.__dict__)


def _state(cfg: DeployConfig):
    from deployctl.hosts import Host

    hosts = [Host.from_config(h) for h in cfg.hosts]
    return hosts, StateStore(hosts, workers=cfg.rollout.parallel_hosts)


def _membership(cfg: DeployConfig) -> tuple[dict[str, dict], list[str], list[str]]:
    """members.view over connections of its own."""
    hosts, store = _state(cfg)
    try:
        return members.view(cfg, store)
    finally:
        for h in hosts:
            h.close()


def serving(cfg: DeployConfig) -> list[str]:
    """The hosts taking traffic: serving (rollout.members) and not cordoned, in deploy.yaml's order."""
    return _membership(cfg)[2]


def warm_pool(cfg: DeployConfig) -> list[str]:
    """The ``pool: warm`` hosts not serving and not cordoned: where ``scale_out`` can go by a wake (when their
    engine sleeps) or a start."""
    cordoned, on, _ = _membership(cfg)
    return [h.name for h in cfg.hosts if h.pool == "warm" and h.name not in on and h.name not in cordoned]


def _note(fleet: Fleet, name: str, step: str) -> None:
    doc = read_doc(fleet.store, "scale.json")
    doc.setdefault("hosts", {})[name] = {"step": step, "time": time.time()}
    write_doc(fleet.store, "scale.json", doc)


def _names(cfg: DeployConfig, names: list[str]) -> None:
    known = [h.name for h in cfg.hosts]
    for n in names:
        if n not in known:
            raise UsageError(f"host {n!r} is not in deploy.yaml's hosts",
                             fix=f"add it under hosts: (with `pool: warm` to keep it out of deploys until then); "
                                 f"known: {', '.join(known)}")
    if not names:
        raise UsageError("name at least one host", fix="deployctl scale out HOST")


def _up(fleet: Fleet, cfg: DeployConfig, h, target: str, peers: list) -> tuple[str, dict]:
    """One host to ``target``, verified: (path, timings)."""
    rec = standby.read(h)
    if rec is not None and rec.release == target and rec.port == layout.service_port(cfg, h.config) \
            and standby.asleep(h, cfg, rec):
        join.share_golden(h, target, peers)
        v = standby.wake(h, cfg, rec)
        standby._clear(h)
        return "wake", dict(v.timings)
    if rec is not None:  # a standby of another release (or port): its memory is the one a start needs
        standby.stop(h, cfg, rec)
    return "start", join.bring_up(fleet, h, cfg, target, peers, when="before it joins")


def scale_out(cfg: DeployConfig, names: list[str], *, say: Callable = print, slow_start_s: float = SLOW_START_S,
              warmup: Optional[dict] = None) -> ScaleResult:
    """Scale out onto ``names`` (module doc). ``warmup``: keyword arguments of warmup.warm_up (window, factor,
    max_requests). Returns the ScaleResult. Raises UsageError (unknown host, already serving, nothing serving to
    copy from), LockHeld, CheckFailed, HealthError / GoldenMismatch (exit 5: the host gets no weight), RemoteError."""
    _names(cfg, names)
    t0 = time.monotonic()
    fleet = Fleet(cfg, adapt(say))
    fleet.connect()
    try:
        cordoned, _, on = members.view(cfg, fleet.store)
        for n in names:
            if n in on:
                raise UsageError(f"{n} already serves", fix="`deployctl status` shows the serving hosts")
            if n in cordoned:
                raise UsageError(f"{n} is cordoned", fix=f"`deployctl hosts uncordon {n}` puts it back")
        peers = [n for n in on if n not in names]
        if not peers:
            raise UsageError("no host serves now to take the release from",
                             fix="run `deployctl deploy` first (it deploys the hosts without pool: warm)")
        fleet.lock("scale out")
        target = None
        try:
            target = majority(fleet.current_releases()[n] for n in peers)
            res = ScaleResult("out", list(names), target)
            peer_hosts = [fleet.hosts[n] for n in peers]
            for n in names:
                say(f"{n}: bringing up {target} (verify: ready, sample inference, golden answers)")
                _note(fleet, n, "up")

            def up(h):
                path, t = _up(fleet, cfg, h, target, peer_hosts)
                res.to_serving_s[h.name] = round(time.monotonic() - t0, 2)
                return path, t

            ok, bad = fleet.on_hosts([fleet.hosts[n] for n in names], up)
            if bad:
                n, e = next(iter(bad.items()))
                raise e if isinstance(e, DeployctlError) else CheckFailed(about(n, e))
            for n, (path, t) in ok.items():
                res.paths[n], res.timings[n] = path, t
                say(f"{n}: {'woken' if path == 'wake' else 'started'} and verified in {res.to_serving_s[n]:.2f} s "
                    f"({', '.join(f'{k} {v:g}' for k, v in t.items())})")
                _note(fleet, n, "verified")
            for n in names:
                res.warmup[n] = warm_up(cfg, fleet.hosts[n].config, [p.config for p in peer_hosts], say=say,
                                        **(warmup or {})).to_json()
            _ramp(fleet, names, slow_start_s, res, t0, say)
            for n in names:
                members.set_member(fleet.store, n, True)
                _note(fleet, n, "serving")
            res.duration_s = round(time.monotonic() - t0, 2)
            fleet.store.append_history("scale-out", release=target, result="ok", hosts=names, paths=res.paths,
                                       timings=res.timings, to_serving_s=res.to_serving_s, warmup=res.warmup,
                                       reason=f"scale out onto {', '.join(names)}")
            say(f"scaled out onto {', '.join(names)} in {res.duration_s:.1f} s: "
                f"{', '.join(f'{n} by {p}' for n, p in res.paths.items())}")
            return res
        except Exception as e:
            _failed(fleet, "scale-out", names, target, e)
            raise
    finally:
        fleet.unlock()
        fleet.close()


def _failed(fleet: Fleet, action: str, names: list[str], release: Optional[str], e: BaseException) -> None:
    """History says that a scale action failed and why (what the operator reads after a 3 a.m. autoscale)."""
    try:
        fleet.store.append_history(action, release=release, result="failed", hosts=names,
                                   reason=f"{type(e).__name__}: {e}")
    except Exception:  # the history is best effort here: the error itself is what the caller raises
        pass


def _ramp(fleet: Fleet, names: list[str], slow_start_s: float, res: ScaleResult, t0: float, say) -> None:
    """Give ``names`` their share over ``slow_start_s`` in RAMP_STEPS steps (module doc)."""
    last = fleet.router.read_split() or {}
    old = [n for n in [*last.get("stable", []), *last.get("canary", [])] if n in fleet.hosts and n not in names]
    drained = tuple(n for n in last.get("drained", []) if n in old)
    live = [n for n in old if n not in drained]
    fair = 100.0 * len(names) / (len(live) + len(names))
    for i in range(1, RAMP_STEPS + 1):
        if i == RAMP_STEPS:
            split = Split(tuple(old + names), (), 0, drained)
        else:
            split = Split(tuple(old), tuple(names), max(1, int(fair * i / RAMP_STEPS)), drained)
        shares = fleet.router.apply(split, guard_certificate=False)
        pct = shares.get(names[0], 0.0)
        res.ramp.append((round(time.monotonic() - t0, 2), pct))
        say(f"slow start {i}/{RAMP_STEPS}: {', '.join(names)} at {pct:g}% each")
        if i < RAMP_STEPS:
            time.sleep(slow_start_s / (RAMP_STEPS - 1))


def scale_in(cfg: DeployConfig, names: list[str], *, purge: bool = False, say: Callable = print) -> ScaleResult:
    """Scale in ``names`` (module doc). Returns the ScaleResult (``cut``: requests still running when the drain
    bound ended). Raises UsageError (unknown or not serving host, none left serving, fewer than
    autoscale.min_hosts left), LockHeld, RemoteError."""
    _names(cfg, names)
    t0 = time.monotonic()
    fleet = Fleet(cfg, adapt(say))
    fleet.connect()
    try:
        cordoned, on, _ = members.view(cfg, fleet.store)
        for n in names:
            if n not in on:
                raise UsageError(f"{n} does not serve", fix="`deployctl status` shows the serving hosts")
        left = [n for n in on if n not in names and n not in cordoned]
        if not left:
            raise UsageError(f"scaling in {', '.join(names)} would leave no host serving",
                             fix="scale out another host first")
        lo, _ = cfg.autoscale.bounds(len(cfg.hosts))
        if len(left) < lo:
            raise UsageError(f"scaling in {', '.join(names)} would leave {len(left)} host(s) serving, below "
                             f"autoscale.min_hosts {lo}",
                             fix="scale out another host first, or lower autoscale.min_hosts in deploy.yaml")
        fleet.lock("scale in")
        cur = fleet.current_releases()
        res = ScaleResult("in", list(names), majority(cur[n] for n in left))
        last = fleet.router.read_split() or {}
        stable = [n for n in [*last.get("stable", []), *last.get("canary", [])] if n in fleet.hosts]
        drained = [n for n in last.get("drained", []) if n in stable]
        fleet.router.apply(Split(tuple(stable), (), 0, tuple(dict.fromkeys(drained + names))), guard_certificate=False)
        say(f"{', '.join(names)}: router weight 0, draining")
        bound = standby.drain_bound_s(cfg)
        for n in names:
            _note(fleet, n, "drain")
            res.cut[n], waited = wait_drained(fleet.hosts[n], cfg, bound)
            say(f"{n}: drained in {waited:.2f} s" if not res.cut[n] else
                f"warning: {n}: {res.cut[n]} requests still running {bound:g} s after it left the router: cut")
        fleet.router.apply(Split(tuple(x for x in stable if x not in names), (), 0,
                                 tuple(x for x in drained if x not in names)), guard_certificate=False)
        say(f"{', '.join(names)}: out of the router")
        for n in names:
            h = fleet.hosts[n]
            res.paths[n], res.timings[n] = _down(h, cfg, cur[n], purge)
            say(f"{n}: {'engine asleep (warm pool)' if res.paths[n] == 'sleep' else 'engine stopped'}"
                + ("; releases removed (--purge)" if purge else "; its releases are kept"))
            members.set_member(fleet.store, n, False)
            _note(fleet, n, "out")
        res.duration_s = round(time.monotonic() - t0, 2)
        fleet.store.append_history("scale-in", release=res.release, result="ok", hosts=names, paths=res.paths,
                                   cut=res.cut, purge=purge, reason=f"scale in {', '.join(names)}")
        return res
    finally:
        fleet.unlock()
        fleet.close()


def prime(cfg: DeployConfig, names: Optional[list[str]] = None, *, say: Callable = print) -> dict:
    """Start the warm pool (``names``, default every ``warm_pool`` host) once and put it to sleep: the serving
    release installed, started, verified (ready, sample, golden answers) off the router, then asleep and recorded as
    the host's standby, so that ``scale_out`` wakes it. A host already asleep with that release is left. Returns
    {host: wake-ready timings}. Raises UsageError (a host that serves or has no pool: warm), LockHeld, HealthError /
    GoldenMismatch, RemoteError."""
    pool = warm_pool(cfg)
    names = list(pool if names is None else names)
    for n in names:
        if n not in pool:
            raise UsageError(f"{n} is not a warm-pool host out of service",
                             fix="mark it `pool: warm` in deploy.yaml, or `deployctl scale in` it first")
    fleet = Fleet(cfg, adapt(say))
    fleet.connect()
    try:
        _, _, peers = members.view(cfg, fleet.store)
        if not peers:
            raise UsageError("no host serves now to take the release from", fix="run `deployctl deploy` first")
        fleet.lock("scale warm")
        target = majority(fleet.current_releases()[n] for n in peers)
        out = {}
        for n in names:
            h = fleet.hosts[n]
            rec = standby.read(h)
            if rec is not None and rec.release == target and standby.asleep(h, cfg, rec):
                say(f"{n}: already asleep with {target}")
                continue
            if rec is not None:
                standby.stop(h, cfg, rec)
            say(f"{n}: starting {target} off the router to keep it asleep (verify: ready, sample, golden answers)")
            t = join.bring_up(fleet, h, cfg, target, [fleet.hosts[p] for p in peers], when="before it sleeps")
            path, t2 = _down(h, cfg, target, False)
            if path != "sleep":
                raise CheckFailed(f"{n}: the engine of {target} did not go to sleep; it was stopped",
                                  fix="check that the engine has a sleep mode (vLLM: --enable-sleep-mode)")
            out[n] = {**t, **t2}
            say(f"{n}: asleep with {target} ({', '.join(f'{k} {v:g}' for k, v in out[n].items())})")
        fleet.store.append_history("scale-warm", release=target, result="ok", hosts=names, timings=out,
                                   reason=f"warm pool: {', '.join(names) or 'nothing to start'}")
        return out
    finally:
        fleet.unlock()
        fleet.close()


def _down(h, cfg: DeployConfig, rel: Optional[str], purge: bool) -> tuple[str, dict]:
    """Sleep a warm-pool host's engine (recorded as its standby) or stop it; with ``purge`` remove the releases."""
    t0 = time.monotonic()
    port = layout.service_port(cfg, h.config)
    if h.config.pool == "warm" and not purge and rel:
        r = Engine(h, cfg, port, release=rel).sleep()
        if r.ok:
            now = time.time()
            standby._write(h, standby.Standby(rel, port, now, now + POOL_EXPIRY_S))
            return "sleep", {"sleep_s": round(time.monotonic() - t0, 2)}
    Engine(h, cfg).stop()
    if purge:
        q = shlex.quote
        h.run(f"rm -rf {q(layout.releases_dir(h.config))} {q(layout.current_link(h.config))} "
              f"{q(layout.standby_file(h.config))}", timeout=120)
    return "stop", {"stop_s": round(time.monotonic() - t0, 2)}
