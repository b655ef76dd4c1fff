"""structured.py on its own: schema errors are ValueErrors, the bitmask allows exactly what the grammar allows, and a
matcher driven into error may only end the output (never a row of all -inf)."""
from __future__ import annotations

import pytest
import torch

from deployctl_runtime.request import Request
from deployctl_runtime.sampling_params import SamplingParams, StructuredOutputsParams
from deployctl_runtime.structured import StructuredOutputs, grammar_for
from deployctl_runtime.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def so(tiny_llama):
    tok = load_tokenizer(tiny_llama)
    return StructuredOutputs(tok.tokenizer, 1024, tok.eos_token_ids), tok


def test_unusable_schema_is_a_value_error():
    with pytest.raises(ValueError, match="/nope"):
        grammar_for(StructuredOutputsParams(json={"type": "object", "properties": {"a": {"$ref": "#/nope"}}}))
    with pytest.raises(ValueError, match="JSON object"):
        grammar_for(StructuredOutputsParams(json="[1]"))


def test_bitmask_allows_the_grammar_and_a_broken_matcher_only_eos(so):
    structured, tok = so
    r = Request("r", [5], SamplingParams(structured_outputs=StructuredOutputsParams(json={"enum": ["true"]})))
    plain = Request("p", [5], SamplingParams())
    logits = torch.zeros(2, 1024)
    structured.apply_bitmask(logits, [r, plain])
    allowed = (logits[0] == 0).nonzero().flatten().tolist()
    assert allowed and all(tok.tokenizer.decode([t]) in '"true"' for t in allowed)
    assert (logits[1] == 0).all()  # an unconstrained row is untouched
    structured.accept([r], [tok.tokenizer.token_to_id("<|im_start|>")])  # not valid JSON: the matcher errors
    logits = torch.zeros(1, 1024)
    structured.apply_bitmask(logits, [r])
    assert sorted((logits[0] == 0).nonzero().flatten().tolist()) == sorted(tok.eos_token_ids)
