"""Whether a sleeping standby can wake beside the release serving on its host (rollback, issue 25).

A wake beside the serving runtime needs one more full copy on the GPU: the standby's weights and a new KV pool,
less the residue it kept while asleep. On a GPU filled to ``gpu_memory_utilization`` 0.9 that does not fit, so
the rollback must drain and stop the bad release first (``rollout.rollback_wake``). The answer comes from the
host's own GPU facts (the probe's ``nvidia`` section: NVML on a real GPU, the stand-in ledger of
runtime/deployctl_runtime/gpu_ledger.py in tests) and the pids behind the two runtimes' pidfiles: the serving
runtime's bytes are what one awake copy takes, the standby's bytes what it already holds.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Optional

from deployctl.config import DeployConfig, layout
from deployctl.config.units import format_bytes


@dataclass(frozen=True)
class WakeFit:
    """``beside``: both copies fit awake at once (wake first, then stop the bad release); False: stop it first.
    ``why`` says so with the numbers (bytes per GPU); ``free_bytes`` / ``need_bytes`` of the tightest GPU
    (None without a GPU)."""

    beside: bool
    why: str
    free_bytes: Optional[int] = None
    need_bytes: Optional[int] = None

    def to_json(self) -> dict:
        return {"beside": self.beside, "why": self.why, "free_bytes": self.free_bytes, "need_bytes": self.need_bytes}


def _held(gpu: dict, pids: set) -> Optional[int]:
    used = [p.get("used_memory") for p in gpu.get("processes") or [] if p.get("pid") in pids]
    if not used or any(u is None for u in used):
        return None
    return sum(used)


def decide(cfg: DeployConfig, host_cfg, facts: dict, serving_pids: set, standby_pids: Optional[set],
           recorded: Optional[dict] = None) -> WakeFit:
    """The decision from probe facts (pure; ``facts``: ``{"nvidia": probe_nvidia's section}``); ``standby_pids``
    None: a new start beside, which holds nothing yet. No GPU visible
    and ``engine.device`` cpu: beside (both copies in host RAM). A GPU whose per-process memory is unknown: one
    copy is taken as ``gpu_memory_utilization`` × total (vLLM's share) and the standby's hold as its adapter's
    ``gpu_residue_bytes`` — or, when the host measured it after the sleep (``recorded``: the standby record's
    ``residue_bytes``, ``{"<gpu>": bytes}``, rollout.residue), that figure. NVML unreadable on a cuda host: stop first (the order that never needs two copies)."""
    from deployctl.engines import of

    nv = facts.get("nvidia") or {}
    gpus = {g.get("index"): g for g in nv.get("gpus") or []}
    if not nv.get("available") or not gpus:
        if cfg.engine.device == "cuda":
            return WakeFit(False, f"GPU memory unknown (NVML: {nv.get('error') or 'no GPU'}): taken as two copies "
                                  "not fitting, the order that never needs them")
        return WakeFit(True, "no GPU: two copies fit in host memory")
    mode = of(cfg).sleep
    residue = mode.gpu_residue_bytes if mode is not None else 0
    found = []
    for index in (host_cfg.gpu_ids if cfg.engine.device == "cuda" else [min(gpus)]):
        gpu = gpus.get(index)
        if gpu is None:
            return WakeFit(False, f"GPU {index} not visible to NVML: taken as two copies not fitting")
        total, free = int(gpu["memory_total"]), int(gpu["memory_free"])
        copy = _held(gpu, serving_pids) or int(total * cfg.engine.gpu_memory_utilization)
        kept = 0 if standby_pids is None else _held(gpu, standby_pids)
        if kept is None:
            kept = int(recorded[str(index)]) if recorded and str(index) in recorded else residue
        need = max(0, copy - kept)
        fits = free >= need
        why = (f"GPU {index}: {format_bytes(free)} free of {format_bytes(total)}, the wake needs {format_bytes(need)} "
               f"(one awake copy {format_bytes(copy)} − the {format_bytes(kept)} already held): "
               + ("two copies fit" if fits else "two copies do not fit"))
        found.append(WakeFit(fits, why, free, need))
    return min(found, key=lambda f: (f.beside, f.free_bytes - f.need_bytes))  # the tightest GPU decides


def probe_gpu(host, pid_files: list[str], *, timeout: float = 30) -> dict:
    """The probe's ``nvidia`` and ``pids`` sections on ``host`` (one SSH round trip): ``{"nvidia": {...}, "pids":
    {pid file: [pids]}}`` (NVML, or the stand-in ledger in tests; bytes). Raises RemoteError."""
    from deployctl.hostscripts import probe
    from deployctl.hostscripts.snippets import module_argv

    params = {"sections": ["nvidia", "pids"], "pid_files": pid_files}
    r = host.run(module_argv(host.config.python, probe, json.dumps(params)), timeout=timeout)
    return json.loads(r.stdout.strip().splitlines()[-1])


def wake_fit(host, cfg: DeployConfig, standby_port: Optional[int], *, timeout: float = 30,
             recorded: Optional[dict] = None) -> WakeFit:
    """Run the probe's ``nvidia`` and ``pids`` sections on ``host`` (one SSH round trip) and ``decide``.
    ``standby_port``: the port the standby sleeps on (its pidfile ``runtime.<port>.pid``); None: a deploy's new
    release, which holds nothing yet (a second copy must fit whole). Raises RemoteError."""
    h = host.config
    serving = layout.pid_file(h)
    standby = layout.spare_pid_file(h, standby_port) if standby_port else None
    facts = probe_gpu(host, [serving] + ([standby] if standby else []), timeout=timeout)
    pids = facts.get("pids") or {}
    return decide(cfg, h, facts, set(pids.get(serving) or []), set(pids.get(standby) or []) if standby else None,
                  recorded)
