"""GPU health from the probe's NVML facts (hostscripts/probe.py ``probe_nvidia``): a GPU fallen off the bus, a
memory repair waiting for a reset, a GPU out of spare rows. Each would crash or corrupt the engine soon after start.

Sources: NVIDIA's "GPU Memory Error Management" (r570, "Row Remapping" and "Dynamic Page Retirement"): a pending
remap or retirement takes effect at the next GPU reset or reboot, and until then the bad memory stays in use; a
row-remap failure means the bank has no spare rows and the GPU should be replaced (RMA). NVML_ERROR_GPU_IS_LOST
("the GPU has fallen off the bus or has otherwise become inaccessible", nvml.h) is what the driver answers after
Xid 79; only a reboot (or a node power cycle) brings it back.
"""
from __future__ import annotations

from deployctl.config import DeployConfig, HostConfig
from deployctl.preflight.base import Check

RESET_FIX = ("stop what uses the GPU and reset it (`nvidia-smi -r -i {index}` as root) or reboot {host}, so the "
             "driver applies the repair; then re-run preflight")
LOST_FIX = ("reboot {host} (a lost GPU does not come back without one); if it falls off again, check `dmesg` for "
            "Xid 79, the GPU's power and PCIe seating, and have it replaced; or take GPU {index} out of "
            "hosts[{host}].gpu/gpus")
FAILURE_FIX = ("the GPU has no spare memory rows left: have it replaced (RMA); until then take GPU {index} out "
               "of hosts[{host}].gpu/gpus")


def _problems(gpu: dict) -> list[tuple[str, str]]:
    """(what, fix template) for each pending repair of one GPU's facts."""
    out = []
    rows = gpu.get("remapped_rows") or {}
    if rows.get("failure"):
        out.append(("a row remap failed (no spare rows)", FAILURE_FIX))
    if rows.get("pending"):
        out.append((f"a row remap is pending ({rows.get('uncorrectable', 0)} row(s) remapped for uncorrectable "
                    "ECC errors)", RESET_FIX))
    if gpu.get("retired_pages_pending"):
        out.append(("an ECC page retirement is pending", RESET_FIX))
    return out


def check_gpu_health(cfg: DeployConfig, host: HostConfig, facts: dict) -> Check:
    """Fail when one of the host's service GPUs (hosts[].gpu/gpus) is lost to NVML or has a pending ECC page
    retirement, a pending row remap or a failed one; warn when another GPU of the host is lost (the driver and
    nvidia-smi may hang on it). Pass on cpu and when NVML gave no facts (nvidia_driver reports that)."""
    if cfg.engine.device == "cpu":
        return Check("gpu_health", "pass", "skipped: device is cpu")
    nv = facts.get("nvidia") or {}
    if not nv.get("available"):
        return Check("gpu_health", "pass", "skipped: no NVML facts (see nvidia_driver)")
    ours = set(host.gpu_ids)
    fails, warns = [], []
    for err in nv.get("gpu_errors") or []:
        index = err["index"]
        what = (f"GPU {index} on {host.name} has fallen off the bus (NVML: {err['error']})" if err.get("lost")
                else f"GPU {index} on {host.name} cannot be read (NVML: {err['error']})")
        (fails if index in ours else warns).append((what, LOST_FIX.format(index=index, host=host.name)))
    for gpu in nv.get("gpus") or []:
        if gpu.get("index") not in ours:
            continue
        for what, fix in _problems(gpu):
            index = gpu["index"]
            fails.append((f"GPU {index} ({gpu.get('name')}) on {host.name}: {what}",
                          fix.format(index=index, host=host.name)))
    if fails:
        return Check("gpu_health", "fail", "; ".join(w for w, _ in fails),
                     "; ".join(dict.fromkeys(f for _, f in fails)))
    if warns:
        return Check("gpu_health", "warn", "; ".join(w for w, _ in warns) + " (not a GPU of this service)",
                     "; ".join(dict.fromkeys(f for _, f in warns)))
    gpus = ",".join(map(str, host.gpu_ids))
    return Check("gpu_health", "pass", f"GPU(s) {gpus} on {host.name}: no pending ECC repair, none lost")


__all__ = ["check_gpu_health"]
