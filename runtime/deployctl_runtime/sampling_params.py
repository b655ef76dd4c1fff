"""Per-request sampling settings (names and defaults follow vLLM's SamplingParams), and the one validator the offline
API and the HTTP server share: both accept and refuse the same values with the same messages."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

SAMPLING_EPS = 1e-5
MAX_LOGPROBS = 20
MAX_STOP_STRINGS = 4  # OpenAI: up to 4 sequences
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1  # what torch.Generator.manual_seed accepts
MAX_LOGIT_BIAS = 300  # OpenAI's limit on logit_bias entries


@dataclass
class StructuredOutputsParams:
    """Constrain the output by a grammar (enforced while decoding, structured.py). Exactly one of: `json` (a JSON
    schema, dict or JSON text), `json_object` (any JSON object), `lark` (a Lark grammar as llguidance reads it)."""

    json: dict | str | None = None
    json_object: bool = False
    lark: str | None = None


@dataclass
class SamplingParams:
    """How to pick each next token and when to stop.

    temperature 0 means greedy. top_k -1 or 0, top_p 1.0 and min_p 0 are off; min_p keeps the tokens whose
    probability is at least min_p times the most likely token's (vLLM's min_p, after temperature). `seed` makes
    one request's samples reproducible whatever else is in the batch. Penalties follow OpenAI (presence,
    frequency: subtracted from logits of tokens already generated) and CTRL/HF (repetition: logits of
    prompt+output tokens divided by it when positive, multiplied when negative). `logit_bias` {token id: bias in
    [-100, 100]} is added to the logits (OpenAI). `skip_special_tokens` (default True) leaves special tokens out
    of the text; `include_stop_str_in_output` keeps the matched stop string, or the text of the stop token, at
    the end of the text (vLLM's; both for the text layer). `logprobs` = N >= 0 returns the chosen token's
    log-probability and the N most likely alternatives, under the distribution sampled from (after logit_bias,
    penalties, temperature; see sampler.py). `stop` strings are matched
    by the text layer, not the engine.
    """

    max_tokens: int = 16
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    seed: int | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logprobs: int | None = None
    stop: list[str] = field(default_factory=list)
    logit_bias: dict[int, float] = field(default_factory=dict)
    structured_outputs: StructuredOutputsParams | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False

    def validate(self) -> None:
        """Raise ValueError("<field>: <why>") for impossible values (the same rules over HTTP, where <field> becomes
        the error's `param`)."""
        _int("max_tokens", self.max_tokens, 1)
        _int("min_tokens", self.min_tokens, 0)
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens: {self.min_tokens} must not exceed max_tokens {self.max_tokens}")
        _num("temperature", self.temperature, 0.0, 2.0)
        _num("top_p", self.top_p, 0.0, 1.0, low_open=True)
        _num("min_p", self.min_p, 0.0, 1.0)
        if not _is_int(self.top_k) or self.top_k < -1:
            raise ValueError(f"top_k: must be -1 or 0 (off) or an integer >= 1, got {self.top_k!r}")
        _num("presence_penalty", self.presence_penalty, -2.0, 2.0)
        _num("frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        _num("repetition_penalty", self.repetition_penalty, 0.0, math.inf, low_open=True)
        if self.logprobs is not None:
            _int("logprobs", self.logprobs, 0, MAX_LOGPROBS)
        if self.seed is not None and not (_is_int(self.seed) and SEED_MIN <= self.seed <= SEED_MAX):
            raise ValueError(f"seed: must be an integer in [-2**63, 2**64 - 1] (torch.Generator.manual_seed's "
                             f"range), got {self.seed!r}")
        if any(not _is_int(t) or t < 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids: must be non-negative integers, got {self.stop_token_ids!r}")
        if len(self.stop) > MAX_STOP_STRINGS:
            raise ValueError(f"stop: at most {MAX_STOP_STRINGS} stop strings are allowed, got {len(self.stop)}")
        if any(not isinstance(s, str) or s == "" for s in self.stop):
            raise ValueError("stop: stop strings must be non-empty strings")
        if len(self.logit_bias) > MAX_LOGIT_BIAS:
            raise ValueError(f"logit_bias: at most {MAX_LOGIT_BIAS} entries, got {len(self.logit_bias)}")
        for tid, bias in self.logit_bias.items():
            if not _is_int(tid) or tid < 0:
                raise ValueError(f"logit_bias: keys must be token ids >= 0, got {tid!r}")
            _num("logit_bias", bias, -100.0, 100.0)
        s = self.structured_outputs
        if s is not None and sum((s.json is not None, bool(s.json_object), s.lark is not None)) != 1:
            raise ValueError("structured_outputs: give exactly one of json, json_object, lark")

    @property
    def is_greedy(self) -> bool:
        # Temperatures below 1e-5 are greedy (vLLM's _SAMPLING_EPS): dividing float32 logits by them
        # overflows to inf/NaN, and their limit is the argmax anyway.
        return self.temperature < SAMPLING_EPS or self.top_k == 1


def context_length_error(prompt_len: int, max_tokens: int | None, max_model_len: int, param: str = "prompt",
                         tokens_param: str = "max_tokens") -> tuple[str, str] | None:
    """The one context-length rule (offline and HTTP): a prompt of max_model_len tokens or more leaves no room;
    prompt + max_tokens over max_model_len is refused, never clamped. Returns (param, message) or None when fine;
    ``tokens_param`` is the name the client gave max_tokens (max_completion_tokens over HTTP)."""
    if prompt_len >= max_model_len:
        return param, (f"This model's maximum context length is {max_model_len} tokens. However, your {param} has "
                       f"{prompt_len} tokens, leaving no room to generate; shorten it to under {max_model_len} "
                       "tokens.")
    if max_tokens is not None and prompt_len + max_tokens > max_model_len:
        return tokens_param, (f"This model's maximum context length is {max_model_len} tokens. However, you "
                              f"requested {prompt_len + max_tokens} tokens ({prompt_len} in the {param}, "
                              f"{max_tokens} for {tokens_param}); lower {tokens_param} to at most "
                              f"{max_model_len - prompt_len} or shorten the {param}.")
    return None


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _int(name: str, v: Any, low: int, high: int | None = None) -> None:
    if not _is_int(v) or v < low or (high is not None and v > high):
        rng = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name}: must be an integer {rng}, got {v!r}")


def _num(name: str, v: Any, low: float, high: float, low_open: bool = False) -> None:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if ok:
        ok = (v > low if low_open else v >= low) and v <= high
    if not ok:
        rng = f"{'(' if low_open else '['}{low:g}, {high:g}]" if math.isfinite(high) else f"> {low:g}"
        raise ValueError(f"{name}: must be a number in {rng}, got {v!r}")
