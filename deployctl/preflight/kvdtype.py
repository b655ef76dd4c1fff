"""Preflight's ``kv_cache_dtype`` check (issue 44): an fp8 KV cache needs a GPU with FP8 support.

The minimum compute capability per engine (``FP8_KV_MIN_CC``) is 8.9: FP8 (E4M3/E5M2) arithmetic arrived with
Ada Lovelace (8.9) and Hopper (9.0) (NVIDIA CUDA C Programming Guide, "Compute Capabilities", FP8 support); the
engines' fp8 KV paths target those. The check runs only where engine.kv_cache_dtype is an fp8 type on CUDA, and
reads the compute capability the probe recorded from NVML (``nvmlDeviceGetCudaComputeCapability``).
"""
from __future__ import annotations

from deployctl.config import DeployConfig, HostConfig
from deployctl.preflight.base import Check, gpu_of

FP8_KV_MIN_CC = {"vllm": (8, 9), "sglang": (8, 9), "openai": (8, 9)}


def _cc(text) -> tuple[int, int] | None:
    try:
        major, minor = str(text).split(".")
        return int(major), int(minor)
    except (ValueError, AttributeError):
        return None


def check_kv_cache_dtype(cfg: DeployConfig, host: HostConfig, facts: dict) -> Check:
    """Fail when a GPU of ``host`` is below the engine's minimum compute capability for an fp8 KV cache, naming
    both; warn when NVML gave no compute capability."""
    e = cfg.engine
    need = FP8_KV_MIN_CC.get(e.kind, (8, 9))
    want = f"{need[0]}.{need[1]}"
    low, unknown = [], []
    for index in host.gpu_ids:
        gpu = gpu_of(facts, host, index) or {}
        cc = _cc(gpu.get("compute_capability"))
        name = f"GPU {index} ({gpu.get('name') or 'unknown'})"
        if cc is None:
            unknown.append(name)
        elif cc < need:
            low.append(f"{name} compute capability {cc[0]}.{cc[1]}")
    if low:
        return Check("kv_cache_dtype", "fail",
                     f"engine.kv_cache_dtype {e.kv_cache_dtype} on {host.name}: {'; '.join(low)}, below the "
                     f"{want} that {e.kind}'s fp8 KV cache needs",
                     "set engine.kv_cache_dtype: auto on this GPU (the KV cache in the serving dtype, twice the "
                     f"bytes per token) or use a GPU of compute capability {want} or later (L4, L40S, H100, H200)")
    if unknown:
        return Check("kv_cache_dtype", "warn",
                     f"engine.kv_cache_dtype {e.kv_cache_dtype}: no compute capability recorded for "
                     f"{', '.join(unknown)} on {host.name}; {e.kind}'s fp8 KV cache needs {want} or later")
    return Check("kv_cache_dtype", "pass", f"engine.kv_cache_dtype {e.kind} {e.kv_cache_dtype}: every GPU of "
                                           f"{host.name} is at compute capability {want} or later")
