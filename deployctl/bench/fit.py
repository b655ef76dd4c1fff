"""Fitting the workload to the server: the served model and its context (``max_model_len`` in GET /v1/models,
as vLLM and the runtime report it), how many tokens the server makes of the synthetic prompts' words, and the
request lengths that fit.

A request fits when its prompt tokens plus its ``max_tokens`` are at most max_model_len (the rule vLLM and the
runtime apply; a longer request is answered 400 context_length_exceeded). Prompt tokens are estimated as
``per_word x words + overhead``: measured with probe requests (``max_tokens`` 1, see probe_tokens) when the
server reports usage, else 1 token per word and no overhead (every BPE tokenizer spends at least one token on a common English
word, so a refusal on that estimate is never wrong).
"""
from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass

import httpx

from deployctl.bench.client import Target, make_client, send
from deployctl.bench.workload import VOCABULARY, BenchRequest

DEFAULT_INPUT_WORDS = 128
DEFAULT_OUTPUT_TOKENS = 128
SAFETY = 0.9  # the default workload uses at most 90% of the context left for the prompt (word lengths vary)
PROBE_CHUNK = 24  # words per probe prompt: fits a small context even at several tokens per word


@dataclass(frozen=True)
class ServerInfo:
    """What GET /v1/models says: the first model's id and its max_model_len (None when not reported)."""

    model: str | None
    max_model_len: int | None


def server_info(base_url: str, headers: dict[str, str], timeout: float = 10.0) -> ServerInfo:
    """The first model of ``base_url``/v1/models; ServerInfo(None, None) when the server cannot say."""
    try:
        resp = httpx.get(base_url + "/v1/models", headers=headers, timeout=timeout, trust_env=False)
        data = resp.json().get("data") if resp.status_code == 200 else None
        if not data:
            return ServerInfo(None, None)
        first = data[0]
        mml = first.get("max_model_len")
        return ServerInfo(str(first["id"]), mml if isinstance(mml, int) and not isinstance(mml, bool) and mml > 0 else None)
    except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError):
        return ServerInfo(None, None)


@dataclass(frozen=True)
class TokenEstimate:
    """prompt tokens ~= per_word x words + overhead (the chat template's tokens); ``measured`` when probed."""

    per_word: float = 1.0
    overhead: float = 0.0
    measured: bool = False

    def tokens(self, words: int) -> int:
        return math.ceil(self.per_word * words + self.overhead)

    def words_for(self, tokens: float) -> int:
        """The most words whose estimate is at most ``tokens`` (at least 1)."""
        return max(1, math.floor((tokens - self.overhead) / self.per_word))


def probe_tokens(target: Target, timeout: float) -> TokenEstimate:
    """Measure what the server makes of synthetic prompts (``max_tokens`` 1 each, from its usage): a one-word
    prompt gives the fixed overhead (the chat template), the vocabulary in chunks of PROBE_CHUNK words gives the
    mean tokens per word (synthetic prompts draw words uniformly from it, so this is the exact expectation).
    The 1-token-per-word estimate when a probe fails or the server reports no usage."""
    chunks = [VOCABULARY[i:i + PROBE_CHUNK] for i in range(0, len(VOCABULARY), PROBE_CHUNK)]

    async def run() -> list:
        async with make_client(2, timeout) as client:
            prompts = [VOCABULARY[0]] + [" ".join(c) for c in chunks]
            return [await send(client, target, BenchRequest(p, None, 1), timeout) for p in prompts]

    results = asyncio.run(run())
    counts = [r.prompt_tokens for r in results]
    if not all(r.ok and isinstance(c, int) and c > 0 for r, c in zip(results, counts)):
        return TokenEstimate()
    one, rest = counts[0], counts[1:]
    # a chunk's tokens = overhead + its words' tokens; the one-word prompt ("the") = overhead + 1
    overhead = max(0.0, one - 1.0)
    per_word = max(1.0, (sum(rest) - len(rest) * overhead) / len(VOCABULARY))
    return TokenEstimate(round(per_word, 3), round(overhead, 1), True)


def default_lengths(max_model_len: int | None, est: TokenEstimate) -> tuple[int, int]:
    """(prompt words, max_tokens) of the default workload: 128 and 128 when they fit, else max_tokens a quarter
    of the context (at most 128) and the prompt 90% of what is left."""
    if max_model_len is None or est.tokens(DEFAULT_INPUT_WORDS) + DEFAULT_OUTPUT_TOKENS <= SAFETY * max_model_len:
        return DEFAULT_INPUT_WORDS, DEFAULT_OUTPUT_TOKENS
    out = max(1, min(DEFAULT_OUTPUT_TOKENS, max_model_len // 4))
    words = est.words_for(SAFETY * (max_model_len - out))
    return min(DEFAULT_INPUT_WORDS, words), out


def misfit(in_words: int | None, out_tokens: int, max_model_len: int, est: TokenEstimate) -> str | None:
    """Why requests of up to ``in_words`` prompt words (None: a dataset, prompt unknown) and ``out_tokens``
    max_tokens cannot fit, with the numbers; None when they fit."""
    if in_words is None:
        if out_tokens >= max_model_len:
            return f"max_tokens up to {out_tokens} leave no room for a prompt in max_model_len {max_model_len}"
        return None
    tokens = est.tokens(in_words)
    if tokens + out_tokens <= max_model_len:
        return None
    how = (f"~{tokens} tokens at {est.per_word:g} tokens/word + {est.overhead:g} measured" if est.measured
           else f"at least {tokens} tokens")
    return (f"prompts of up to {in_words} words ({how}) + max_tokens up to {out_tokens} "
            f"= {tokens + out_tokens} > max_model_len {max_model_len}")
