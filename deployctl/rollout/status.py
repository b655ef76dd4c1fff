"""``status`` and ``history``: what every host runs, whether it is ready, its share of traffic, the rollout in
progress (or the last one), and the merged history from the hosts' state/history.jsonl."""
from __future__ import annotations

from typing import Any

from deployctl.config import DeployConfig
from deployctl.engines import KINDS, adapter
from deployctl.rollout import release
from deployctl.rollout.events import emitter
from deployctl.rollout.fleet import Fleet
from deployctl.service.http import http
from deployctl.rollout.lock import describe


def _host_status(h, cfg: DeployConfig) -> dict[str, Any]:
    cur = release.current_release(h)
    kind, version = release.engine_of(h, cur) if cur else (None, None)
    route = adapter(kind if kind in KINDS else cfg.engine.kind).ready_route
    r = http(h, cfg, "GET", route, timeout=3)
    return {"current_release": cur, "engine": kind, "engine_version": version, "healthy": r.status == 200,
            "detail": f"{route} {r.status}" if r.status else (r.error or "no answer")}


def status(cfg: DeployConfig) -> dict[str, Any]:
    """``{"hosts": [{"host", "current_release", "engine", "engine_version", "healthy", "weight", "detail"}], "rollout": {...}|None,
    "lock": {...}|None}`` (CONTRACTS.md). ``weight`` is the host's share of requests in percent (None when the
    router's split is unknown)."""
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
        return {"hosts": hosts, "rollout": st.to_json() if st else None, "lock": lock}
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
