"""The start-up deadline of a multi-GPU start (tensor_parallel_size > 1): pure arithmetic, seconds.

A tensor-parallel engine starts one worker per GPU and joins them with NCCL before it loads weights; a rank that
never joins (a hung NCCL init: a GPU pair that cannot peer, a firewalled socket interface, a stale rank of an
earlier start holding a GPU) blocks every rank without printing anything and without exiting. Verification
therefore waits at most a deadline derived from the plan's load time, then fails with the engine's log tail
(deployctl.rollout.hostops.verify_timeout, deployctl.service.verify).

Formula (``start_deadline_s``)::

    load_time_s = BOOT_S + checkpoint_bytes / READ_BYTES_PER_S
    deadline_s  = SAFETY × load_time_s, capped by server.startup_timeout_s

- ``checkpoint_bytes``: the whole model directory on the host (every rank reads its shard of every file from the
  same disk, so the bytes of the whole checkpoint pass through it once).
- ``READ_BYTES_PER_S`` = 125 MiB/s: the baseline throughput of an AWS EBS gp3 volume (docs.aws.amazon.com/ebs/
  latest/userguide/general-purpose.html, "gp3 volumes ... baseline throughput performance of 125 MiB/s"), a slow
  disk GPU hosts commonly boot from; local NVMe reads 10-50× faster, so the deadline errs long.
- ``BOOT_S`` = 120 s: deployctl's allowance (not measured here: no GPU) for the interpreter and engine imports,
  one CUDA context per rank, the NCCL rendezvous when it works, the profile run and CUDA-graph capture.
- ``SAFETY`` = 2: a start that takes twice the estimate is treated as hung.
Example: Llama-3-8B in bf16 (16.1 GB) at TP 2 → load time 120 + 122 = 242 s, deadline 484 s.
"""
from __future__ import annotations

READ_BYTES_PER_S = 125 * 2**20
BOOT_S = 120.0
SAFETY = 2.0


def load_time_s(checkpoint_bytes: int) -> float:
    """The plan's load time in seconds for a checkpoint of ``checkpoint_bytes`` (module doc)."""
    return BOOT_S + max(0, int(checkpoint_bytes)) / READ_BYTES_PER_S


def start_deadline_s(checkpoint_bytes: int, cap_s: float) -> float:
    """Seconds a multi-GPU start may take before verification fails: SAFETY × load_time_s, at most ``cap_s``
    (server.startup_timeout_s)."""
    return min(float(cap_s), SAFETY * load_time_s(checkpoint_bytes))


def describe(checkpoint_bytes: int, cap_s: float) -> str:
    """One phrase for messages and the plan: the deadline and where it comes from."""
    load = load_time_s(checkpoint_bytes)
    deadline = start_deadline_s(checkpoint_bytes, cap_s)
    capped = " (server.startup_timeout_s)" if deadline < SAFETY * load else ""
    return (f"start-up deadline {deadline:.0f} s{capped}: {SAFETY:g} × the plan's load time {load:.0f} s "
            f"({BOOT_S:.0f} s boot + {checkpoint_bytes / 1e9:.1f} GB at {READ_BYTES_PER_S / 2**20:.0f} MiB/s)")
