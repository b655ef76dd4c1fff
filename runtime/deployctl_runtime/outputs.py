"""The seams between the engine's parts: what the scheduler hands the model runner each step (SchedulerOutput) and
what the runner hands back (ModelRunnerOutput). Plain data, no torch, no logic beyond derived properties."""
from __future__ import annotations

from dataclasses import dataclass, field

from deployctl_runtime.request import Request, SampledToken


@dataclass
class ScheduledRequest:
    request: Request
    num_scheduled_tokens: int  # tokens whose KV this step computes, starting at request.num_computed_tokens
    block_ids: list[int]  # the whole block table after this step's allocation

    @property
    def samples(self) -> bool:
        """True when this step reaches the request's last token, so a new token is sampled."""
        r = self.request
        return r.num_computed_tokens + self.num_scheduled_tokens == r.num_tokens


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    num_batched_tokens: int = 0
    preempted_ids: list[str] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


@dataclass
class ModelRunnerOutput:
    """One SampledToken per scheduled request whose step samples, by request id."""
    sampled: dict[str, SampledToken] = field(default_factory=dict)
