"""Extreme but valid sampling settings through the offline API (found while attacking the HTTP server).

Temperatures below 1e-5 are greedy; the most likely token survives any top_p; a top_k beyond the vocabulary
is off (the HTTP server also clamps it: tests/runtime/server/test_server_edge_cases.py)."""
from __future__ import annotations

import pytest

from deployctl_runtime import LLM, SamplingParams

PROMPT = "hello there"


@pytest.fixture(scope="module")
def llm(tiny_llama):
    return LLM(str(tiny_llama), max_model_len=128, num_gpu_blocks_override=32)


@pytest.fixture(scope="module")
def greedy_ids(llm):
    return llm.generate([PROMPT], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))[0].token_ids


@pytest.mark.parametrize("temperature", [1e-300, 1e-40])
def test_tiny_temperature_samples_like_greedy(llm, greedy_ids, temperature):
    out = llm.generate([PROMPT], SamplingParams(max_tokens=6, temperature=temperature, seed=1, ignore_eos=True))[0]
    assert out.token_ids == greedy_ids


@pytest.mark.parametrize("top_p", [1e-300, 1e-46])
def test_tiny_top_p_keeps_the_most_likely_token(llm, greedy_ids, top_p):
    out = llm.generate([PROMPT], SamplingParams(max_tokens=6, temperature=1.0, top_p=top_p, seed=1,
                                                ignore_eos=True))[0]
    assert out.token_ids == greedy_ids


def test_top_k_beyond_the_vocabulary_is_off(llm):
    params = dict(max_tokens=4, temperature=1.0, seed=3, ignore_eos=True)
    off = llm.generate([PROMPT], SamplingParams(top_k=-1, **params))[0]
    huge = llm.generate([PROMPT], SamplingParams(top_k=2**70, **params))[0]
    assert huge.token_ids == off.token_ids
