"""What a sleeping runtime still holds on the GPU, measured by its host (issue 39): "asleep" is not taken on trust.

After a sleep the host's GPU memory is read (the probe's ``nvidia`` section: NVML, or the stand-in ledger of
runtime/deployctl_runtime/gpu_ledger.py in tests) until it is stable — two reads in a row whose per-GPU figures
differ by at most ``TOLERANCE_BYTES`` — or ``SETTLE_S`` has passed; the sleeper's residue is what its pids hold
on each GPU. The engine's own figure (the runtime's /sleep answer ``resident_bytes``: ``{"<gpu>": bytes}``) is
kept beside it but used only where the host cannot tell per-process memory (NVML in some containers).

``Residue.bytes``: ``{"<gpu index>": bytes}``; ``how``: ``"nvml"``, ``"stand-in GPU ledger"``, ``"the engine's
/sleep answer"`` or ``"unknown"``. ``misfit`` says whether a new release of ``need`` bytes per GPU fits beside it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional

from deployctl.config import layout
from deployctl.config.units import format_bytes

SETTLE_S = 10.0  # the longest a measurement waits for the GPU memory to stop moving after a sleep
INTERVAL_S = 0.5  # between two reads
TOLERANCE_BYTES = 16 * 2**20  # two reads this close are "stable" (allocator caches settle within MiBs)


@dataclass(frozen=True)
class Residue:
    """One measurement: ``bytes`` held by the sleeper per GPU (``{"0": n}``, {} when unknown), ``free`` bytes per
    GPU at the last read, ``how`` it was measured, ``reads`` taken over ``seconds``, ``stable`` (False: still
    moving at SETTLE_S, the last read taken), ``reported`` (the engine's ``resident_bytes``, or None)."""

    bytes: dict = field(default_factory=dict)
    free: dict = field(default_factory=dict)
    how: str = "unknown"
    reads: int = 0
    seconds: float = 0.0
    stable: bool = False
    reported: Optional[dict] = None

    @property
    def known(self) -> bool:
        return bool(self.bytes)

    def to_json(self) -> dict:
        return {"residue_bytes": self.bytes, "measured": {"how": self.how, "reads": self.reads,
                                                          "seconds": self.seconds, "stable": self.stable,
                                                          "free_bytes": self.free},
                **({"engine_resident_bytes": self.reported} if self.reported is not None else {})}

    def text(self) -> str:
        """``GPU 0: 1.0 GiB (stand-in GPU ledger)`` or ``unknown``."""
        if not self.bytes:
            return "unknown (the host's GPU memory per process could not be read: no GPU, or NVML without it)"
        return ", ".join(f"GPU {g}: {format_bytes(b)}" for g, b in sorted(self.bytes.items())) + f" ({self.how})"


def reported_bytes(body: Optional[dict]) -> Optional[dict]:
    """The engine's ``resident_bytes`` from its /sleep answer as ``{"<gpu>": int}``, None when absent or malformed."""
    rb = (body or {}).get("resident_bytes")
    if not isinstance(rb, dict):
        return None
    try:
        return {str(k): int(v) for k, v in rb.items() if not isinstance(v, bool)}
    except (TypeError, ValueError):
        return None


def _read(host, pid_file: str) -> tuple[dict, dict, str]:
    """(held per GPU — {} when per-process memory is unknown —, free per GPU, how) from one probe run."""
    from deployctl.rollout.gpufit import probe_gpu

    facts = probe_gpu(host, [pid_file])
    nv = facts.get("nvidia") or {}
    if not nv.get("available"):
        return {}, {}, "unknown"
    pids = set((facts.get("pids") or {}).get(pid_file) or [])
    held, free = {}, {}
    for g in nv.get("gpus") or []:
        idx = str(g.get("index"))
        free[idx] = int(g.get("memory_free") or 0)
        used = [p.get("used_memory") for p in g.get("processes") or [] if p.get("pid") in pids]
        if any(u is None for u in used):
            return {}, free, "unknown"
        if used:
            held[idx] = sum(used)
    how = "stand-in GPU ledger" if nv.get("fake") else "nvml"
    if pids and not held:
        held = {str(g.get("index")): 0 for g in nv.get("gpus") or []}  # its pids hold nothing on any GPU
    return held, free, how


def _close(a: dict, b: dict) -> bool:
    return set(a) == set(b) and all(abs(a[k] - b[k]) <= TOLERANCE_BYTES for k in a)


def measure(host, port: int, *, reported: Optional[dict] = None, settle_s: float = SETTLE_S) -> Residue:
    """Measure what the runtime sleeping on ``port`` (pidfile ``runtime.<port>.pid``) holds on each GPU: reads every
    INTERVAL_S until two in a row agree within TOLERANCE_BYTES, at most ``settle_s`` seconds. Where the host cannot
    tell per-process memory, the engine's ``reported`` figure (how: "the engine's /sleep answer"). Raises
    RemoteError."""
    pid_file = layout.spare_pid_file(host.config, port)
    t0 = time.monotonic()
    last, free, how = _read(host, pid_file)
    reads, stable = 1, False
    while how != "unknown" and time.monotonic() - t0 < settle_s:
        time.sleep(INTERVAL_S)
        now, free, how = _read(host, pid_file)
        reads += 1
        if _close(now, last):
            last, stable = now, True
            break
        last = now
    seconds = round(time.monotonic() - t0, 2)
    if how == "unknown" and reported:
        return Residue(dict(reported), free, "the engine's /sleep answer", reads, seconds, False, reported)
    return Residue(last if how != "unknown" else {}, free, how, reads, seconds, stable, reported)


def misfit(residue: Residue, need: Optional[int]) -> Optional[str]:
    """Why a new release needing ``need`` bytes per GPU (one awake copy) does not fit beside the measured sleeper,
    or None (it fits, or nothing is known: ``need`` None or no free figure)."""
    if need is None or not residue.free:
        return None
    for g, free in sorted(residue.free.items()):
        if free < need:
            held = residue.bytes.get(g)
            return (f"GPU {g}: {format_bytes(free)} free beside the sleeping standby's measured residue of "
                    f"{format_bytes(held) if held is not None else 'unknown size'} ({residue.how}), the new release "
                    f"needs {format_bytes(need)}")
    return None


def predicted_misfit(recorded: Optional[dict], free_now: Optional[int]) -> Optional[str]:
    """Before the old release sleeps: why the new release would not fit beside it, from the residue measured at
    the host's last sleep (``recorded``, ``{"<gpu>": bytes}``) and the free bytes of the tightest GPU now, with the
    old release awake (``free_now``: gpufit's ``free_bytes``). The sleep frees one copy, the new release takes one
    copy back: it fits when ``free_now`` >= the residue. None when it fits or nothing is recorded."""
    if not recorded or free_now is None:
        return None
    kept = max(int(v) for v in recorded.values())
    if free_now < kept:
        return (f"the residue measured at this host's last sleep, {format_bytes(kept)} per GPU, is more than the "
                f"{format_bytes(free_now)} free beside one awake copy: the new release would not fit beside the "
                "sleeping standby")
    return None
