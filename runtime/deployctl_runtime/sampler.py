"""Turn the last-position logits of each sampling request into one token id, its logprob and top alternatives.

All logits processing lives here, in this order (as vLLM): non-finite check (a row with NaN/inf ends that request
with an error; the other rows go on) -> grammar bitmask (structured output, `structured.py`) -> logit_bias ->
min_tokens mask -> repetition/presence/frequency penalties -> greedy argmax, or temperature -> min-p -> top-k -> top-p
-> a sample drawn with the request's own torch.Generator when it has a seed (so its tokens do not depend on what else
is in the batch). Sampling uses the exponential race: argmax(p / E) with E ~ Exp(1) picks index i with probability p_i
(the Gumbel-max trick in another form).

Logprobs (the chosen token's and the top-N alternatives) are log_softmax of the logits after the bitmask,
logit_bias, penalties and temperature (temperature 1 for greedy), before top-k/top-p truncation: the distribution
the token is drawn from, as OpenAI documents. -inf (a masked token) is reported as -9999.0, as vLLM does, so no
non-finite number ever reaches JSON.
"""
from __future__ import annotations

import weakref

import torch

from deployctl_runtime.kernels import cpu_kernels
from deployctl_runtime.request import Request, SampledToken

MIN_LOGPROB = -9999.0
NON_FINITE = ("non-finite logits (NaN or inf) from the model: its activations overflowed the dtype; "
              "serve it with --dtype bfloat16 or float32")


class Sampler:
    """Owns the engine generator, the per-request generators of seeded requests and the per-request grammar
    matchers (both keyed weakly by the Request, so they go when the request does)."""

    def __init__(self, device: torch.device, seed: int = 0):
        self.device = device
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)
        self._generators: weakref.WeakKeyDictionary[Request, torch.Generator] = weakref.WeakKeyDictionary()
        self.structured = None  # structured.StructuredOutputs, set by the engine once the tokenizer is known

    def __call__(self, logits: torch.Tensor, requests: list[Request]) -> list[SampledToken]:
        """logits [N, V] float32 (one row per request, in order) -> one SampledToken per request."""
        greedy = [r.params.is_greedy for r in requests]
        fast = self._greedy_plain(logits, requests) if all(greedy) else None
        if fast is not None:  # every row finite, greedy, nothing to apply: the argmax is the token
            tokens, finite_list = fast
            scaled = logits
        else:
            finite = row_finite(logits)
            finite_list = finite.tolist()
            if not all(finite_list):  # keep the batch: the bad rows get zeros here and an error below
                logits = logits.masked_fill(~finite.unsqueeze(1), 0.0)
            logits = self._apply_constraints(logits, requests)
            if all(greedy):
                tokens = row_argmax(logits)
                scaled = logits
            else:
                temps = torch.tensor([1.0 if g else r.params.temperature for r, g in zip(requests, greedy)],
                                     device=logits.device, dtype=logits.dtype)
                scaled = logits / temps.unsqueeze(1)
                tokens = self._sample(logits, scaled, requests, greedy)
        token_list = tokens.tolist()
        chosen, tops = self._logprobs(scaled, tokens, requests)
        errors = self.structured.accept(requests, token_list) if self.structured is not None else None
        out = []
        for i, r in enumerate(requests):
            if not finite_list[i]:
                out.append(SampledToken(0, None, None, NON_FINITE))
            elif errors and errors[i]:
                out.append(SampledToken(0, None, None, errors[i]))
            else:
                out.append(SampledToken(token_list[i], chosen[i], tops[i], None))
        return out

    def _logprobs(self, scaled: torch.Tensor, tokens: torch.Tensor, requests: list[Request]):
        want = [r.params.logprobs for r in requests]
        if all(w is None for w in want):
            return [None] * len(requests), [None] * len(requests)
        lp = torch.log_softmax(scaled, dim=-1).clamp_(min=MIN_LOGPROB)
        chosen = lp.gather(1, tokens.unsqueeze(1)).squeeze(1).tolist()
        k = max(w or 0 for w in want)
        top_vals, top_ids = (lp.topk(min(k, lp.shape[1]), dim=-1) if k else (None, None))
        top_vals = top_vals.tolist() if k else None
        top_ids = top_ids.tolist() if k else None
        tops = []
        for i, w in enumerate(want):
            tops.append(list(zip(top_ids[i][:w], top_vals[i][:w])) if w else None)
        return [c if w is not None else None for c, w in zip(chosen, want)], tops

    def _greedy_plain(self, logits: torch.Tensor, requests: list[Request]):
        """(argmax [N], finite flags) in one read through the CPU operators (kernels/cpu_kernels.py), when every
        row is finite and no request has anything to apply to its logits; else None (the general path)."""
        ops = cpu_kernels.native(logits)
        if ops is None or not logits.is_contiguous() or any(r.params.structured_outputs is not None or
                                                            _needs_processing(r) for r in requests):
            return None
        tokens, finite = ops.argmax_finite(logits)
        return (tokens, finite) if all(finite) else None

    def _apply_constraints(self, logits: torch.Tensor, requests: list[Request]) -> torch.Tensor:
        cloned = False
        if self.structured is not None and any(r.params.structured_outputs is not None for r in requests):
            logits, cloned = logits.clone(), True
            self.structured.apply_bitmask(logits, requests)
        for i, r in enumerate(requests):
            p = r.params
            if not _needs_processing(r):
                continue
            needs_mask = r.num_output_tokens < p.min_tokens and r.stop_ids
            if not cloned:
                logits, cloned = logits.clone(), True
            row = logits[i]
            if p.logit_bias:  # OpenAI: added to the logits before sampling
                ids = torch.tensor([int(t) for t in p.logit_bias], device=row.device, dtype=torch.long)
                row[ids] += torch.tensor(list(p.logit_bias.values()), device=row.device, dtype=row.dtype)
            if needs_mask:
                stop = torch.tensor(sorted(r.stop_ids), device=row.device, dtype=torch.long)
                kept = row[stop].clone()
                row[stop] = float("-inf")
                if not torch.isfinite(row).any():  # only a stop is allowed (a complete grammar): stopping wins
                    row[stop] = kept
                    r.grammar_complete = True  # check_stop ends it at this stop despite min_tokens
            if p.repetition_penalty != 1.0:  # CTRL (Keskar et al. 2019) as HF applies it: prompt and output tokens
                seen = torch.tensor(r.all_token_ids, device=row.device, dtype=torch.long).unique()
                vals = row[seen]
                row[seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
            if (p.presence_penalty or p.frequency_penalty) and r.output_token_ids:  # OpenAI: output tokens only
                out = torch.tensor(r.output_token_ids, device=row.device, dtype=torch.long)
                counts = torch.bincount(out, minlength=row.shape[0]).to(row.dtype)
                row -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(row.dtype)
        return logits

    def _sample(self, logits: torch.Tensor, scaled: torch.Tensor, requests: list[Request],
                greedy: list[bool]) -> torch.Tensor:
        top_ks = [r.params.top_k for r in requests]
        top_ps = [r.params.top_p for r in requests]
        min_ps = [0.0 if g else r.params.min_p for r, g in zip(requests, greedy)]
        if any(min_ps):
            scaled = _min_p(scaled, min_ps)
        if any(k > 0 for k in top_ks) or any(p < 1.0 for p in top_ps):
            scaled = _top_k_top_p(scaled, top_ks, top_ps)
        probs = torch.softmax(scaled, dim=-1)
        noise = torch.empty_like(probs)
        unseeded = [i for i, r in enumerate(requests) if r.params.seed is None]
        if unseeded:
            noise[unseeded] = torch.empty(len(unseeded), probs.shape[1], device=probs.device).exponential_(
                generator=self.generator)
        for i, r in enumerate(requests):
            if r.params.seed is not None:
                gen = self._generators.get(r)
                if gen is None:
                    gen = self._generators[r] = torch.Generator(device=probs.device)
                    gen.manual_seed(r.params.seed)
                noise[i].exponential_(generator=gen)
        sampled = row_argmax(probs / noise)
        greedy_t = torch.tensor(greedy, device=logits.device)
        return torch.where(greedy_t, row_argmax(logits), sampled)


def _needs_processing(r: Request) -> bool:
    """Whether the request's logits get a min_tokens mask, a penalty or a logit_bias (Sampler._apply_constraints)."""
    p = r.params
    return bool((r.num_output_tokens < p.min_tokens and r.stop_ids) or p.repetition_penalty != 1.0
                or p.presence_penalty or p.frequency_penalty or p.logit_bias)


def row_finite(x: torch.Tensor) -> torch.Tensor:
    """[N, V] -> [N] bool, True where every element of the row is finite (torch.isfinite(x).all(-1)).

    A row's sum is finite only when every element is (IEEE 754: an inf or NaN operand makes the sum inf or NaN),
    so one vectorized reduction answers for the usual all-finite batch; only when a sum is not finite (a bad row,
    or finite values whose sum overflows) does the exact elementwise check run. On this 2-core AVX2 machine the
    exact check of [16, 32000] float32 takes ~1.2 ms, the sum ~0.05 ms (bench/bench_engine.py's profile). CUDA takes
    the exact check at once (fast there, and no extra device sync for the branch)."""
    if x.device.type != "cpu":
        return torch.isfinite(x).all(dim=-1)
    fast = torch.isfinite(x.sum(dim=-1))
    if bool(fast.all()):
        return fast
    return torch.isfinite(x).all(dim=-1)


def row_argmax(x: torch.Tensor) -> torch.Tensor:
    """[N, V] -> [N] long: x.argmax(-1), the first index of each row's maximum (NaN counts as the maximum, as
    torch.argmax has it).

    On CPU, torch's argmax over a dimension is not vectorized (~1 ms for [16, 32000] float32 here, where the max
    value alone, amax, takes ~0.04 ms), so the row is cut into blocks of C: the block holding the first maximum is
    the first whose amax is the row's (amax propagates NaN, and argmax takes the first of equal values), then the
    first maximum inside that block. Same result, ~0.1 ms. CUDA, and vocabularies with no block size from 256 down
    to 16 dividing them, use torch.argmax directly."""
    n, vocab = x.shape
    block = next((c for c in (256, 128, 64, 32, 16) if vocab % c == 0), 0)
    if x.device.type != "cpu" or not block or vocab <= block:
        return x.argmax(dim=-1)
    blocks = x.reshape(n, vocab // block, block)
    which = blocks.amax(dim=-1).argmax(dim=-1)
    inner = blocks[torch.arange(n, device=x.device), which].argmax(dim=-1)
    return which * block + inner


def _min_p(logits: torch.Tensor, min_ps: list[float]) -> torch.Tensor:
    """Mask to -inf every token whose probability is below min_p times the row's most likely token's (vLLM's
    min_p sampling, on the temperature-scaled distribution; min_p 0 masks nothing, the most likely token stays)."""
    probs = torch.softmax(logits, dim=-1)
    ps = torch.tensor(min_ps, device=logits.device, dtype=probs.dtype).unsqueeze(1)
    return logits.masked_fill(probs < ps * probs.amax(dim=-1, keepdim=True), float("-inf"))


def _top_k_top_p(logits: torch.Tensor, top_ks: list[int], top_ps: list[float]) -> torch.Tensor:
    """Mask to -inf every token outside the k most likely and outside the smallest set whose probability
    reaches top_p (the most likely token always stays)."""
    vocab = logits.shape[1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ks = torch.tensor([k if 0 < k < vocab else vocab for k in top_ks], device=logits.device)
    ranks = torch.arange(vocab, device=logits.device).unsqueeze(0)
    drop = ranks >= ks.unsqueeze(1)
    ps = torch.tensor(top_ps, device=logits.device, dtype=logits.dtype).unsqueeze(1)
    masked = sorted_logits.masked_fill(drop, float("-inf"))
    cum = torch.softmax(masked, dim=-1).cumsum(dim=-1)
    drop |= (cum - torch.softmax(masked, dim=-1)) >= ps  # mass before this token already reaches top_p
    drop[:, 0] = False  # the most likely token always stays (a top_p that underflows to 0 included)
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)
