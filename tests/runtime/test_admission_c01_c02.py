"""C01 (refusal at start when one max_model_len request cannot fit) and C02 (a request that can never fit does not
block the queue; requests that fit one at a time are served via preemption) at engine level."""
from __future__ import annotations

import random

import pytest

from deployctl_runtime import LLM, SamplingParams
from deployctl_runtime.engine import LLMEngine, RequestRejected
from deployctl_runtime.engine_args import EngineArgs


def test_c01_refuses_start_naming_both_numbers_and_the_largest_feasible_len(tiny_llama):
    with pytest.raises(ValueError) as err:
        LLMEngine.from_engine_args(EngineArgs(model=str(tiny_llama), max_model_len=4096, block_size=16,
                                              num_gpu_blocks_override=229, max_num_seqs=8))
    msg = str(err.value)
    # tiny llama: 2 layers x 2 KV heads x head_dim 16 x 2 (K, V) x 4 bytes (float32) = 512 bytes/token
    for fact in ("max_model_len 4096", "3664 tokens", "229 blocks", "block_size 16", "512 bytes/token",
                 "largest feasible max_model_len is 3664"):
        assert fact in msg, (fact, msg)


def test_c01_pool_from_cpu_budget_uses_the_shared_formula(tiny_llama):
    logs = []
    engine = LLMEngine.from_engine_args(EngineArgs(model=str(tiny_llama), max_model_len=1024,
                                                   kv_cache_memory=512 * 16 * 100 + 511), logs.append)
    assert engine.stats().num_gpu_blocks == 100  # floor(budget / (block_size x bytes/token))
    assert any("100 blocks x 16 tokens = 1600 tokens" in line and "1.56x" in line for line in logs)
    with pytest.raises(ValueError, match="largest feasible max_model_len is 1600"):
        LLMEngine.from_engine_args(EngineArgs(model=str(tiny_llama), max_model_len=2048,
                                              kv_cache_memory=512 * 16 * 100))


def _engine(tiny_llama) -> LLMEngine:
    # C02's replay pool (block_size 16, 50 blocks = 800 tokens); max_model_len 800 so C01 lets it start
    return LLMEngine.from_engine_args(EngineArgs(model=str(tiny_llama), max_model_len=800, block_size=16,
                                                 num_gpu_blocks_override=50))


def test_c02_request_that_can_never_fit_is_rejected_at_admission(tiny_llama):
    engine = _engine(tiny_llama)
    with pytest.raises(RequestRejected) as err:
        engine.add_request("huge", [5] * 801, SamplingParams(max_tokens=5))
    assert err.value.reason == "context_length_exceeded"
    assert "800" in err.value.message and "801" in err.value.message
    assert engine.stats().num_free_blocks == 50 and not engine.has_unfinished_requests()
    engine.add_request("small", [5, 6, 7], SamplingParams(max_tokens=5, ignore_eos=True))
    outs = []
    while engine.has_unfinished_requests():
        outs += engine.step()
    assert [o.finish_reason for o in outs if o.finished] == ["length"]


def test_c02_requests_that_fit_one_at_a_time_are_served_by_preemption(tiny_llama):
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 1000) for _ in range(380)] for _ in range(5)]
    params = SamplingParams(max_tokens=50, temperature=0, ignore_eos=True)
    alone = LLM(str(tiny_llama), max_model_len=800, num_gpu_blocks_override=200).generate(prompts, params)

    engine = _engine(tiny_llama)
    for i, p in enumerate(prompts):
        engine.add_request(f"big{i}", p, params)
    engine.add_request("hello", [42, 43], SamplingParams(max_tokens=5, ignore_eos=True))
    tokens = {}
    finished = {}
    max_big_running = 0
    for _ in range(2000):
        if not engine.has_unfinished_requests():
            break
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
            if out.finished:
                finished[out.request_id] = out.finish_reason
        running = [r.request_id for r in engine.scheduler.running]
        max_big_running = max(max_big_running, sum(r.startswith("big") for r in running))
    assert not engine.has_unfinished_requests(), "deadlock: requests left after 2000 steps"
    assert finished == {**{f"big{i}": "length" for i in range(5)}, "hello": "length"}
    assert len(tokens["hello"]) == 5
    for i in range(5):
        assert tokens[f"big{i}"] == alone[i].token_ids  # recompute after preemption gives the same tokens
    stats = engine.stats()
    assert stats.num_preemptions_total > 0 and max_big_running <= 2
    assert stats.num_free_blocks == 50 and stats.num_running == 0 and stats.num_waiting == 0


def test_abort_frees_blocks_at_once_and_reports_abort(tiny_llama):
    engine = _engine(tiny_llama)
    engine.add_request("a", list(range(3, 100)), SamplingParams(max_tokens=100, ignore_eos=True))
    engine.step()
    assert engine.stats().num_free_blocks < 50
    engine.abort_request(["a", "unknown"])
    assert engine.stats().num_free_blocks == 50
    outs = engine.step()
    assert [(o.request_id, o.finished, o.finish_reason) for o in outs] == [("a", True, "abort")]
    assert not engine.has_unfinished_requests()


def test_add_request_validates(tiny_llama):
    engine = _engine(tiny_llama)
    with pytest.raises(ValueError, match="top_p"):
        engine.add_request("x", [1, 2], SamplingParams(top_p=0))
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 1024\)"):
        engine.add_request("x", [1, 5000], SamplingParams())
    engine.add_request("x", [1, 2], SamplingParams())
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request("x", [1, 2], SamplingParams())
