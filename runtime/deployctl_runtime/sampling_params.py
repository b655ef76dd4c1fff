"""Per-request sampling settings (names and defaults follow vLLM's SamplingParams)."""
from __future__ import annotations

from dataclasses import dataclass, field


SAMPLING_EPS = 1e-5


@dataclass
class SamplingParams:
    """How to pick each next token and when to stop.

    temperature 0 means greedy. top_k -1 and top_p 1.0 are off. `seed` makes one request's samples reproducible
    whatever else is in the batch. Penalties follow OpenAI (presence, frequency: subtracted from logits of tokens
    already generated) and CTRL/HF (repetition: logits of prompt+output tokens divided by it when positive,
    multiplied when negative). `logprobs` >= 0 returns the log-probability of each chosen token under the model's
    raw distribution (log_softmax of the logits before penalties and temperature). `stop` strings are matched by
    the text layer, not the engine.
    """

    max_tokens: int = 16
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logprobs: int | None = None
    stop: list[str] = field(default_factory=list)

    def validate(self) -> None:
        """Raise ValueError("<field>: <why>") for impossible values."""
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens: must be an integer >= 1, got {self.max_tokens!r}")
        if not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            raise ValueError(f"min_tokens: must be an integer >= 0, got {self.min_tokens!r}")
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens: {self.min_tokens} is larger than max_tokens {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature: must be >= 0, got {self.temperature!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p: must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"top_k: must be -1 (off) or an integer >= 1, got {self.top_k!r}")
        if not -2.0 <= self.presence_penalty <= 2.0:
            raise ValueError(f"presence_penalty: must be in [-2, 2], got {self.presence_penalty!r}")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            raise ValueError(f"frequency_penalty: must be in [-2, 2], got {self.frequency_penalty!r}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty: must be > 0, got {self.repetition_penalty!r}")
        if self.logprobs is not None and (not isinstance(self.logprobs, int) or self.logprobs < 0):
            raise ValueError(f"logprobs: must be None or an integer >= 0, got {self.logprobs!r}")
        if self.seed is not None and not isinstance(self.seed, int):
            raise ValueError(f"seed: must be an integer, got {self.seed!r}")
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids: must be non-negative integers, got {self.stop_token_ids!r}")

    @property
    def is_greedy(self) -> bool:
        # Temperatures below 1e-5 are greedy (vLLM's _SAMPLING_EPS): dividing float32 logits by them
        # overflows to inf/NaN, and their limit is the argmax anyway.
        return self.temperature < SAMPLING_EPS or self.top_k == 1
