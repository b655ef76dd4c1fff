"""``status`` and ``history``: what every host runs, whether it is ready, its share of traffic, the rollout in
progress (or the last one), and the merged history from the hosts' state/history.jsonl."""
from __future__ import annotations

from typing import Any

from deployctl.config import DeployConfig
from deployctl.engines import KINDS, adapter
from deployctl.rollout.events import emitter
from deployctl.rollout.fleet import Fleet
from deployctl.rollout.fleetcheck import differences, snapshot
from deployctl.service.http import http
from deployctl.rollout.lock import describe


def _host_status(h, cfg: DeployConfig) -> dict[str, Any]:
    snap = snapshot(h, cfg)
    kind = snap.get("engine")
    route = adapter(kind if kind in KINDS else cfg.engine.kind).ready_route
    r = http(h, cfg, "GET", route, timeout=3)
    detail = r.describe(route)
    if snap["runtime_running"] and not snap["supervised"]:
        detail = (f"unsupervised: the runtime (pid {snap.get('runtime_pid')}) serves but its supervisor "
                  f"(launch.sh) is not running, so nothing restarts it when it dies; "
                  f"`deployctl runbook run connection-resets --host {h.name}` restarts it")
    return {**snap, "healthy": r.status == 200 and bool(snap["supervised"]), "detail": detail}


def status(cfg: DeployConfig) -> dict[str, Any]:
    """``{"hosts": [{"host", "current_release", "healthy", "weight", "detail", "supervised", "runtime_running",
    "engine", "engine_version", "model_manifest", "config_hash", ...}], "rollout": {...}|None, "lock": {...}|None,
    "differences": [str]}`` (CONTRACTS.md). ``weight`` is the host's share of requests in percent (None when the
    router's split is unknown); ``healthy`` needs /readyz 200 and a live supervisor; ``differences`` names the
    hosts that run another release, engine, model manifest or config than the rest (deployctl.rollout.fleetcheck)."""
    from deployctl.rollout.hostops import on_hosts

    fleet = Fleet(cfg, emitter(None))
    try:
        fleet.connect()
        ok, bad = on_hosts(list(fleet.hosts.values()), lambda h: _host_status(h, cfg))
        split = None
        if fleet.router is not None:
            try:
                split = fleet.router.read_split()
            except Exception:
                split = None
        shares = (split or {}).get("shares", {})
        hosts = []
        for name in fleet.hosts:
            row = {"host": name, "current_release": None, "engine": None, "engine_version": None, "healthy": False,
                   "supervised": False,
                   "weight": shares.get(name, 0.0) if split else None}
            if name in ok:
                row.update(ok[name])
            else:
                row["detail"] = f"unreachable: {bad[name]}"
            hosts.append(row)
        st = fleet.store.read_rollout()
        locks = fleet.inspect_lock()
        lock = None
        if locks:
            i = locks[0]
            lock = {"owner": i.owner.get("owner"), "pid": i.owner.get("pid"), "started": i.owner.get("started"),
                    "command": i.owner.get("command"), "stale": i.stale, "why_stale": i.why_stale,
                    "text": describe(i.owner)}
        return {"hosts": hosts, "rollout": st.to_json() if st else None, "lock": lock,
                "differences": differences(hosts)}
    finally:
        fleet.close()


def history(cfg: DeployConfig) -> list[dict[str, Any]]:
    """Every record from the hosts' history.jsonl, merged and oldest first."""
    fleet = Fleet(cfg, emitter(None))
    try:
        fleet.connect()
        return fleet.store.read_history()
    finally:
        fleet.close()
