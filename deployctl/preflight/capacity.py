"""Does the engine fit this host's GPUs: the capacity plan from the host's facts (plan_from_facts), its verdict
(``capacity``), hosts[].gpus against tensor parallelism (``gpus``) and the free VRAM on every GPU (``gpu_memory``).
Pure functions of (config, host config, facts), like deployctl.preflight.checks, which runs them in its order.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Optional

from deployctl.config import DeployConfig, HostConfig
from deployctl.config.units import format_bytes
from deployctl.preflight.base import Check, gpu_of as _gpu, service_pids as _service_pids

MiB = 2**20


def _mib(n: int) -> str:
    return f"{n / MiB:,.0f} MiB"


def plan_from_facts(cfg: DeployConfig, host: HostConfig, facts: dict):
    """The capacity plan (deployctl.capacity.sizing, the one code path) for this host: config.json from the
    host's model dir, weights bytes from its safetensors headers, GPU memory from NVML facts.
    Returns (SizedPlan, None) or (None, reason)."""
    from deployctl.capacity.sizing import size_plan
    from deployctl.engines import of, standby_residue_bytes

    model = facts.get("model") or {}
    if not model.get("config"):
        return None, f"no config.json in {cfg.model.path} on {host.name} ({model.get('error') or 'model dir missing'})"
    gpu_total = None
    if cfg.engine.device == "cuda" and cfg.engine.num_gpu_blocks_override is None:
        gpu = _gpu(facts, host)
        if gpu is None:
            nv = facts.get("nvidia") or {}
            return None, f"GPU {host.gpu} memory unknown on {host.name} (NVML: {nv.get('error') or 'no such GPU'})"
        gpu_total = int(gpu["memory_total"])
    with tempfile.TemporaryDirectory(prefix="deployctl-plan-") as tmp:
        path = Path(tmp) / "config.json"
        path.write_text(json.dumps(model["config"]))
        host_weights = int(model["weights_bytes"]) if model.get("weights_bytes") else None
        residue = standby_residue_bytes(cfg, [host])
        source = of(cfg).sleep.residue_source if residue else ""
        measured = ((facts.get("standby") or {}).get("residue_bytes") or {}) if residue else {}
        if measured:  # the host measured its sleeper (rollout.residue): that figure, not the adapter's estimate
            residue = max(int(v) for v in measured.values())
            how = ((facts.get("standby") or {}).get("measured") or {}).get("how") or "the host"
            source = f"measured on {host.name} after the last sleep ({how})"
        sized = size_plan(cfg.engine, None, model_config=path, dtype=cfg.model.dtype, gpu_memory=gpu_total,
                          weights=host_weights, weights_source="safetensors headers on host" if host_weights else None,
                          standby_residue=residue, standby_source=source)
    return sized, None


# At or above this gpu_memory_utilization preflight warns: 3% of an 80 GB GPU (2.4 GiB) is about the CUDA context +
# NCCL + one fragmentation spike (deployctl.engines.reserve's CUDA_CONTEXT_BYTES + NCCL_BYTES = 0.8 GiB, ×3).
HIGH_UTILIZATION = 0.97


def check_capacity(sized, reason: Optional[str], cfg: Optional[DeployConfig] = None) -> Check:
    """capacity.verdict on the host's plan (C01); for an engine told its block count (Adapter.explicit_cache:
    transformers serve ``--cb-num-blocks``, which allocates exactly that), a fail when the rendered count exceeds
    the blocks the plan's memory budget holds, naming the plan's count."""
    if sized is None:
        return Check("capacity", "warn", f"skipped: {reason}", "fix the checks above, then re-run preflight")
    told = _told_blocks_over_plan(cfg, sized) if cfg is not None else None
    if told is not None:
        return told
    from deployctl.capacity.sizing import plan_verdict

    status, message = plan_verdict(sized)
    fix = None
    if sized.weights_problem:
        fix = (f"set engine.tensor_parallel_size {sized.smallest_tp}" if sized.smallest_tp
               else "use larger GPUs or quantized weights")
    elif status != "pass":
        p = sized.plan
        fix = (f"set engine.max_model_len <= {p.max_feasible_model_len}, or give the KV cache more memory"
               if status == "fail" else f"set engine.max_num_seqs to {p.max_feasible_num_seqs}, or add memory")
    util = sized.inputs.gpu_memory_utilization
    if status == "pass" and sized.inputs.gpu_memory_bytes and util >= HIGH_UTILIZATION:
        status, fix = "warn", "set engine.gpu_memory_utilization to 0.90–0.95"
        message += (f"; gpu_memory_utilization {util:g} leaves {_mib(sized.inputs.gpu_memory_bytes * (1 - util))} for "
                    "the CUDA context, NCCL and anything else on the GPU: vLLM refuses to start when free memory is "
                    "below its share, and a fragmentation spike has no room")
    return Check("capacity", status, message, fix)


def _told_blocks_over_plan(cfg: DeployConfig, sized) -> Optional[Check]:
    from deployctl.engines import of
    from deployctl.engines.command import num_gpu_blocks

    e, p = cfg.engine, sized.plan
    if not of(cfg).explicit_cache or e.num_gpu_blocks_override or num_gpu_blocks(cfg) <= p.num_blocks:
        return None
    told = num_gpu_blocks(cfg)
    size = format_bytes(told * p.block_size * p.kv_bytes_per_token)
    return Check("capacity", "fail",
                 f"{e.kind} is told {told:,} KV blocks (max_num_seqs {e.max_num_seqs} × ceil(max_model_len "
                 f"{e.max_model_len} / block_size {e.block_size}), {size}) and allocates them all, but the plan's "
                 f"budget holds {p.num_blocks:,} ({p.budget_source})",
                 f"set engine.num_gpu_blocks_override: {p.num_blocks} (the plan's count: {p.max_concurrency:.1f} "
                 f"requests of max_model_len at once), or engine.max_num_seqs <= {p.max_feasible_num_seqs}")


def check_gpu_ids(cfg: DeployConfig, host: HostConfig) -> Check:
    """hosts[].gpus against the GPUs the engine uses: CUDA_VISIBLE_DEVICES is the whole list, and a
    tensor-parallel engine takes the first tensor_parallel_size of them (vLLM and SGLang start one rank per GPU
    from device 0 of the visible ones), so GPUs listed beyond that sit idle: a warning naming them."""
    ids, tp = host.gpu_ids, cfg.engine.tensor_parallel_size
    if host.idle_gpus:  # hosts[].replicas: the entry listed more GPUs than replicas × TP take
        base = host.name.rsplit("-r", 1)[0]
        idle = ",".join(map(str, host.idle_gpus))
        return Check("gpus", "warn",
                     f"hosts[{base}].gpus lists GPU(s) {idle} beyond its replicas × tensor_parallel_size {tp}: no "
                     f"replica gets them, they would sit idle",
                     f"add a replica per {tp} of them (hosts[{base}].replicas), or drop {idle} from hosts[{base}].gpus")
    if len(ids) <= tp:
        return Check("gpus", "pass", f"GPUs {','.join(map(str, ids))} on {host.name}: one per tensor-parallel rank")
    idle = ids[tp:]
    return Check("gpus", "warn",
                 f"hosts[{host.name}].gpus lists {len(ids)} GPUs ({','.join(map(str, ids))}, all in "
                 f"CUDA_VISIBLE_DEVICES) but tensor_parallel_size {tp} uses {tp}: GPU(s) "
                 f"{','.join(map(str, idle))} would sit idle",
                 f"list {tp} GPU ids in hosts[{host.name}].gpus, or set engine.tensor_parallel_size {len(ids)}")


def check_gpu_memory(cfg: DeployConfig, host: HostConfig, facts: dict, sized) -> Check:
    """Every GPU of the host (hosts[].gpus, one per tensor-parallel rank) has the free VRAM its share needs
    (weights/TP + KV pool + overhead: the plan is per GPU); memory held by other processes is named per GPU.
    Memory held by this service's running release counts as free (the rollout replaces it)."""
    if cfg.engine.device == "cpu":
        return Check("gpu_memory", "pass", "skipped: device is cpu")
    checks = [_check_one_gpu(cfg, host, facts, sized, index) for index in host.gpu_ids]
    if len(checks) == 1:
        return checks[0]
    worst = next((c for status in ("fail", "warn") for c in checks if c.status == status), checks[0])
    return Check("gpu_memory", worst.status, "; ".join(c.message for c in checks), worst.fix)


def _check_one_gpu(cfg: DeployConfig, host: HostConfig, facts: dict, sized, index: int) -> Check:
    gpu = _gpu(facts, host, index)
    if gpu is None:
        n = len((facts.get("nvidia") or {}).get("gpus") or [])
        return Check("gpu_memory", "fail", f"GPU {index} not found on {host.name} ({n} GPU(s) visible to NVML)",
                     "set the host's gpu index (hosts[].gpu / gpus) to existing GPUs, or fix the driver")
    if sized is None:
        return Check("gpu_memory", "warn", "skipped: no capacity plan for this host", "fix the capacity check first")
    p = sized.plan
    # the reserve inside the engine's share, plus the CUDA context and NCCL outside it (deployctl.engines.reserve)
    overhead = sized.inputs.runtime_overhead_bytes + (sized.reserve.outside if sized.reserve else 0)
    need = p.weights_bytes + overhead + p.kv_pool_bytes
    ours = _service_pids(facts)
    others = [proc for proc in gpu.get("processes") or [] if proc["pid"] not in ours]
    ours_bytes = sum(proc.get("used_memory") or 0 for proc in gpu.get("processes") or [] if proc["pid"] in ours)
    available = int(gpu["memory_free"]) + ours_bytes
    named = ", ".join(f"pid {o['pid']} ({o.get('name') or '?'}) {_mib(o['used_memory']) if o.get('used_memory') else '? MiB'}"
                      for o in others)
    head = f"GPU {index} ({gpu.get('name')}, {_mib(gpu['memory_total'])})"
    parts = f"weights {_mib(p.weights_bytes)} + KV pool {_mib(p.kv_pool_bytes)} + overhead {_mib(overhead)}"
    if available < need:
        total = int(gpu["memory_total"])
        util = int(available / total * 100) / 100
        fix = f"stop {'those processes' if others else 'what holds the memory'}"
        if cfg.engine.num_gpu_blocks_override is None and util * total > p.weights_bytes + overhead:
            fix += f", or set engine.gpu_memory_utilization <= {util:.2f} (a smaller KV cache; re-run `deployctl plan`)"
        elif cfg.engine.num_gpu_blocks_override is None:
            fix += f" (weights + overhead alone need {_mib(p.weights_bytes + overhead)}), or use a larger GPU"
        return Check("gpu_memory", "fail",
                     f"{head} has {_mib(available)} free; the plan needs {_mib(need)} ({parts})"
                     + (f"; held by other processes: {named}" if others else ""), fix)
    if others:
        return Check("gpu_memory", "warn", f"{head}: {_mib(available)} free covers {_mib(need)} ({parts}), "
                     f"but other processes share the GPU: {named}", "make sure they will not grow, or move them")
    return Check("gpu_memory", "pass", f"{head}: {_mib(available)} free covers {_mib(need)} ({parts})")
