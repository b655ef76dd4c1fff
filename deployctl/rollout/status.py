"""``status`` and ``history``: what every host runs, whether it is ready, its share of traffic, the rollout in
progress (or the last one), and the merged history from the hosts' state/history.jsonl."""
from __future__ import annotations

from typing import Any

from deployctl.config import DeployConfig
from deployctl.engines import KINDS, adapter_for
from deployctl.rollout import kvrecord, standby
from deployctl.rollout.events import emitter
from deployctl.rollout.fleet import Fleet
from deployctl.rollout.fleetcheck import differences, snapshot
from deployctl.service.engine import Engine
from deployctl.rollout.lock import describe
from deployctl.rollout.state import IN_PROGRESS


def _host_status(h, cfg: DeployConfig) -> dict[str, Any]:
    snap = snapshot(h, cfg)
    kind = snap.get("engine")
    a = adapter_for(cfg, kind if kind in KINDS else None)
    route = a.ready_route
    r = Engine(h, cfg).http("GET", route, timeout=max(3, a.probe_timeout_s))
    detail = r.describe(route)
    if snap["runtime_running"] and not snap["supervised"]:
        detail = (f"unsupervised: the runtime (pid {snap.get('runtime_pid')}) serves but its supervisor "
                  f"(launch.sh) is not running, so nothing restarts it when it dies; "
                  f"`deployctl runbook run connection-resets --host {h.name}` restarts it")
    rec = standby.read(h)
    sb = None if rec is None else {**rec.to_json(), "asleep": standby.asleep(h, cfg, rec)}
    none = standby.read_none(h) if rec is None else None
    current = snap.get("current_release")
    kv = kvrecord.plan_vs_actual(kvrecord.read(h, current)) if current else None
    from deployctl.rollout.diskcheck import host_disk

    return {**snap, "kv_plan_vs_actual": kv, "disk": host_disk(h, cfg), "healthy": r.status == 200 and bool(snap["supervised"]), "detail": detail, "standby": sb,
            "no_standby": none}


def status(cfg: DeployConfig) -> dict[str, Any]:
    """``{"hosts": [{"host", "current_release", "healthy", "weight", "detail", "supervised", "runtime_running",
    "engine", "engine_version", "model_manifest", "config_hash", "standby": {"release", "port", "since",
    "expires_at", "expires", "expired", "asleep", "residue_bytes": {"<gpu>": bytes}|None, "measured"?}|None,
    "no_standby": {"release", "why", "at"}|None (why the last deploy kept no standby there), "cordoned": {"by",
    "reason", "since", "stopped"}|None, "serving": bool (false: warm pool or scaled in; deployctl.rollout.members),
    "kv_plan_vs_actual": kvrecord.plan_vs_actual of the current release (plan vs the engine's own KV
    statement)|None, "disk": {"path", "checked_path", "free_bytes", "leftover_bytes", "leftovers", "need_bytes",
    "need": [{"what", "bytes"}], "fits", "low", "line"}|None (deploy_root's free space against what the next deploy
    would need: deployctl.rollout.diskcheck.host_disk), ...}], "rollout": {...}|None, "lock": {...}|None,
    "differences": [str]}`` (CONTRACTS.md). ``weight`` is the host's share of requests in percent (None when the
    router's split is unknown); ``healthy`` needs /readyz 200 and a live supervisor; ``differences`` names the
    hosts that run another release, engine, model manifest or config than the rest (deployctl.rollout.fleetcheck)."""
    fleet = Fleet(cfg, emitter(None))
    try:
        fleet.connect()
        ok, bad = fleet.on_hosts(list(fleet.hosts.values()), lambda h: _host_status(h, cfg))
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
        from deployctl.rollout import members

        cordoned, on, _ = members.view(cfg, fleet.store)
        serving = set(on)
        for row in hosts:
            row["cordoned"] = cordoned.get(row["host"])
            row["serving"] = row["host"] in serving
        st = fleet.store.read_rollout()
        locks = fleet.inspect_lock()
        lock = None
        if locks:
            i = locks[0]
            lock = {"owner": i.owner.get("owner"), "pid": i.owner.get("pid"), "started": i.owner.get("started"),
                    "command": i.owner.get("command"), "stale": i.stale, "why_stale": i.why_stale,
                    "text": describe(i.owner)}
        return {"hosts": hosts, "rollout": st.to_json() if st else None, "lock": lock,
                "differences": differences([h for h in hosts if h["serving"] and not h["cordoned"]]), "journal": journal_status(cfg, st)}
    finally:
        fleet.close()


def rollout_live(doc: dict[str, Any]) -> bool:
    """A :func:`status` document's rollout is in progress and its deploy lock is held and fresh (a runner is at
    it, here or on another machine)."""
    ro, lock = doc.get("rollout"), doc.get("lock")
    return bool(ro and ro["status"] in IN_PROGRESS and lock and not lock["stale"])


def check_problems(doc: dict[str, Any]) -> list[str]:
    """What ``status --check`` exits 1 on, from a :func:`status` document: every unhealthy host, and every host
    that differs from the rest. While a rollout is live (in progress on the hosts and its deploy lock held and
    fresh, so a runner is at it), its canary hosts run another release than the rest by design: the hosts are then
    compared within the rollout's release and within the one it replaces, and a host on neither release is named;
    a host the rollout took out of the router (weight 0) may be down while it is switched. A rollout in progress
    that nobody runs (no lock, or a stale one) is named too."""
    live = rollout_live(doc)
    # a live rollout takes a host out of the router (weight 0) while it switches it: not serving is its job then
    problems = [f"{h['host']} unhealthy ({h.get('detail') or 'no answer'})" for h in doc["hosts"]
                if not h["healthy"] and not (live and h.get("weight") == 0)
                and h.get("serving", True) and not h.get("cordoned")]  # out of service on purpose (issue 42)
    ro, lock = doc.get("rollout"), doc.get("lock")
    if not ro or ro["status"] not in IN_PROGRESS:
        return problems + doc["differences"]
    if not live:
        why = "no deploy holds the lock" if not lock else f"its lock is stale: {lock.get('why_stale')}"
        return problems + [f"the {ro['action']} of {ro['release']} is {ro['status']} on the hosts but nobody runs "
                           f"it ({why}): `deployctl deploy --resume` continues it, `deployctl rollback` ends it"] \
            + doc["differences"]
    pair = (ro["release"], ro.get("from_release"))
    rows = [h for h in doc["hosts"] if h.get("current_release")]
    for release in pair:
        problems += differences([h for h in rows if h["current_release"] == release])
    problems += [f"{h['host']}: release {h['current_release']} is neither the rollout's {pair[0]} nor the "
                 f"{pair[1]} it replaces" for h in rows if h["current_release"] not in pair]
    return problems + _off_plan(ro, rows) if ro["status"] != "aborting" else problems


def _off_plan(ro: dict[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    """Hosts the router sends traffic to on another release than the rollout's step has them on: its canary
    hosts on its release, its stable hosts on the one it replaces while the canary weight is under 100 (from 100
    on, the batches move them and the router sends only to the new release)."""
    out, canaries, at_100 = [], set(ro.get("canary_hosts") or []), (ro.get("weight") or 0) >= 100
    for h in rows:
        if not h.get("weight"):
            continue  # no traffic (drained while it is switched), or the split is unknown
        canary = h["host"] in canaries
        want = ro["release"] if canary or at_100 else ro.get("from_release")
        if want and h["current_release"] != want:
            role = "a canary host" if canary else "a stable host"
            out.append(f"{h['host']}: {role} on {h['current_release']} with {h['weight']:g}% of the traffic while the "
                       f"rollout at {ro.get('weight')}% has it on {want}")
    return out


def journal_status(cfg: DeployConfig, st) -> dict[str, Any] | None:
    """What this machine's rollout journal says of the hosts' rollout ``st``: ``{"release", "done": [steps],
    "open_step", "finished", "pid", "runner_alive", "resumable"}``, or None when the journal is absent or of another
    rollout than the hosts'. It is theirs when it names their release, and also when it is unfinished and newer
    than their record (its generation above theirs: a deploy killed at its ``start`` record, before it wrote
    rollout.json). ``runner_alive``: the journal's last deploy process still runs here (deployctl.rollout.procs).
    ``resumable``: in progress on the hosts (or not yet recorded there), its deploy process gone and the journal
    unfinished, so `deploy --resume` continues it. ``windows``: per weight step (its label) the analysis windows
    journaled in it, each with its numbers, thresholds, verdict and reason (deployctl.rollout.replay)."""
    from deployctl.rollout import procs
    from deployctl.rollout.journal import Progress, read

    p = Progress.of(read(cfg.service.name))
    if p.start is None:
        return None
    release = p.start["release"]["id"]
    ahead = p.unfinished and (st is None or st.generation < int(p.start.get("generation") or 0))
    if not ahead and (st is None or release != st.release):
        return None
    alive = procs.is_deploy(p.pid, cfg.service.name) if p.unfinished else False
    in_progress = True if ahead else st.in_progress
    return {"release": release, "done": list(p.ended), "open_step": p.open_step,
            "open_step_label": p.label(p.open_step) if p.open_step else None, "finished": not p.unfinished,
            "pid": p.pid, "runner_alive": alive, "resumable": in_progress and p.unfinished and not alive,
            "windows": {p.label(step): w for step, w in p.windows.items()}}


def history(cfg: DeployConfig) -> list[dict[str, Any]]:
    """Every record from the hosts' history.jsonl, merged and oldest first."""
    fleet = Fleet(cfg, emitter(None))
    try:
        fleet.connect()
        return fleet.store.read_history()
    finally:
        fleet.close()
