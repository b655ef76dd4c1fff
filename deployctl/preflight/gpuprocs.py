"""Preflight's ``gpu_processes`` check (issue 39): the processes on the host's GPUs that are no known engine of this
service, named.

Known: the serving runtime's process group (the probe's ``service.pids``: the pidfile's supervisor and its
descendants, or the systemd unit's cgroup) and the sleeping standby's (``service.standby_pids``). Every other
process NVML lists on one of the host's GPUs (``hosts[].gpus``) is named with its pid, process name and GPU bytes,
and where it can tell, the release it came from: ``<deploy_root>/releases/<id>`` in its command line or working
directory. A process carrying launch.sh's engine marker for this deploy root (``DEPLOYCTL_INSTANCE``, probe
``instance``), or run from one of its releases, is this service's own engine left without its supervisor (a
``kill -9``, a crash of the supervisor): the fix says how launch.sh ends those. Warn, never fail: gpu_memory
decides whether what is left is enough; this one says whose the rest is.
"""
from __future__ import annotations

import posixpath
import re
from typing import Optional

from deployctl.config import DeployConfig, HostConfig, layout
from deployctl.config.units import format_bytes
from deployctl.preflight.base import Check, gpu_of, service_pids, standby_pids


def release_of(proc: dict, deploy_root: str) -> Optional[str]:
    """The release id in ``<deploy_root>/releases/<id>`` of ``proc``'s command line or working directory (probe
    facts: ``cmdline``, ``cwd``), or None."""
    root = re.escape(posixpath.normpath(deploy_root))
    for text in (proc.get("cwd") or "", proc.get("cmdline") or ""):
        m = re.search(root + r"/releases/([A-Za-z0-9][A-Za-z0-9._-]*)", text)
        if m:
            return m.group(1)
    return None


def _ours(proc: dict, deploy_root: str) -> bool:
    """An engine process of this deploy root by launch.sh's marker (probe ``instance``)."""
    inst = proc.get("instance") or {}
    return bool(inst.get("root")) and posixpath.normpath(inst["root"]) == posixpath.normpath(deploy_root)


def describe(proc: dict, index: int, deploy_root: str) -> str:
    """"pid 4242 (python3) 70.4 GiB on GPU 1, from release R (...)"."""
    used = proc.get("used_memory")
    size = format_bytes(int(used)) if isinstance(used, int) else "? bytes"
    text = f"pid {proc['pid']} ({proc.get('name') or '?'}) {size} on GPU {index}"
    rel = release_of(proc, deploy_root)
    port = (proc.get("instance") or {}).get("port") if _ours(proc, deploy_root) else None
    if rel or _ours(proc, deploy_root):
        text += f", from release {rel}" if rel else ", an engine of this deploy root"
        text += f" (port {port}, no supervisor)" if port else " (no supervisor)"
    return text


def check_gpu_processes(cfg: DeployConfig, host: HostConfig, facts: dict) -> Check:
    """Warn naming every process on the host's GPUs that is neither the serving runtime's nor the standby's."""
    if cfg.engine.device == "cpu":
        return Check("gpu_processes", "pass", "skipped: device is cpu")
    known = service_pids(facts) | standby_pids(facts)
    foreign: list[tuple[int, dict]] = []
    seen = 0
    for index in host.gpu_ids:
        gpu = gpu_of(facts, host, index)
        for proc in (gpu or {}).get("processes") or []:
            seen += 1
            if proc.get("pid") not in known:
                foreign.append((index, proc))
    gpus = ", ".join(str(i) for i in host.gpu_ids)
    if not foreign:
        return Check("gpu_processes", "pass", f"GPU {gpus} on {host.name}: no process but this service's engines "
                                              f"({seen} of theirs)")
    root = host.deploy_root
    leftovers = [p for _, p in foreign if _ours(p, root) or release_of(p, root)]
    others = [p for _, p in foreign if p not in leftovers]
    named = "; ".join(describe(p, i, root) for i, p in foreign)
    fixes = []
    if leftovers:
        fixes.append(f"this service's engine processes left without a supervisor hold GPU memory: "
                     f"`bash {layout.current_link(host)}/launch.sh stop` ends every one of this deploy root "
                     f"(or kill {' '.join(str(p['pid']) for p in leftovers)})")
    if others:
        fixes.append(f"stop the other processes (kill {' '.join(str(p['pid']) for p in others)}) or move them off "
                     f"GPU {gpus}: the memory they hold is not the service's")
    return Check("gpu_processes", "warn",
                 f"{len(foreign)} process(es) on GPU {gpus} of {host.name} belong to no engine of this service: {named}",
                 "; ".join(fixes))
