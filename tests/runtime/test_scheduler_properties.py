"""Block accounting invariants under random mixes of add, abort and step (hypothesis), on the torch-free
scheduler with a fake model that samples a token for every request reaching its last token."""
from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import HealthCheck, given, settings

from deployctl_runtime.kv_cache_manager import KVCacheManager
from deployctl_runtime.outputs import ModelRunnerOutput
from deployctl_runtime.request import Request, RequestStatus, SampledToken
from deployctl_runtime.sampling_params import SamplingParams
from deployctl_runtime.scheduler import Scheduler

BLOCK_SIZE = 4
MAX_MODEL_LEN = 48


def check_invariants(sched: Scheduler) -> None:
    kv = sched.kv
    pool = kv.pool
    owners: dict[int, int] = {}
    for rid, blocks in kv.req_to_blocks.items():
        ids = [b.block_id for b in blocks]
        assert len(ids) == len(set(ids)), f"{rid} holds a block twice: {ids}"
        for i in ids:
            owners[i] = owners.get(i, 0) + 1
        req = sched.requests[rid]
        assert req.status == RequestStatus.RUNNING, f"{rid} holds blocks while {req.status}"
        assert len(blocks) * BLOCK_SIZE >= req.num_computed_tokens
    free_ids = pool.free_queue.block_ids()
    assert len(free_ids) == len(set(free_ids)) == pool.num_free_blocks
    for block in pool.blocks:
        assert block.ref_cnt == owners.get(block.block_id, 0), f"block {block.block_id} ref_cnt {block.ref_cnt}"
        assert (block.ref_cnt == 0) == (block.block_id in set(free_ids))
    for key, block in pool.cached.items():
        assert block.block_hash == key
    for req in sched.running:
        assert req.request_id in kv.req_to_blocks or req.num_computed_tokens == 0
    for req in sched.waiting:
        assert req.request_id not in kv.req_to_blocks


def fake_step(sched: Scheduler, token: int) -> None:
    out = sched.schedule()
    assert out.num_batched_tokens <= sched.max_num_batched_tokens
    assert len(sched.running) <= sched.max_num_seqs
    result = ModelRunnerOutput()
    for item in out.scheduled:
        assert item.num_scheduled_tokens >= 1
        assert len(item.block_ids) * BLOCK_SIZE >= item.request.num_computed_tokens + item.num_scheduled_tokens
        if item.samples:
            result.sampled[item.request.request_id] = SampledToken(token)
    sched.update_from_output(out, result)


ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.lists(st.integers(0, 3), min_size=1, max_size=30), st.integers(1, 12)),
        st.tuples(st.just("abort"), st.integers(0, 40)),
        st.tuples(st.just("step"), st.integers(0, 3)),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops, num_blocks=st.integers(12, 40), budget=st.integers(3, 64), max_seqs=st.integers(1, 6),
       caching=st.booleans())
def test_blocks_all_return_and_no_block_is_owned_twice(ops, num_blocks, budget, max_seqs, caching):
    kv = KVCacheManager(num_blocks, BLOCK_SIZE, enable_caching=caching)
    sched = Scheduler(kv, max_num_seqs=max_seqs, max_num_batched_tokens=budget, max_model_len=MAX_MODEL_LEN)
    ids = []
    for op in ops:
        if op[0] == "add":
            # the pool always holds one max_model_len request (the engine refuses to start otherwise, C01)
            prompt = [t + 10 for t in op[1]]
            rid = f"r{len(ids)}"
            sched.add_request(Request(rid, prompt, SamplingParams(max_tokens=op[2], ignore_eos=True)))
            ids.append(rid)
        elif op[0] == "abort" and ids:
            req = sched.requests.get(ids[op[1] % len(ids)])
            if req is not None:
                sched.finish(req, "abort")
        else:
            fake_step(sched, op[1])
        check_invariants(sched)
    for _ in range(2000):
        if not sched.has_unfinished_requests():
            break
        fake_step(sched, 1)
        check_invariants(sched)
    assert not sched.has_unfinished_requests(), "requests left unfinished: a deadlock"
    assert kv.num_free_blocks == num_blocks
    assert all(b.ref_cnt == 0 for b in kv.pool.blocks)
    assert kv.req_to_blocks == {}


def test_preemption_requeues_newest_at_head_and_recomputes_from_zero():
    kv = KVCacheManager(num_blocks=4, block_size=BLOCK_SIZE)
    sched = Scheduler(kv, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=16)
    a = Request("a", list(range(8)), SamplingParams(max_tokens=8, ignore_eos=True))
    b = Request("b", list(range(20, 27)), SamplingParams(max_tokens=8, ignore_eos=True))
    sched.add_request(a)
    sched.add_request(b)
    fake_step(sched, 1)  # a: 8 tokens -> 2 blocks; b: 7 -> 2 blocks; pool full
    assert [r.request_id for r in sched.running] == ["a", "b"]
    fake_step(sched, 1)  # a needs a 3rd block for token 9: b (newest) is preempted
    assert [r.request_id for r in sched.running] == ["a"]
    assert list(sched.waiting) == [b] and b.num_computed_tokens == 0 and b.num_preemptions == 1
    assert b.all_token_ids == list(range(20, 27)) + [1]  # its sampled token is kept and recomputed
    assert sched.num_preemptions_total == 1


def test_prefix_cache_counters_count_each_admitted_request_once_in_tokens():
    kv = KVCacheManager(num_blocks=8, block_size=BLOCK_SIZE)
    sched = Scheduler(kv, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=32)
    a = Request("a", list(range(10, 26)), SamplingParams(max_tokens=2, ignore_eos=True))  # 16 tokens, 4 blocks
    sched.add_request(a)
    fake_step(sched, 1)
    b = Request("b", list(range(10, 22)) + [99, 98, 97, 96, 95, 94, 93, 92, 91, 90, 89, 88, 87],
                SamplingParams(max_tokens=2, ignore_eos=True))  # 25 tokens: shares 3 blocks, needs 4 more
    sched.add_request(b)
    fake_step(sched, 1)  # a holds 5 blocks (17 tokens + 1 slot), b needs 4 new: only 3 free, b waits
    assert b.status == RequestStatus.WAITING
    while sched.has_unfinished_requests():
        fake_step(sched, 1)
    assert kv.prefix_cache_queries == 16 + 25  # b's repeated lookups while waiting count once
    assert kv.prefix_cache_hits == 12 and b.num_cached_tokens == 12
