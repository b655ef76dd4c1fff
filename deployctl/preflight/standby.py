"""Preflight checks for a host with ``hosts[].spare_port`` (issue 25): the memory a second copy of the service
needs there, over the host's facts.

- ``standby_ram``: a sleeping standby (``rollout.standby_s`` > 0, an engine whose sleep keeps its weights in host
  RAM: ``Sleep.weights_in_host_ram``) holds a copy of the weights in host RAM; they must fit in what the host has
  available (the probe's ``memory.available_bytes``, /proc/meminfo MemAvailable). Fails with both numbers.
- ``spare_port_gpu``: without a sleeping standby (standby_s 0, or an engine without a sleep mode) a deploy or
  rollback on a cuda host starts the second release *beside* the serving one, awake: refused unless the plan
  shows two full copies (weights + KV pool + overhead each, per GPU) fit in the GPU's memory.
- ``standby_fit``: where the host measured its sleeper's GPU residue at the last sleep (``facts["standby"]``:
  gather.standby_facts, from standby.json or the no-standby note), the serving release will leave that much behind
  when it sleeps; if that is more than the GPU has free beside the serving release (counting the standby the
  deploy stops first as free), the next release does not fit beside it: a fail with ``rollout.standby_misfit:
  fail`` (the deploy would stop there), a warn with ``drop`` (it drops the standby and starts cold).
Hosts without spare_port get none of these checks.
"""
from __future__ import annotations

from typing import Optional

from deployctl.config import DeployConfig, HostConfig
from deployctl.config.units import format_bytes
from deployctl.engines import of, standby_enabled
from deployctl.preflight.base import Check, gpu_of as _gpu, service_pids as _service_pids


def _weights(sized, facts: dict) -> tuple[Optional[int], str]:
    model = facts.get("model") or {}
    if model.get("weights_bytes"):
        return int(model["weights_bytes"]), "safetensors headers on the host"
    if sized is not None:
        return sized.plan.weights_bytes * sized.tensor_parallel_size, "the capacity plan"
    return None, ""


def check_standby_ram(cfg: DeployConfig, host: HostConfig, facts: dict, sized) -> Check:
    """The sleeper's weights against the host's available RAM (see module doc)."""
    need, source = _weights(sized, facts)
    mem = facts.get("memory") or {}
    avail = mem.get("available_bytes")
    fix = (f"free host RAM on {host.name}, or set rollout.standby_s: 0 (rollbacks become cold starts), or remove "
           f"hosts[{host.name}].spare_port")
    if need is None or avail is None:
        what = "the weights' size" if need is None else "the host's available RAM"
        return Check("standby_ram", "warn", f"{what} is unknown on {host.name} ({mem.get('error') or 'not probed'}): "
                     "cannot tell whether a sleeping standby's weights fit in host RAM", fix)
    head = (f"a sleeping standby keeps its weights in host RAM: {format_bytes(need)} ({source}); {host.name} has "
            f"{format_bytes(int(avail))} available")
    if need > int(avail):
        return Check("standby_ram", "fail", head + (f" of {format_bytes(int(mem['total_bytes']))}"
                                                    if mem.get("total_bytes") else ""), fix)
    return Check("standby_ram", "pass", head)


def check_spare_port_gpu(cfg: DeployConfig, host: HostConfig, facts: dict, sized) -> Check:
    """Two awake copies on each of the host's GPUs (see module doc)."""
    why = ("rollout.standby_s is 0" if cfg.rollout.standby_s <= 0
           else f"engine {cfg.engine.kind} has no sleep mode")
    fix = (f"set rollout.standby_s > 0 with an engine that sleeps (the old copy sleeps: only its residue stays on the "
           f"GPU), or remove hosts[{host.name}].spare_port (rollbacks restart in batches)")
    if sized is None:
        return Check("spare_port_gpu", "warn", f"skipped: no capacity plan for {host.name}", fix)
    p = sized.plan
    overhead = sized.inputs.runtime_overhead_bytes + (sized.reserve.outside if sized.reserve else 0)
    one = p.weights_bytes + p.kv_pool_bytes + overhead
    parts = (f"weights {format_bytes(p.weights_bytes)} + KV pool {format_bytes(p.kv_pool_bytes)} + overhead "
             f"{format_bytes(overhead)}")
    for index in host.gpu_ids:
        gpu = _gpu(facts, host, index)
        if gpu is None:
            return Check("spare_port_gpu", "warn", f"skipped: GPU {index} not found on {host.name}", fix)
        ours = sum(proc.get("used_memory") or 0 for proc in gpu.get("processes") or []
                   if proc["pid"] in _service_pids(facts))
        avail = int(gpu["memory_free"]) + ours
        if 2 * one > avail:
            total = int(gpu["memory_total"])
            half = int(avail / 2 / total * 100) / 100  # each copy's share of the GPU at most half of what is free
            return Check("spare_port_gpu", "fail",
                         f"hosts[{host.name}].spare_port starts the next release beside the serving one, awake ({why}): "
                         f"two copies need {format_bytes(2 * one)} (2 × {parts}) but GPU {index} "
                         f"({format_bytes(total)}) has {format_bytes(avail)}",
                         fix + f", or set engine.gpu_memory_utilization <= {half:.2f} (two copies fit)")
    return Check("spare_port_gpu", "pass", f"two awake copies fit on {host.name}'s GPU(s): 2 × {format_bytes(one)} "
                 f"({parts})")


def check_standby_fit(cfg: DeployConfig, host: HostConfig, facts: dict) -> Optional[Check]:
    """The measured residue against the GPU's room beside the serving release (see module doc); None when no
    residue was measured on the host."""
    sb = facts.get("standby") or {}
    recorded = sb.get("residue_bytes") or {}
    if not recorded:
        return None
    gpus = {g.get("index"): g for g in (facts.get("nvidia") or {}).get("gpus") or []}
    indices = host.gpu_ids if cfg.engine.device == "cuda" else sorted(gpus)[:1]
    fail = cfg.rollout.standby_misfit == "fail"
    fix = (f"lower engine.gpu_memory_utilization on {host.name} so that the residue fits beside the next release, "
           + ("or set rollout.standby_misfit: drop (the deploy stops the standby and starts cold), "
              if fail else "") + "or set rollout.standby_s: 0")
    asleep = set(sb.get("pids") or [])
    for index in indices:
        gpu = gpus.get(index)
        kept = recorded.get(str(index))
        if gpu is None or kept is None:
            continue
        freed = sum(p.get("used_memory") or 0 for p in gpu.get("processes") or [] if p.get("pid") in asleep)
        room = int(gpu["memory_free"]) + freed
        if room < int(kept):
            then = ("the deploy stops there (rollout.standby_misfit: fail)" if fail
                    else "the deploy drops the standby and starts the new release cold (rollout.standby_misfit: drop)")
            return Check("standby_fit", "fail" if fail else "warn",
                         f"GPU {index} on {host.name}: the sleeping standby's residue measured at the last sleep, "
                         f"{format_bytes(int(kept))}, is more than the {format_bytes(room)} free beside the serving "
                         f"release: the next release will not fit beside it; {then}", fix)
    how = (sb.get("measured") or {}).get("how") or "the host"
    figures = ", ".join(f"GPU {g}: {format_bytes(int(b))}" for g, b in sorted(recorded.items()))
    return Check("standby_fit", "pass", f"the sleeping standby's measured residue ({figures}, {how}) fits beside "
                 f"the serving release on {host.name}")


def standby_checks(cfg: DeployConfig, host: HostConfig, facts: dict, sized) -> list[Check]:
    """The checks that apply to ``host``: none without spare_port; standby_ram with a sleeping standby whose
    weights go to host RAM; spare_port_gpu on a cuda host without one."""
    if not host.spare_port:
        return []
    if standby_enabled(cfg):
        fit = check_standby_fit(cfg, host, facts)
        return ([check_standby_ram(cfg, host, facts, sized)] if of(cfg).sleep.weights_in_host_ram else []) \
            + ([fit] if fit else [])
    return [check_spare_port_gpu(cfg, host, facts, sized)] if cfg.engine.device == "cuda" else []
