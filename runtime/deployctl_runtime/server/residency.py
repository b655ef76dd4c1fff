"""What this process still holds on its GPU, per GPU: POST /sleep's and GET /is_sleeping's ``resident_bytes``.

``{"<gpu index>": bytes}``; the index is NVML's (as nvidia-smi and the ``gpu`` label of gpu_metrics.py), mapped from
the CUDA device through CUDA_VISIBLE_DEVICES, or CUDA's own index where that cannot be mapped. What is counted:

- CUDA: ``torch.cuda.memory_reserved`` (what torch's caching allocator holds, measured after the sleep's
  ``empty_cache()``) and, where NVML reports this process's used memory on that GPU
  (``nvmlDeviceGetComputeRunningProcesses``; not in every container), the larger of the two: NVML's figure also
  holds the CUDA context, cuBLAS workspaces and any other non-torch allocation. ``measured_by`` says which it was.
- The stand-in GPU (DEPLOYCTL_FAKE_GPU_MEMORY): the bytes the ledger holds for this pid, under index "0".
- CPU: ``{}`` (no device memory).
"""
from __future__ import annotations

import os
from typing import Any

from .gpu_metrics import visible_gpu_entries


def resident_bytes(ctx: Any) -> tuple[dict[str, int], str]:
    """(``{"<gpu index>": bytes}``, measured_by: "ledger" | "torch" | "torch+nvml" | "cpu"). Never raises for a
    missing NVML (the torch figure alone then)."""
    if ctx.ledger is not None:
        return {"0": ctx.ledger.held()}, "ledger"
    if ctx.cfg.device != "cuda" or ctx.engine is None:
        return {}, "cpu"
    import torch

    device = ctx.engine.engine.runner.device
    cuda_index = device.index if device.index is not None else torch.cuda.current_device()
    reserved = int(torch.cuda.memory_reserved(cuda_index))
    index, nvml_used = _nvml_used(cuda_index)
    if nvml_used is None:
        return {str(index): reserved}, "torch"
    return {str(index): max(reserved, nvml_used)}, "torch+nvml"


def _nvml_used(cuda_index: int) -> tuple[int, int | None]:
    """(the GPU's NVML index, this process's used bytes on it per NVML or None). CUDA_DEVICE_ORDER=PCI_BUS_ID (as
    deployctl sets) makes CUDA's order NVML's; without it the mapping holds only for an index listed in
    CUDA_VISIBLE_DEVICES."""
    entries = visible_gpu_entries(os.environ.get("CUDA_VISIBLE_DEVICES"))
    entry = entries[cuda_index] if entries and cuda_index < len(entries) else str(cuda_index)
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = (pynvml.nvmlDeviceGetHandleByIndex(int(entry)) if entry.isdigit()
                  else pynvml.nvmlDeviceGetHandleByUUID(entry))
        index = int(pynvml.nvmlDeviceGetIndex(handle))
        pid = os.getpid()
        for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if proc.pid == pid and proc.usedGpuMemory is not None:
                return index, int(proc.usedGpuMemory)
        return index, None
    except Exception:  # noqa: BLE001 - no nvidia-ml-py, no driver, NotSupported, a PID namespace: torch's figure
        return int(entry) if entry.isdigit() else cuda_index, None
