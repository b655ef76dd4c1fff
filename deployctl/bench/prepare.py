"""The workload of a bench run, fitted to the server: synthetic lengths (the defaults shrunk to fit
max_model_len, explicit ones refused when they cannot fit), a dataset (JSONL or ShareGPT), or the shape of the
runtime's own request log (lengths and arrival pattern). Raises UsageError (exit 2) for lengths that cannot fit,
ConfigError (exit 3) for unreadable files."""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from deployctl.bench import fit, fromlog, workload
from deployctl.bench.client import Target
from deployctl.bench.datasets import load_dataset
from deployctl.errors import UsageError


@dataclass
class Workload:
    """``requests`` to cycle through; ``rate``/``arrival_gaps`` when the log sets the open loop; ``info`` for
    --json; ``notes`` for the human (what was fitted); ``context`` words for failure summaries."""

    requests: list[workload.BenchRequest]
    rate: float | None = None
    arrival_gaps: tuple[float, ...] | None = None
    info: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    context: str = ""


def _bounds(input_len: str | None, output_len: str | None) -> tuple[int | None, int | None]:
    return (workload.length_bound(input_len, "--input-len") if input_len is not None else None,
            workload.length_bound(output_len, "--output-len") if output_len is not None else None)


def check_explicit(input_len: str | None, output_len: str | None, max_model_len: int | None,
                   est: fit.TokenEstimate) -> None:
    """UsageError naming the numbers when explicit lengths cannot fit max_model_len under ``est`` (a length not
    given counts as 1: the default shrinks to fit the other)."""
    if max_model_len is None or (input_len is None and output_len is None):
        return
    in_max, out_max = _bounds(input_len, output_len)
    why = fit.misfit(in_max or 1, out_max or 1, max_model_len, est)
    if why:
        words, out = fit.default_lengths(max_model_len, est)
        raise UsageError(f"--input-len {input_len or 1} --output-len {output_len or 1}: {why}",
                         fix=f"keep prompt tokens + max_tokens within {max_model_len}, e.g. --input-len {words} "
                             f"--output-len {out}")


def _fitted(input_len: str | None, output_len: str | None, max_model_len: int | None,
            est: fit.TokenEstimate) -> tuple[str, str]:
    """The specs to use: the given ones, and defaults that fit next to them."""
    words, out = fit.default_lengths(max_model_len, est)
    in_max, out_max = _bounds(input_len, output_len)
    if max_model_len is not None and in_max is not None and output_len is None:
        out = max(1, min(fit.DEFAULT_OUTPUT_TOKENS, max_model_len - est.tokens(in_max)))
    if max_model_len is not None and out_max is not None and input_len is None:
        words = min(fit.DEFAULT_INPUT_WORDS, est.words_for(fit.SAFETY * (max_model_len - out_max)))
    return input_len or str(words), output_len or str(out)


def build(need: int, seed: int, target: Target, max_model_len: int | None, timeout: float, *,
          input_len: str | None = None, output_len: str | None = None, dataset: Path | None = None,
          from_log: Path | None = None, probe: Callable[..., fit.TokenEstimate] = fit.probe_tokens) -> Workload:
    """``need`` requests (the ladder cycles through them). When the context is known, probes the server's tokens
    per word (a few requests of max_tokens 1, fit.probe_tokens) to choose or check lengths in tokens; explicit
    lengths that cannot fit even at 1 token per word are refused before that."""
    if dataset is not None:
        default_out = workload.parse_length_spec(output_len or str(fit.DEFAULT_OUTPUT_TOKENS), "--output-len")
        override = default_out(random.Random(seed)) if output_len is not None else None
        reqs = workload.pick(load_dataset(dataset, default_out(random.Random(seed)), override), need, seed)
        return Workload(reqs, info={"kind": "dataset", "path": str(dataset)},
                        context=_context_of(reqs, max_model_len))
    check_explicit(input_len, output_len, max_model_len, fit.TokenEstimate())  # before any request
    shape = fromlog.parse_log(from_log) if from_log is not None else None  # a bad log fails before any request
    est = fit.TokenEstimate()
    if max_model_len is not None:
        est = probe(target, timeout)
        check_explicit(input_len, output_len, max_model_len, est)
    if shape is not None:
        shortened = []
        reqs = fromlog.requests_from_log(shape, need, seed, _log_words(est, max_model_len, shortened))
        info = {"kind": "from_log", "path": str(from_log), "log_requests": len(shape.entries),
                "log_rate": round(shape.rate, 3) if shape.rate else None,
                "tokens_per_word": est.per_word if est.measured else None, "shortened": len(shortened)}
        notes = [f"replaying the shape of {len(shape.entries)} logged requests "
                 f"({shape.rate or 0:.2f} req/s over {shape.span_s:.0f} s)"]
        if shortened:
            notes.append(f"{len(shortened)} of {need} replayed prompts shortened to fit max_model_len {max_model_len} "
                         f"(synthetic words tokenize unevenly: a logged prompt within {1 - fit.SAFETY:.0%} of the "
                         f"context would be refused 400)")
        return Workload(reqs, rate=shape.rate, arrival_gaps=tuple(shape.gaps) if shape.rate else None, info=info,
                        context=_context_of(reqs, max_model_len), notes=notes)
    in_spec, out_spec = _fitted(input_len, output_len, max_model_len, est)
    notes = []
    if max_model_len is not None and (in_spec, out_spec) != (input_len or str(fit.DEFAULT_INPUT_WORDS),
                                                             output_len or str(fit.DEFAULT_OUTPUT_TOKENS)):
        notes.append(f"workload fitted to max_model_len {max_model_len}: --input-len {in_spec} "
                     f"--output-len {out_spec} (the server makes ~{est.per_word:g} tokens of a prompt word)")
    reqs = workload.synthetic(need, in_spec, out_spec, seed)
    info = {"kind": "synthetic", "input_len": in_spec, "output_len": out_spec,
            "tokens_per_word": est.per_word if est.measured else None}
    return Workload(reqs, info=info, notes=notes, context=_context_of(reqs, max_model_len, est))


def _log_words(est: fit.TokenEstimate, max_model_len: int | None, shortened: list) -> Callable[[int, int], int]:
    """words_for(prompt_tokens, max_tokens) for a logged request: the estimate's words for its prompt tokens, capped
    at fit.SAFETY of what its max_tokens leave of ``max_model_len`` (each capped request is appended to
    ``shortened``)."""
    def words_for(prompt_tokens: int, max_tokens: int) -> int:
        room = fit.SAFETY * (max_model_len - max_tokens) if max_model_len is not None else prompt_tokens
        if prompt_tokens > room:
            shortened.append(prompt_tokens)
            return est.words_for(max(1.0, room))
        return est.words_for(prompt_tokens)
    return words_for


def _context_of(reqs: list[workload.BenchRequest], max_model_len: int | None,
                est: fit.TokenEstimate | None = None) -> str:
    words = max(len(r.as_prompt().split()) for r in reqs)
    out = max(r.max_tokens for r in reqs)
    tokens = f" (~{est.tokens(words)} tokens)" if est is not None and est.measured else ""
    against = f" against max_model_len {max_model_len}" if max_model_len else ""
    return f"prompts of up to {words} words{tokens} + max_tokens up to {out}{against}"
