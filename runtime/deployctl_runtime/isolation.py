"""Fault isolation for one engine step: which exceptions poison the device, and which request a failed batch owes
its exception to. No torch.

A step's exception is either
- fatal: the device is poisoned. CUDA errors are sticky (an illegal address or a device-side assert leaves the
  CUDA context unusable: every later call on it fails, CUDA C++ Programming Guide, "Error Checking"), so the
  engine must not step again; the process exits to be restarted (vLLM does the same: its engine core dies and the
  API server exits). Recognised by type (torch.AcceleratorError, torch.cuda.CudaError) or by a marker in the
  message (DEFAULT_FATAL_MARKERS, plus the server's --fatal-error-marker);
- or attributable: a request of the batch raises it. The culprit is searched by halving, keeping the rest: run the
  first half of the suspects; if it raises the culprit is in it, else in the second half (the first half's tokens are
  kept). ceil(log2 n) re-runs leave one suspect, the culprit (found alone or by elimination: a forward is per-row, so
  the step's error is its own); then every request not yet run cleanly runs once more (+1). So a step with one bad
  request costs at most ceil(log2 n) + 1 extra forwards (`max_step_retries`), where a plain bisect that also runs
  each good half costs up to 2 log2(n). Should that last run raise again (a second culprit) the search goes on
  within the same bound; what is still unresolved when it is spent is `deferred`: the engine sends those requests
  back to recompute in a later step (which isolates the next culprit within its own bound), nothing fails that did
  not raise. A `budget` (the engine's re-runs left this minute) lowers the bound; what it leaves unresolved is
  `unresolved_by_budget`: the engine fails those requests, so a stream of poisoned requests cannot make every step
  cost many forwards.

KV state of the retries: a forward writes each request's KV only into the slots of its own new tokens, so a re-run
writes the same values again. Halves run in scheduling order, so a request that hit prefix-cache blocks another
request of the same step is filling is run after that request (blocks are cached at allocation, scheduling order).
The engine uncaches the blocks a failed request was filling and recomputes the requests that shared them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from deployctl_runtime.outputs import ModelRunnerOutput, ScheduledRequest, SchedulerOutput

DEFAULT_FATAL_MARKERS = ("CUDA error", "CUDA driver error", "CUBLAS_STATUS_", "CUDNN_STATUS_",
                         "device-side assert triggered", "NCCL error")
STEP_RETRY_WINDOW_S = 60.0  # the window of the engine's step-retry budget
DEFAULT_STEP_RETRIES_PER_MIN = 64  # extra forwards per window, all failed steps together (serve's default)
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


def max_step_retries(num_requests: int) -> int:
    """The most extra forwards one failed step of `num_requests` requests may run: ceil(log2 n) + 1 (n >= 1)."""
    return max(num_requests - 1, 0).bit_length() + 1


@dataclass
class Isolation:
    """What a step's isolation found. `output`: the merged tokens of every (sub-)batch that ran cleanly; `failed`:
    (item, exception) per culprit; `deferred`: items not run cleanly when the step's bound was spent (recompute
    them); `unresolved_by_budget`: likewise, but left by the caller's budget (fail them); `num_retries`: the extra
    forwards run (0 when the batch ran at once); `error`: the exception of the last run that raised."""

    output: ModelRunnerOutput
    failed: list[tuple[ScheduledRequest, BaseException]] = field(default_factory=list)
    deferred: list[ScheduledRequest] = field(default_factory=list)
    unresolved_by_budget: list[ScheduledRequest] = field(default_factory=list)
    num_retries: int = 0
    error: BaseException | None = None


def execute_isolating(execute: Callable[[SchedulerOutput], ModelRunnerOutput], items: Sequence[ScheduledRequest],
                      markers: Sequence[str] = DEFAULT_FATAL_MARKERS, budget: int | None = None) -> Isolation:
    """Run `items` as one batch; when that raises, find the culprit by halving (module doc) with at most
    min(max_step_retries(len(items)), budget) extra forwards. Sub-batches keep scheduling order. Raises
    EngineFatalError (from the original) at the first fatal exception: nothing more runs on a poisoned device."""
    def run(idx: list[int]) -> ModelRunnerOutput:
        batch = [items[i] for i in idx]
        return execute(SchedulerOutput(batch, sum(i.num_scheduled_tokens for i in batch)))

    try:
        return Isolation(run(list(range(len(items)))))
    except Exception as exc:  # noqa: BLE001 - classified below
        _raise_if_fatal(exc, markers)
        first = exc
    bound = max_step_retries(len(items))
    cap = bound if budget is None else max(0, min(bound, budget))
    result = Isolation(ModelRunnerOutput())
    suspects, error, rest = list(range(len(items))), first, []  # suspects hold a culprit; rest: not run cleanly
    while True:
        while len(suspects) > 1 and result.num_retries < cap:
            half, other = suspects[: len(suspects) // 2], suspects[len(suspects) // 2:]
            result.num_retries += 1
            try:
                result.output.sampled.update(run(half).sampled)
                suspects = other  # the culprit is in the other half
            except Exception as exc:  # noqa: BLE001
                _raise_if_fatal(exc, markers)
                suspects, error, rest = half, exc, other + rest
        if len(suspects) > 1:
            break  # the bound is spent with several suspects left
        result.failed.append((items[suspects[0]], error))
        suspects = []
        if not rest or result.num_retries >= cap:
            break
        result.num_retries += 1
        try:
            result.output.sampled.update(run(sorted(rest)).sampled)
            rest = []
            break
        except Exception as exc:  # noqa: BLE001 - a second culprit: go on searching within the bound
            _raise_if_fatal(exc, markers)
            suspects, error, rest = sorted(rest), exc, []
    left = [items[i] for i in sorted(suspects + rest)]
    result.error = error
    if cap < bound:
        result.unresolved_by_budget = left
    else:
        result.deferred = left
    return result


def _raise_if_fatal(exc: BaseException, markers: Sequence[str]) -> None:
    if is_fatal(exc, markers):
        raise EngineFatalError(describe(exc)) from exc
