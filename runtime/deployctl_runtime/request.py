"""A request as the scheduler sees it: token ids and how many of them have KV in the cache. No torch."""
from __future__ import annotations

import enum

from deployctl_runtime.sampling_params import SamplingParams


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
        self.num_prompt_tokens = len(prompt_token_ids)
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0  # prompt tokens served from the prefix cache at first admission
        self.num_preemptions = 0
        self.status = RequestStatus.WAITING
        self.finish_reason: str | None = None
        self.arrival_seq = arrival_seq
        self.stop_ids = frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else eos_token_ids)
        self.block_hashes: list[bytes] = []  # SHA-256 chain keys of its full blocks, filled by the KV manager
        self.generator = None  # torch.Generator for seeded sampling, owned by the sampler

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status == RequestStatus.FINISHED

    def append_output(self, token_id: int, logprob: float | None) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)
        if logprob is not None:
            self.output_logprobs.append(logprob)

    def check_stop(self, max_model_len: int) -> str | None:
        """Finish reason after the last appended token, or None to continue."""
        n = self.num_output_tokens
        if n >= self.params.min_tokens and self.output_token_ids[-1] in self.stop_ids:
            return "stop"
        if n >= self.params.max_tokens or self.num_tokens >= max_model_len:
            return "length"
        return None
