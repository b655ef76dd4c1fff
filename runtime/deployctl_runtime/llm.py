"""Offline API: LLM(model_dir, **engine_args).generate(prompts, sampling_params)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from deployctl_runtime.engine import LLMEngine
from deployctl_runtime.engine_args import EngineArgs
from deployctl_runtime.sampling_params import SamplingParams
from deployctl_runtime.tokenizer import encode_prompt


@dataclass
class CompletionOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str | None
    logprobs: list[float] | None = None
    num_cached_tokens: int = 0
    top_logprobs: list[list[tuple[int, float]]] | None = None  # per token: (id, logprob), most likely first
    error: str | None = None  # why finish_reason is "error" (e.g. non-finite logits)
    extra: dict = field(default_factory=dict)


def _apply_stop_strings(text: str, stops: list[str], include: bool = False) -> tuple[str, bool]:
    """The text cut before the earliest stop string (after it with `include`: include_stop_str_in_output)."""
    hits = [(i, i + len(s)) for i, s in ((text.find(s), s) for s in stops if s) if i >= 0]
    if not hits:
        return text, False
    start, end = min(hits)
    return text[: end if include else start], True


def _has_stop(text: str, stops: list[str]) -> bool:
    return any(s and s in text for s in stops)


class LLM:
    """Run a batch of prompts to completion with continuous batching. engine_args use the serve flags' names."""

    def __init__(self, model: str, log: Callable[[str], None] | None = None, **engine_args):
        self.engine = LLMEngine.from_engine_args(EngineArgs(model=str(model), **engine_args), log)
        self.tokenizer = self.engine.tokenizer
        self._next_id = 0

    def _stop_token_count(self, toks: list[int], stops: list[str]) -> int:
        """The fewest leading tokens whose text holds a stop string (binary search: a prefix's text grows with it),
        as the server stops generating at the token that completes one."""
        lo, hi = 1, len(toks)
        while lo < hi:
            mid = (lo + hi) // 2
            if _has_stop(self.tokenizer.decode(toks[:mid]), stops):
                hi = mid
            else:
                lo = mid + 1
        return lo

    def generate(self, prompts, sampling_params: SamplingParams | list[SamplingParams] | None = None
                 ) -> list[CompletionOutput]:
        """prompts: a string, a list of strings, or a list of token-id lists. Returns outputs in prompt order.
        Stop strings cut the text (and the token ids after the stop) and finish with "stop". A text prompt gets the
        tokenizer's BOS once (tokenizer.encode_prompt). Raises ValueError (bad params) or RequestRejected (a prompt
        that cannot fit max_model_len with max_tokens; the same rule and message as the HTTP server's 400)."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        if sampling_params is None:
            sampling_params = SamplingParams()
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"sampling_params: got {len(params)} for {len(prompts)} prompts")
        ids = []
        order = {}
        for prompt, p in zip(prompts, params):
            token_ids = (encode_prompt(self.tokenizer, prompt, self.engine.bos_token_id) if isinstance(prompt, str)
                         else list(prompt))
            rid = f"offline-{self._next_id}"
            self._next_id += 1
            self.engine.add_request(rid, token_ids, p)
            order[rid] = len(ids)
            ids.append((rid, token_ids, p))
        tokens: dict[str, list[int]] = {rid: [] for rid, _, _ in ids}
        logprobs: dict[str, list[float]] = {rid: [] for rid, _, _ in ids}
        tops: dict[str, list] = {rid: [] for rid, _, _ in ids}
        finished: dict[str, tuple[str | None, int, str | None]] = {}
        while len(finished) < len(ids):
            for out in self.engine.step():
                tokens[out.request_id] += out.new_token_ids
                if out.new_logprobs:
                    logprobs[out.request_id] += out.new_logprobs
                if out.new_top_logprobs:
                    tops[out.request_id] += out.new_top_logprobs
                if out.finished:
                    finished[out.request_id] = (out.finish_reason, out.num_cached_tokens, out.error)
        results = []
        for rid, prompt_ids, p in ids:
            reason, cached, error = finished[rid]
            toks = tokens[rid]
            skip, include = p.skip_special_tokens, p.include_stop_str_in_output
            # the stop token (eos, stop_token_ids) is not text unless include_stop_str_in_output, as the server has it
            text = self.tokenizer.decode(toks[:-1] if reason == "stop" and toks and not include else toks,
                                         skip_special_tokens=skip)
            lps, top = logprobs[rid], tops[rid]
            if p.stop:
                text, hit = _apply_stop_strings(text, p.stop, include)
                if hit:
                    reason = "stop"
                    k = self._stop_token_count(toks, p.stop)  # the tokens up to the one completing the stop
                    toks, lps, top = toks[:k], lps[:k], top[:k]
                    text, _ = _apply_stop_strings(self.tokenizer.decode(toks, skip_special_tokens=skip), p.stop,
                                                  include)
            results.append(CompletionOutput(rid, prompt_ids, toks, text, reason,
                                            lps if p.logprobs is not None else None, cached,
                                            top if p.logprobs else None, error))
        return results
