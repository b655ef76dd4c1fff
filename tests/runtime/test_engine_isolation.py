"""Fault isolation inside the engine (isolation.py): a forward that raises for one request's input is bisected down
to that request, which fails alone; the rest of the batch gets exactly the tokens of its solo run, also when it
shared prefix-cache blocks that the failed request was filling. A sticky CUDA error is fatal: no bisect."""
from __future__ import annotations

import pytest

from deployctl_runtime.engine import LLMEngine
from deployctl_runtime.engine_args import EngineArgs
from deployctl_runtime.isolation import EngineFatalError, execute_isolating, is_fatal, max_step_retries
from deployctl_runtime.outputs import ModelRunnerOutput, ScheduledRequest
from deployctl_runtime.request import Request
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


def _fake_batch(n: int, poisoned: set[int]):
    """n scheduled requests and a forward that raises when its batch holds one of `poisoned` (by position)."""
    items = [ScheduledRequest(Request(f"r{i}", [1], SamplingParams()), 1, []) for i in range(n)]
    bad = {items[i].request.request_id for i in poisoned}
    calls = []

    def execute(sched):
        ids = [i.request.request_id for i in sched.scheduled]
        calls.append(ids)
        if bad & set(ids):
            raise RuntimeError(f"poisoned: {sorted(bad & set(ids))}")
        return ModelRunnerOutput({rid: rid for rid in ids})
    return items, execute, calls


@pytest.mark.parametrize("n", range(1, 17))
def test_one_culprit_costs_at_most_ceil_log2_n_plus_1_extra_forwards(n):
    bound = max_step_retries(n)
    assert bound == (0 if n == 1 else __import__("math").ceil(__import__("math").log2(n))) + 1
    for pos in range(n):
        items, execute, calls = _fake_batch(n, {pos})
        iso = execute_isolating(execute, items)
        assert [i.request.request_id for i, _ in iso.failed] == [f"r{pos}"]
        assert iso.num_retries == len(calls) - 1 <= bound, (n, pos, calls)
        assert not iso.deferred and not iso.unresolved_by_budget
        assert sorted(iso.output.sampled) == sorted(f"r{i}" for i in range(n) if i != pos)  # each good one once
        ran = [rid for c in calls[1:] for rid in c if all(f"r{pos}" != x for x in c)]
        assert len(ran) == len(set(ran))  # no clean request ran twice
    assert max_step_retries(9) == 5  # the batch of 9: a plain bisect took 6


def test_two_culprits_stay_within_the_bound_and_the_rest_is_deferred_not_failed():
    for n in range(2, 17):
        for a in range(n):
            for b in range(a + 1, n):
                items, execute, calls = _fake_batch(n, {a, b})
                iso = execute_isolating(execute, items)
                assert iso.num_retries == len(calls) - 1 <= max_step_retries(n)
                failed = {i.request.request_id for i, _ in iso.failed}
                deferred = {i.request.request_id for i in iso.deferred}
                assert failed and failed <= {f"r{a}", f"r{b}"}  # nothing failed that did not raise
                assert failed | deferred | set(iso.output.sampled) == {f"r{i}" for i in range(n)}
                assert not failed & deferred and not (failed | deferred) & set(iso.output.sampled)


def test_the_budget_lowers_the_bound_and_what_it_leaves_fails():
    items, execute, calls = _fake_batch(8, {7})
    iso = execute_isolating(execute, items, budget=2)
    assert iso.num_retries == len(calls) - 1 == 2
    assert [i.request.request_id for i in iso.unresolved_by_budget] == ["r6", "r7"] and not iso.deferred
    iso = execute_isolating(_fake_batch(8, {7})[1], items, budget=0)
    assert iso.num_retries == 0 and len(iso.unresolved_by_budget) == 8


def test_the_engine_counts_its_retries_in_batches_of_2_to_16(tiny_llama):
    engine = LLMEngine.from_engine_args(EngineArgs(model=str(tiny_llama), max_model_len=64, block_size=16,
                                                   num_gpu_blocks_override=128, max_num_seqs=16))
    Faults.from_env({"DEPLOYCTL_RUNTIME_FAULT": f"raise_on_token={POISON}"}).install(engine)
    engine.max_step_retries_per_min = 10**6  # the per-minute budget: its own test below
    forward = engine.runner.forward
    calls = []
    engine.runner.forward = lambda inputs: (calls.append(1), forward(inputs))[1]
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    total = 0
    for n in range(2, 17):
        for pos in (0, n // 2, n - 1):
            ids = [f"n{n}p{pos}r{i}" for i in range(n)]
            for i, rid in enumerate(ids):
                engine.add_request(rid, [50, 51, POISON, 52] if i == pos else [100 + i, 101 + i, 102], params)
            calls.clear()
            outs = {o.request_id: o for o in engine.step()}  # one prefill step of all n: it raises, is isolated
            assert len(calls) - 1 <= max_step_retries(n), (n, pos, len(calls))
            total += len(calls) - 1
            assert engine.stats().step_retries_total == engine.num_step_retries_total == total
            assert outs[ids[pos]].finish_reason == "error" and "raise_on_token" in outs[ids[pos]].error
            assert all(len(outs[r].new_token_ids) == 1 for r in ids if r != ids[pos])  # the others got their token
            engine.abort_request(ids)
            engine.step()
    assert total > 0


def test_a_spent_per_minute_budget_fails_the_unresolved_requests(tiny_llama):
    engine = _engine(tiny_llama, f"raise_on_token={POISON}")
    engine.max_step_retries_per_min = 1
    done = _run(engine, {"a": CLEAN["a"], "b": CLEAN["b"], "c": CLEAN["c"], "bad": [50, 51, POISON, 52]})
    assert engine.num_step_retries_total == 1  # one re-run (a, b: clean), then the budget is spent
    assert done["bad"][0] == "error" and done["c"][0] == "error" and "budget" in done["c"][2]
    assert done["a"][0] == done["b"][0] == "length"
