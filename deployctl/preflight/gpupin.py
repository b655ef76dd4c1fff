"""The ``gpu_pinning`` check: which physical GPUs hosts[].gpus names today, and whether they are still the ones the
running release was pinned to (deployctl.render.gpupin: release.json ``gpu_pinning``, read by the probe's
``current_release``).

A release pinned by UUID keeps its GPUs whatever the indices say now (CUDA_VISIBLE_DEVICES holds UUIDs), so a
different UUID at a recorded index is a warning, never a failure: the operator learns that hosts[].gpus now names
other cards (a reboot enumerated them otherwise, a GPU was replaced or fell off the bus) before the next deploy pins
the UUIDs found there.
"""
from __future__ import annotations

from deployctl.config import DeployConfig, HostConfig
from deployctl.preflight.base import Check
from deployctl.render.gpupin import describe, pinning


def _gpu(gpus: list, index):
    return next((g for g in gpus if g.get("index") == index), None)


def check_gpu_pinning(cfg: DeployConfig, host: HostConfig, facts: dict) -> Check:
    """pass: the GPUs of hosts[].gpus with their UUIDs and PCI bus ids (what a deploy now pins), and the running
    release's pinning where it agrees; warn: a UUID recorded in the running release's release.json at an index
    that now holds another GPU (naming both UUIDs and bus ids), or a recorded GPU no longer listed. Facts without
    UUIDs pass, saying that a deploy pins by index and why (nvidia_driver and gpu_health judge the driver)."""
    if cfg.engine.device != "cuda":
        return Check("gpu_pinning", "pass", "skipped: device is cpu")
    nvidia = facts.get("nvidia")
    now = pinning(cfg, host, nvidia, why="no GPU facts")
    gpus = (nvidia or {}).get("gpus") or []
    current = facts.get("current_release") or {}
    recorded = current.get("gpu_pinning") or {}
    release = current.get("release_id") or "the current release"
    moved = []
    if recorded.get("by") == "uuid":
        for d in recorded.get("devices") or []:
            there = _gpu(gpus, d.get("index"))
            if there is not None and there.get("uuid") == d.get("uuid"):
                continue
            was = f"{d.get('uuid')}" + (f" ({d['pci_bus_id']})" if d.get("pci_bus_id") else "")
            held = next((g for g in gpus if g.get("uuid") == d.get("uuid")), None)
            if there is None:
                is_now = "no GPU"
            else:
                is_now = f"{there.get('uuid') or 'a GPU without a UUID'}" + (
                    f" ({there['pci_bus_id']})" if there.get("pci_bus_id") else "")
            where = (f"; {d.get('uuid')} is now GPU {held.get('index')}" if held is not None
                     else f"; {d.get('uuid')} is not on {host.name} any more")
            moved.append(f"GPU {d.get('index')} on {host.name} is now {is_now}, but release {release} was pinned to "
                         f"{was} at index {d.get('index')}{where}")
    if moved:
        return Check("gpu_pinning", "warn",
                     "; ".join(moved) + f". The running release keeps the GPUs it was given (CUDA_VISIBLE_DEVICES by "
                     f"UUID); the next deploy pins what hosts[{host.name}].gpus names now: {describe(now['devices'])}",
                     f"check that hosts[{host.name}].gpus {host.gpu_ids} names the GPUs you mean (`nvidia-smi -L` on "
                     f"{host.name} lists index, name and UUID), then deploy")
    if now["by"] != "uuid":  # nvidia_driver / gpu_health say what is wrong with the driver or the GPU
        return Check("gpu_pinning", "pass", f"a deploy pins hosts[{host.name}].gpus {host.gpu_ids} by index: "
                                            f"{now['why']}")
    kept = (f"; release {release} runs on the same GPUs" if recorded.get("by") == "uuid"
            else f"; release {release} is pinned by index ({recorded.get('why')})" if recorded.get("by") == "index"
            else "")
    return Check("gpu_pinning", "pass", f"{describe(now['devices'])}{kept}")
