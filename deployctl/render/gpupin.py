"""Which physical GPUs a release is given: hosts[].gpus' NVML indices mapped to the GPUs' UUIDs (pure).

An NVML index names a position in an enumeration, not a GPU: after a reboot, a GPU replaced or fallen off the bus,
or under a CUDA_VISIBLE_DEVICES mask the service inherits, index 1 can be another card than the one preflight saw.
So where the host's GPU facts are known when a release is rendered (the deploy's preflight: the probe's
``nvidia.gpus``, hostscripts/probe.py ``_identity``), the release pins its GPUs by UUID (engines.command.gpu_env:
CUDA_VISIBLE_DEVICES=GPU-...,GPU-...) and records the mapping in release.json ``gpu_pinning``; without facts
(offline ``render``, DEPLOYCTL_SKIP_PREFLIGHT) it pins by index and says why. Preflight's ``gpu_pinning`` check
(deployctl.preflight.gpupin) compares a running release's record with the facts of the day.

The record (release.json ``gpu_pinning``): ``{"by": "uuid"|"index", "why": str|None, "devices": [{"index",
"uuid", "pci_bus_id"}]}`` in hosts[].gpus' order (uuid and pci_bus_id None where unknown); None on engine.device
cpu (no GPU is pinned).
"""
from __future__ import annotations

from typing import Optional

NO_FACTS = "no GPU facts when the release was rendered (preflight did not run)"


def pinning(cfg, host, nvidia: Optional[dict], *, why: str = NO_FACTS) -> Optional[dict]:
    """The release's GPU record for ``host`` (module doc) from the probe's ``nvidia`` section (None: unknown, then
    by index with ``why``). By index too, naming the GPU, when a GPU of hosts[].gpus is missing from the facts or
    has no UUID there (the driver did not answer, or the stand-in GPU of tests). None on cpu."""
    if cfg.engine.device != "cuda":
        return None
    by_index = {g.get("index"): g for g in ((nvidia or {}).get("gpus") or [])}
    devices = [{"index": i, "uuid": (by_index.get(i) or {}).get("uuid"),
                "pci_bus_id": (by_index.get(i) or {}).get("pci_bus_id")} for i in host.gpu_ids]
    if nvidia is None or not nvidia.get("available"):
        reason = why if nvidia is None else f"NVML did not answer on {host.name}: {nvidia.get('error')}"
        return {"by": "index", "why": reason, "devices": devices}
    missing = [d["index"] for d in devices if not d["uuid"]]
    if missing:
        gone = [i for i in missing if i not in by_index]
        reason = (f"GPU {gone[0]} of hosts[{host.name}].gpus is not among the GPUs NVML lists on {host.name}" if gone
                  else f"NVML gave no UUID for GPU {missing[0]} on {host.name}")
        return {"by": "index", "why": reason, "devices": devices}
    return {"by": "uuid", "why": None, "devices": devices}


def describe(devices: list) -> str:
    """``GPU 0 = GPU-5c1e7d52-... (00000000:18:00.0), GPU 1 = ...`` for messages."""
    return ", ".join(f"GPU {d['index']} = {d.get('uuid') or 'no UUID'}"
                     + (f" ({d['pci_bus_id']})" if d.get("pci_bus_id") else "") for d in devices)
