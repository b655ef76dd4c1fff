"""A request as the scheduler sees it: token ids and how many of them have KV in the cache. No torch."""
from __future__ import annotations

import enum
import time
from typing import NamedTuple

from deployctl_runtime.sampling_params import SamplingParams


class SampledToken(NamedTuple):
    """What the sampler gives one request for one step. `top_logprobs`: (token id, logprob) most likely first, or
    None when not asked. `error` set (and the token meaningless) when the request must end with finish_reason
    "error", e.g. non-finite logits."""

    token_id: int
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] | None = None
    error: str | None = None


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"


class Request:
    """One generation request.

    Invariant: 0 <= num_computed_tokens <= num_tokens. A step computes KV for tokens
    [num_computed_tokens, num_computed_tokens + n); when it reaches num_tokens the model samples one new token,
    which is appended (num_tokens grows by one). Chunked prefill, prefix-cache hits and recompute after preemption
    are all this one rule.
    """

    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                 eos_token_ids: frozenset[int] = frozenset(), arrival_seq: int = 0):
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.params = params
        self.all_token_ids: list[int] = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.output_logprobs: list[float] = []
        self.output_top_logprobs: list[list[tuple[int, float]]] = []
        self.num_prompt_tokens = len(prompt_token_ids)
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0  # prompt tokens served from the prefix cache at first admission
        self.num_preemptions = 0
        self.status = RequestStatus.WAITING
        self.finish_reason: str | None = None
        self.error: str | None = None  # why it finished with "error"
        self.arrival_seq = arrival_seq
        self.arrival_time = time.monotonic()
        self.first_scheduled_time: float | None = None  # set by the scheduler (request_queue_time_seconds)
        self.stop_ids = frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else eos_token_ids)
        self.block_hashes: list[bytes] = []  # SHA-256 chain keys of its full blocks, filled by the KV manager

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status == RequestStatus.FINISHED

    def append_output(self, token_id: int, logprob: float | None = None,
                      top_logprobs: list[tuple[int, float]] | None = None) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)
        if logprob is not None:
            self.output_logprobs.append(logprob)
        if top_logprobs is not None:
            self.output_top_logprobs.append(top_logprobs)

    def check_stop(self, max_model_len: int) -> str | None:
        """Finish reason after the last appended token, or None to continue."""
        n = self.num_output_tokens
        if n >= self.params.min_tokens and self.output_token_ids[-1] in self.stop_ids:
            return "stop"
        if n >= self.params.max_tokens or self.num_tokens >= max_model_len:
            return "length"
        return None
