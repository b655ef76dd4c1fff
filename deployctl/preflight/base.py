"""What every preflight check shares: the outcome type and the lookups over one host's facts."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional


@dataclass(frozen=True)
class Check:
    """One rule's outcome. status: "pass" | "warn" | "fail"; fix is None when nothing is to be done."""

    name: str
    status: str
    message: str
    fix: Optional[str] = None

    def to_json(self) -> dict:
        return asdict(self)


def gpu_of(facts: dict, host, index: Optional[int] = None) -> Optional[dict]:
    """The probe's entry for GPU ``index`` (default: the host's first, ``HostConfig.gpu_ids``), or None."""
    index = host.gpu_ids[0] if index is None else index
    for gpu in (facts.get("nvidia") or {}).get("gpus") or []:
        if gpu.get("index") == index:
            return gpu
    return None


def service_pids(facts: dict) -> set:
    """Pids of this service's running release (the probe's ``service`` section)."""
    return set((facts.get("service") or {}).get("pids") or [])


def standby_pids(facts: dict) -> set:
    """Pids of this service's sleeping standby (the probe's ``service.standby_pids``; empty in older facts)."""
    return set((facts.get("service") or {}).get("standby_pids") or [])
