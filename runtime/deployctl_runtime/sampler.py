"""Turn the last-position logits of each sampling request into one token id (and its logprob).

Order (as vLLM): min_tokens mask -> repetition/presence/frequency penalties -> greedy argmax, or temperature ->
top-k -> top-p -> a sample drawn with the request's own torch.Generator when it has a seed (so its tokens do not
depend on what else is in the batch). Sampling uses the exponential race: argmax(p / E) with E ~ Exp(1) picks index
i with probability p_i (the Gumbel-max trick in another form)."""
from __future__ import annotations

import torch

from deployctl_runtime.request import Request


class Sampler:
    def __init__(self, device: torch.device, seed: int = 0):
        self.device = device
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(seed)

    def __call__(self, logits: torch.Tensor, requests: list[Request]) -> tuple[list[int], list[float | None]]:
        """logits [N, V] float32 (one row per request, in order) -> (token ids, logprobs or None per request)."""
        want_logprobs = [r.params.logprobs is not None for r in requests]
        raw_logprobs = torch.log_softmax(logits, dim=-1) if any(want_logprobs) else None
        logits = self._apply_constraints(logits, requests)
        greedy = [r.params.is_greedy for r in requests]
        if all(greedy):
            tokens = logits.argmax(dim=-1)
        else:
            tokens = self._sample(logits, requests, greedy)
        token_list = tokens.tolist()
        if raw_logprobs is None:
            return token_list, [None] * len(requests)
        chosen = raw_logprobs.gather(1, tokens.unsqueeze(1)).squeeze(1).tolist()
        return token_list, [lp if want else None for lp, want in zip(chosen, want_logprobs)]

    def _apply_constraints(self, logits: torch.Tensor, requests: list[Request]) -> torch.Tensor:
        cloned = False
        for i, r in enumerate(requests):
            p = r.params
            needs_mask = r.num_output_tokens < p.min_tokens and r.stop_ids
            has_penalty = p.repetition_penalty != 1.0 or p.presence_penalty or p.frequency_penalty
            if not (needs_mask or has_penalty):
                continue
            if not cloned:
                logits, cloned = logits.clone(), True
            row = logits[i]
            if needs_mask:
                row[torch.tensor(sorted(r.stop_ids), device=row.device, dtype=torch.long)] = float("-inf")
            if p.repetition_penalty != 1.0:  # CTRL (Keskar et al. 2019) as HF applies it: prompt and output tokens
                seen = torch.tensor(r.all_token_ids, device=row.device, dtype=torch.long).unique()
                vals = row[seen]
                row[seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
            if (p.presence_penalty or p.frequency_penalty) and r.output_token_ids:  # OpenAI: output tokens only
                out = torch.tensor(r.output_token_ids, device=row.device, dtype=torch.long)
                counts = torch.bincount(out, minlength=row.shape[0]).to(row.dtype)
                row -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(row.dtype)
        return logits

    def _sample(self, logits: torch.Tensor, requests: list[Request], greedy: list[bool]) -> torch.Tensor:
        temps = torch.tensor([1.0 if g else r.params.temperature for r, g in zip(requests, greedy)],
                             device=logits.device, dtype=logits.dtype)
        scaled = logits / temps.unsqueeze(1)
        top_ks = [r.params.top_k for r in requests]
        top_ps = [r.params.top_p for r in requests]
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
                if r.generator is None:
                    r.generator = torch.Generator(device=probs.device)
                    r.generator.manual_seed(r.params.seed)
                noise[i].exponential_(generator=r.generator)
        sampled = (probs / noise).argmax(dim=-1)
        greedy_t = torch.tensor(greedy, device=logits.device)
        return torch.where(greedy_t, logits.argmax(dim=-1), sampled)


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
