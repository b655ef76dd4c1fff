"""The host's record of what its engine allocated against the plan (issue 44): ``<release>/allocated.json``.

Written once per start (``record``, after the engine is verified): the engine's own statement from its start log
(deployctl.capacity.enginelog.parse over the log since the start's offset), the capacity plan for this host from
its own facts (preflight's ``plan_from_facts`` over the probe's ``model``, ``nvidia`` and ``service`` sections:
config.json, safetensors headers, NVML), and the processes on the
host's GPUs that are not this service's engine. ``status`` reads it back (``read``) and compares
(enginelog.compare). The plan is only computed when the log parsed, so a start of an engine whose log says
nothing known costs one log read.
"""
from __future__ import annotations

import json
import posixpath
import shlex
import time
from typing import Optional

from deployctl.config import DeployConfig, layout

RECORD = "allocated.json"


def _log_since(host, since: int) -> str:
    r = host.run(f"tail -c +{int(since) + 1} {shlex.quote(layout.log_file(host.config))} 2>/dev/null "
                 f"| head -c 400000", timeout=15)
    return r.stdout


def _plan(host, cfg: DeployConfig) -> tuple[dict, list]:
    """({"kv_tokens", "kv_bytes", "utilization", "graphs_reserve_bytes"} or {"error"}, foreign GPU processes)."""
    from deployctl.hostscripts import probe
    from deployctl.hostscripts.snippets import module_argv
    from deployctl.preflight.base import gpu_of, service_pids, standby_pids
    from deployctl.preflight.capacity import plan_from_facts
    from deployctl.preflight.gather import probe_params

    # the probe's cheap sections only (no torch import, no port or disk checks): one SSH round trip
    params = {**probe_params(cfg, host.config), "sections": ["model", "nvidia", "service"]}
    r = host.run(module_argv(host.config.python, probe, json.dumps(params)), timeout=60)
    facts = json.loads(r.stdout.strip().splitlines()[-1])
    sized, reason = plan_from_facts(cfg, host.config, facts)
    if sized is None:
        return {"error": reason}, []
    p = sized.plan
    reserve = getattr(sized, "reserve", None)
    graphs = getattr(reserve, "cudagraph", None) if reserve is not None else None
    plan = {"kv_tokens": p.kv_pool_tokens, "kv_bytes": p.kv_pool_tokens * p.kv_bytes_per_token,
            "utilization": cfg.engine.gpu_memory_utilization if cfg.engine.device == "cuda" else None,
            "graphs_reserve_bytes": graphs}
    known = service_pids(facts) | standby_pids(facts)
    others = []
    if cfg.engine.device == "cuda":
        for index in host.config.gpu_ids:
            for proc in (gpu_of(facts, host.config, index) or {}).get("processes") or []:
                if proc.get("pid") not in known:
                    others.append({k: proc.get(k) for k in ("pid", "name", "used_memory")})
    return plan, others


def record(host, cfg: DeployConfig, release_id: str, since: int) -> Optional[dict]:
    """Parse the start log from byte ``since``, size the plan, write ``<release>/allocated.json`` on ``host``;
    returns the document (None when the log could not be read). Never raises: a report, never a failure."""
    from deployctl.capacity.enginelog import parse

    try:
        actual = parse(_log_since(host, since), cfg.engine.kind, cfg.engine.block_size or 16)
        doc: dict = {"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "actual": actual.to_json(),
                     "plan": None, "others": []}
        if actual.parsed:
            t0 = time.monotonic()
            try:
                doc["plan"], doc["others"] = _plan(host, cfg)
                doc["plan_s"] = round(time.monotonic() - t0, 2)  # the host probe's cost, once per start
            except Exception as e:  # noqa: BLE001 - the plan is a comparison, never a failure
                doc["plan"] = {"error": f"{type(e).__name__}: {e}"}
        path = posixpath.join(layout.release_dir(host.config, release_id), RECORD)
        host.put_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", path)
        return doc
    except Exception:  # noqa: BLE001
        return None


def read(host, release_id: str) -> Optional[dict]:
    """The record of ``release_id`` on ``host`` or None (never written, unreadable)."""
    try:
        r = host.run(f"cat {shlex.quote(posixpath.join(layout.release_dir(host.config, release_id), RECORD))} "
                     f"2>/dev/null", timeout=15)
        return json.loads(r.stdout) if r.stdout.strip() else None
    except Exception:  # noqa: BLE001
        return None


def plan_vs_actual(doc: Optional[dict]) -> Optional[dict]:
    """enginelog.compare of a record (None without one); ``{"note"}`` when the plan could not be sized."""
    from deployctl.capacity.enginelog import Allocated, compare

    if not doc:
        return None
    actual = Allocated.from_json(doc.get("actual") or {})
    plan = doc.get("plan") or {}
    if actual.parsed and plan.get("error"):
        return {"actual": {"kv_tokens": actual.kv_tokens, "kv_bytes": actual.kv_bytes}, "flagged": False,
                "causes": [], "note": f"no plan: {plan['error']}", "format": actual.format}
    return compare(plan.get("kv_tokens"), plan.get("kv_bytes"), actual, utilization=plan.get("utilization"),
                   graphs_reserve_bytes=plan.get("graphs_reserve_bytes"), others=doc.get("others"))
