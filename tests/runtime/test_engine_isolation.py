"""Fault isolation inside the engine (isolation.py): a forward that raises for one request's input is bisected down
to that request, which fails alone; the rest of the batch gets exactly the tokens of its solo run, also when it
shared prefix-cache blocks that the failed request was filling. A sticky CUDA error is fatal: no bisect."""
from __future__ import annotations

import pytest

from deployctl_runtime.engine import LLMEngine
from deployctl_runtime.engine_args import EngineArgs
from deployctl_runtime.isolation import EngineFatalError, is_fatal
from deployctl_runtime.sampling_params import SamplingParams
from deployctl_runtime.server.faults import Faults

POISON = 7  # token id the faulty forward raises on; no clean prompt holds it


def _engine(model, fault: str = "") -> LLMEngine:
    engine = LLMEngine.from_engine_args(EngineArgs(model=str(model), max_model_len=256, block_size=16,
                                                   num_gpu_blocks_override=64, max_num_seqs=8))
    Faults.from_env({"DEPLOYCTL_RUNTIME_FAULT": fault}).install(engine)
    return engine


def _run(engine: LLMEngine, prompts: dict[str, list[int]], max_tokens: int = 8) -> dict[str, tuple]:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for rid, prompt in prompts.items():
        engine.add_request(rid, prompt, params)
    tokens: dict[str, list[int]] = {rid: [] for rid in prompts}
    done: dict[str, tuple] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens[out.request_id].extend(out.new_token_ids)
            if out.finished:
                done[out.request_id] = (out.finish_reason, tokens[out.request_id], out.error)
    return done


CLEAN = {"a": list(range(100, 120)), "b": list(range(200, 205)), "c": list(range(300, 340))}


def test_a_poisoned_request_fails_alone_and_the_batch_matches_solo_runs(tiny_llama):
    solo = {rid: _run(_engine(tiny_llama), {rid: p})[rid] for rid, p in CLEAN.items()}
    assert all(POISON not in toks for _, toks, _ in solo.values())  # the fault never fires on a clean request
    engine = _engine(tiny_llama, f"raise_on_token={POISON}")
    done = _run(engine, {"a": CLEAN["a"], "bad": [50, 51, POISON, 52], "b": CLEAN["b"], "c": CLEAN["c"]})
    assert done["bad"][0] == "error" and done["bad"][1] == []
    assert "raise_on_token=7" in done["bad"][2] and "RuntimeError" in done["bad"][2]
    for rid in CLEAN:
        assert done[rid] == solo[rid], rid
    assert engine.kv.num_free_blocks == engine.kv.pool.num_blocks  # nothing leaked by the failed request
    # the engine goes on serving
    assert _run(engine, {"again": CLEAN["a"]})["again"] == solo["a"]


def test_a_request_sharing_the_blocks_the_failed_one_was_filling_is_recomputed(tiny_llama):
    # both arrive in one step; "reader" hits the two prefix blocks "bad" allocated (and cached) first in that step.
    # Run alone in the bisect, its prefill read those never-written blocks: its sample is dropped and it recomputes.
    prefix = list(range(400, 432))  # two full blocks
    reader = prefix + list(range(500, 510))
    solo = _run(_engine(tiny_llama), {"reader": reader})["reader"]
    engine = _engine(tiny_llama, f"raise_on_token={POISON}")
    done = _run(engine, {"bad": prefix + [POISON, 60], "reader": reader})
    assert done["bad"][0] == "error"
    assert done["reader"] == solo
    # the uncached blocks are not offered to a later request with that prefix either
    assert _run(engine, {"later": reader})["later"] == solo


def test_a_sticky_cuda_error_is_fatal_without_a_bisect(tiny_llama):
    engine = _engine(tiny_llama, f"cuda_error_on_token={POISON}")
    calls = []
    forward = engine.runner.forward
    engine.runner.forward = lambda inputs: (calls.append(1), forward(inputs))[1]
    engine.add_request("a", CLEAN["a"], SamplingParams(max_tokens=4))
    engine.add_request("bad", [POISON, 9], SamplingParams(max_tokens=4))
    with pytest.raises(EngineFatalError, match="CUDA error: an illegal memory access"):
        engine.step()
    assert len(calls) == 1  # no split retries on a poisoned device


@pytest.mark.parametrize("exc,fatal", [
    (RuntimeError("CUDA error: device-side assert triggered"), True),
    (RuntimeError("CUBLAS_STATUS_EXECUTION_FAILED when calling cublasGemmEx"), True),
    (type("AcceleratorError", (RuntimeError,), {})("whatever"), True),
    (RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"), False),  # a smaller batch may fit
    (ValueError("bad grammar"), False),
])
def test_which_errors_poison_the_device(exc, fatal):
    assert is_fatal(exc) is fatal
    assert is_fatal(RuntimeError("NPU hang: XYZ"), ["NPU hang"])
