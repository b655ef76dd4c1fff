"""Fault isolation for one engine step: which exceptions poison the device, and which request a failed batch owes
its exception to. No torch.

A step's exception is either
- fatal: the device is poisoned. CUDA errors are sticky (an illegal address or a device-side assert leaves the
  CUDA context unusable: every later call on it fails, CUDA C++ Programming Guide, "Error Checking"), so the
  engine must not step again; the process exits to be restarted (vLLM does the same: its engine core dies and the
  API server exits). Recognised by type (torch.AcceleratorError, torch.cuda.CudaError) or by a marker in the
  message (DEFAULT_FATAL_MARKERS, plus the server's --fatal-error-marker);
- or attributable: the batch is split in halves and each half re-run, first half first, until the single requests
  that still raise are found (bisect: about 2 log2(N) extra forwards per bad request). Only those fail; the others
  get the tokens their successful sub-batch produced (a forward is per-row, so the same as in the whole batch).

KV state of the retries: a forward writes each request's KV only into the slots of its own new tokens, so a re-run
writes the same values again. Halves run in scheduling order, so a request that hit prefix-cache blocks another
request of the same step is filling is run after that request (blocks are cached at allocation, scheduling order).
The engine uncaches the blocks a failed request was filling and recomputes the requests that shared them.
"""
from __future__ import annotations

from typing import Callable, Sequence

from deployctl_runtime.outputs import ModelRunnerOutput, ScheduledRequest, SchedulerOutput

DEFAULT_FATAL_MARKERS = ("CUDA error", "CUDA driver error", "CUBLAS_STATUS_", "CUDNN_STATUS_",
                         "device-side assert triggered", "NCCL error")
FATAL_TYPE_NAMES = ("AcceleratorError", "CudaError")  # torch.AcceleratorError (torch >= 2.8), torch.cuda.CudaError


class EngineFatalError(RuntimeError):
    """A step raised an error that poisons the device (or the engine's state): the engine must not step again."""


def describe(exc: BaseException) -> str:
    """'TypeName: message', as logs and error responses show it."""
    return f"{type(exc).__name__}: {exc}"


def is_fatal(exc: BaseException, markers: Sequence[str] = DEFAULT_FATAL_MARKERS) -> bool:
    """True when `exc` poisons the device: a torch CUDA error type anywhere in its class hierarchy, or one of
    `markers` (substrings, case-sensitive) in its message."""
    if any(c.__name__ in FATAL_TYPE_NAMES for c in type(exc).__mro__):
        return True
    text = str(exc)
    return any(m and m in text for m in markers)


def execute_isolating(execute: Callable[[SchedulerOutput], ModelRunnerOutput], items: Sequence[ScheduledRequest],
                      markers: Sequence[str] = DEFAULT_FATAL_MARKERS
                      ) -> tuple[ModelRunnerOutput, list[tuple[ScheduledRequest, BaseException]]]:
    """Run `items` as one batch; when that raises, bisect. Returns the merged output of every sub-batch that ran
    and the (item, exception) of each single request that raised alone. Raises EngineFatalError (from the
    original) at the first fatal exception: nothing more runs on a poisoned device."""
    try:
        return execute(SchedulerOutput(list(items), sum(i.num_scheduled_tokens for i in items))), []
    except Exception as exc:  # noqa: BLE001 - classified below
        if is_fatal(exc, markers):
            raise EngineFatalError(describe(exc)) from exc
        if len(items) == 1:
            return ModelRunnerOutput(), [(items[0], exc)]
    mid = len(items) // 2
    out, failed = execute_isolating(execute, items[:mid], markers)
    right, right_failed = execute_isolating(execute, items[mid:], markers)
    out.sampled.update(right.sampled)
    return out, failed + right_failed
