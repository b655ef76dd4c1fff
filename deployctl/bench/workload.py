"""Requests to send: from a JSONL file of real-shaped requests, or synthetic with seeded length distributions.

A JSONL line is an object with either ``prompt`` (string) or ``messages`` (OpenAI chat messages), and optionally
``max_tokens`` (or ``output_len``). Synthetic prompts are words drawn from a fixed vocabulary; their length is in
words, which most tokenizers turn into about as many tokens (the server's ``usage`` reports the true count).

Length distribution specs (``--input-len`` / ``--output-len``): ``128`` (fixed), ``64-256`` (uniform integers,
inclusive), ``normal:128,32`` (normal, rounded, at least 1), ``lognormal:128,0.5`` (median 128, sigma 0.5).
"""
from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from deployctl.errors import ConfigError, UsageError

_WORDS = (
    "the of and to in is was that for on with as by at from his an were are which this be or had not but what all "
    "when there can have one we your they more will about up if out many then them these so some would other into "
    "time has two like him see could no make than been its who now people my made over did down only way find use "
    "may water long little very after words called just where most know get through back much before go good new "
    "write our used me man too any day same right look think also around another came come work three word must"
).split()
VOCABULARY = tuple(_WORDS)  # the words synthetic prompts are drawn from, uniformly


@dataclass(frozen=True)
class BenchRequest:
    """One request to send: either a ``prompt`` or chat ``messages``; ``max_tokens`` caps the output."""

    prompt: str | None
    messages: list[dict[str, Any]] | None
    max_tokens: int

    def as_prompt(self) -> str:
        if self.prompt is not None:
            return self.prompt
        return "\n".join(str(m.get("content", "")) for m in self.messages or [])

    def as_messages(self) -> list[dict[str, Any]]:
        if self.messages is not None:
            return self.messages
        return [{"role": "user", "content": self.prompt or ""}]


MAX_LEN = 1 << 20  # words or tokens per request: far beyond any context window, small enough to build
WORD_BUDGET = 1 << 24  # words across the synthetic pool (~100 MB of prompts)


def parse_length_spec(spec: str, what: str) -> Callable[[random.Random], int]:
    """A sampler ``rng -> int in 1..MAX_LEN`` from a spec (see module docstring). Raises UsageError on a bad spec
    (not finite, or a length over MAX_LEN)."""
    sample = _parse_length_spec(spec, what)
    return lambda rng: min(MAX_LEN, sample(rng))


def _parse_length_spec(spec: str, what: str) -> Callable[[random.Random], int]:
    text = spec.strip()
    fix = f"use e.g. {what} 128, {what} 64-256, {what} normal:128,32 or {what} lognormal:128,0.5 (at most {MAX_LEN})"
    numbers = [x for x in text.split(":")[-1].replace("-", ",").split(",") if x.strip()]
    try:
        if any(not math.isfinite(float(x)) or float(x) > MAX_LEN for x in numbers):
            raise ValueError
        if text.startswith("normal:"):
            mean, std = (float(x) for x in text[len("normal:"):].split(","))
            if mean < 1 or std < 0:
                raise ValueError
            return lambda rng: max(1, round(rng.gauss(mean, std)))
        if text.startswith("lognormal:"):
            median, sigma = (float(x) for x in text[len("lognormal:"):].split(","))
            if median < 1 or sigma < 0:
                raise ValueError
            # lognormvariate is exp(normalvariate): clamp in log space so a large sigma cannot overflow exp
            return lambda rng: max(1, round(math.exp(min(rng.normalvariate(math.log(median), sigma),
                                                         math.log(MAX_LEN)))))
        if "-" in text:
            lo, hi = (int(x) for x in text.split("-"))
            if lo < 1 or hi < lo:
                raise ValueError
            return lambda rng: rng.randint(lo, hi)
        n = int(text)
        if n < 1:
            raise ValueError
        return lambda rng: n
    except ValueError:
        raise UsageError(f"{what} {spec!r} is not a length distribution", fix=fix) from None


def prompt_words(rng: random.Random, num: int) -> str:
    """A synthetic prompt of ``num`` words drawn from the fixed vocabulary."""
    return " ".join(rng.choice(_WORDS) for _ in range(num))


def length_bound(spec: str, what: str) -> int:
    """The largest length a spec gives in practice: N, HI of LO-HI, mean + 3 std (normal), median x exp(3 sigma)
    (lognormal), at most MAX_LEN. Raises UsageError on a bad spec."""
    parse_length_spec(spec, what)  # validates
    text = spec.strip()
    if text.startswith("normal:"):
        mean, std = (float(x) for x in text[len("normal:"):].split(","))
        return min(MAX_LEN, math.ceil(mean + 3 * std))
    if text.startswith("lognormal:"):
        median, sigma = (float(x) for x in text[len("lognormal:"):].split(","))
        return min(MAX_LEN, math.ceil(math.exp(min(math.log(median) + 3 * sigma, math.log(MAX_LEN)))))
    return min(MAX_LEN, int(text.split("-")[-1]))


def synthetic(num: int, input_len: str, output_len: str, seed: int) -> list[BenchRequest]:
    """``num`` synthetic requests (fewer once their prompts hold WORD_BUDGET words); the same seed gives the same
    requests."""
    rng = random.Random(seed)
    sample_in = parse_length_spec(input_len, "--input-len")
    sample_out = parse_length_spec(output_len, "--output-len")
    out, total = [], 0
    for _ in range(num):
        n_in = sample_in(rng)
        words = prompt_words(rng, n_in)
        out.append(BenchRequest(prompt=words, messages=None, max_tokens=sample_out(rng)))
        total += n_in
        if total >= WORD_BUDGET:  # long prompts: fewer distinct ones (the ladder cycles through them)
            break
    return out


def load_jsonl(path: Path, default_max_tokens: int) -> list[BenchRequest]:
    """Requests from a JSONL file. Raises ConfigError naming the file and line on a bad line or empty file."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as err:
        raise ConfigError(f"dataset {path}: {err.strerror or err}", fix="pass an existing JSONL file to --dataset") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"dataset {path}: not UTF-8 text (byte {err.object[err.start]:#04x} at offset {err.start})",
                          fix="save the dataset as UTF-8 JSONL") from None
    out = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"dataset {path} line {lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            raise ConfigError(f"{where}: not JSON ({err.msg})", fix="one JSON object per line") from None
        if not isinstance(obj, dict) or not (isinstance(obj.get("prompt"), str) or isinstance(obj.get("messages"), list)):
            raise ConfigError(f"{where}: no 'prompt' string or 'messages' list", fix='e.g. {"prompt": "Hi", "max_tokens": 64}')
        max_tokens = obj.get("max_tokens", obj.get("output_len", default_max_tokens))
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise ConfigError(f"{where}: max_tokens {max_tokens!r} is not a positive integer", fix="set max_tokens >= 1")
        prompt = obj.get("prompt") if isinstance(obj.get("prompt"), str) else None
        messages = obj.get("messages") if prompt is None else None
        out.append(BenchRequest(prompt=prompt, messages=messages, max_tokens=max_tokens))
    if not out:
        raise ConfigError(f"dataset {path} has no requests", fix="add one JSON object per line")
    return out


def pick(requests: list[BenchRequest], num: int, seed: int) -> list[BenchRequest]:
    """``num`` requests cycled from a shuffled (seeded) copy of ``requests``."""
    order = list(requests)
    random.Random(seed).shuffle(order)
    return [order[i % len(order)] for i in range(num)]
