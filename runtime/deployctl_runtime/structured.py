"""Structured output: grammars enforced while decoding, through llguidance's token bitmask.

Why llguidance (over xgrammar and outlines-core): a self-contained Rust wheel with no Python dependencies (xgrammar
pulls torch, transformers, ninja and more; outlines-core builds a whole-vocabulary index per schema up front), it
computes each token mask on the CPU in tens of microseconds without a per-schema compile step, reads the
`tokenizer.json` the runtime already has, and its mask is a plain int32 bitmask that we apply with two torch ops
on whatever device the logits are on (CPU or CUDA), so the same code runs on both. It is the backend vLLM and
SGLang ship for JSON schema, Lark and regex grammars.

A request carries `SamplingParams.structured_outputs`; the sampler asks `apply_bitmask` for the allowed tokens of
each constrained row before sampling and `accept` advances each request's matcher by its chosen token. JSON output
is compact (no free whitespace): a random or weak model otherwise fills max_tokens with spaces.
"""
from __future__ import annotations

import json
import weakref
from typing import Any

from deployctl_runtime.sampling_params import StructuredOutputsParams

JSON_OPTIONS = {"whitespace_flexible": False}


def grammar_for(spec: StructuredOutputsParams) -> str:
    """The llguidance grammar (JSON text) for a spec. Raises ValueError naming what is wrong with the schema or
    grammar (checked without a tokenizer, so the HTTP layer can answer 400 before generation)."""
    try:
        import llguidance
    except ImportError:  # pragma: no cover - a runtime dependency; only a broken install lacks it
        raise ValueError("structured output needs the llguidance package (pip install llguidance)") from None
    try:
        if spec.lark is not None:
            grammar = llguidance.LLMatcher.grammar_from_lark(spec.lark)
        else:
            schema: Any = {"type": "object"} if spec.json_object else spec.json
            if isinstance(schema, str):
                schema = json.loads(schema)
            if not isinstance(schema, dict):
                raise ValueError("the JSON schema must be a JSON object")
            grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"not a usable schema or grammar: {exc}") from None
    error = llguidance.LLMatcher.validate_grammar(grammar)
    if error:
        raise ValueError(f"not a usable schema or grammar: {error}")
    return grammar


class StructuredOutputs:
    """Per-engine: the llguidance tokenizer (built on first use) and one matcher per constrained request, keyed
    weakly by the Request. `vocab_size` is the model's logits width; `eos_ids` end the output once the grammar is
    complete."""

    def __init__(self, tokenizer, vocab_size: int, eos_ids):
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_ids = sorted(eos_ids)
        self._ll = None
        self._matchers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def check(self, spec: StructuredOutputsParams) -> None:
        """Raise ValueError("structured_outputs: ...") for a schema or grammar that cannot be used."""
        try:
            grammar_for(spec)
        except ValueError as exc:
            raise ValueError(f"structured_outputs: {exc}") from None

    def _ll_tokenizer(self):
        if self._ll is None:
            import llguidance

            n_vocab = max(self.vocab_size, self._tokenizer.get_vocab_size(with_added_tokens=True))
            self._ll = llguidance.LLTokenizer(self._tokenizer.to_str(), n_vocab=n_vocab,
                                              eos_token=self.eos_ids or None)
        return self._ll

    def _matcher(self, request):
        m = self._matchers.get(request)
        if m is None:
            import llguidance

            grammar = grammar_for(request.params.structured_outputs)
            m = self._matchers[request] = llguidance.LLMatcher(self._ll_tokenizer(), grammar, log_level=0)
        return m

    def apply_bitmask(self, logits, requests) -> None:
        """Set to -inf, in place, the logits of every token the grammar does not allow next (rows of constrained
        requests only). logits: [N, V] tensor, any device."""
        import torch

        rows = [i for i, r in enumerate(requests) if r.params.structured_outputs is not None]
        masks = b"".join(self._matcher(requests[i]).compute_bitmask() for i in rows)
        words = torch.frombuffer(bytearray(masks), dtype=torch.int32).view(len(rows), -1).to(logits.device)
        shifts = torch.arange(32, dtype=torch.int32, device=logits.device)
        allowed = ((words.unsqueeze(-1) >> shifts) & 1).view(len(rows), -1)[:, : logits.shape[1]].bool()
        broken = [k for k, i in enumerate(rows) if self._matcher(requests[i]).is_error()]
        if broken and self.eos_ids:  # a matcher in error (it cannot say what is valid) may only end the output
            allowed[broken] = False
            allowed[torch.tensor(broken, device=logits.device).unsqueeze(1),
                    torch.tensor(self.eos_ids, device=logits.device).unsqueeze(0)] = True
        idx = torch.tensor(rows, device=logits.device)
        logits[idx] = logits[idx].masked_fill(~allowed, float("-inf"))

    def accept(self, requests, tokens: list[int]) -> list[str | None]:
        """Advance each constrained request's matcher by its sampled token. Returns, per request, None or why its
        matcher raised (that request alone ends with an error; the others' matchers have advanced once)."""
        errors: list[str | None] = []
        for r, t in zip(requests, tokens):
            err = None
            if r.params.structured_outputs is not None:
                try:
                    self._matcher(r).consume_token(t)
                except Exception as exc:  # noqa: BLE001 - one request's grammar fails that request alone
                    err = f"the grammar matcher raised for this request: {type(exc).__name__}: {exc}"
            errors.append(err)
        return errors
