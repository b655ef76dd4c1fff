"""Exact block ids: allocation order, the free queue's eviction order, prefix-cache hits and eviction."""
from __future__ import annotations

from deployctl_runtime.block_pool import BlockPool
from deployctl_runtime.kv_cache_manager import KVCacheManager
from deployctl_runtime.request import Request
from deployctl_runtime.sampling_params import SamplingParams


def _req(rid: str, tokens: list[int]) -> Request:
    return Request(rid, tokens, SamplingParams(max_tokens=4))


def test_pool_allocates_from_head_and_frees_to_tail():
    pool = BlockPool(4)
    a = pool.get_new_blocks(2)
    assert [b.block_id for b in a] == [0, 1] and all(b.ref_cnt == 1 for b in a)
    assert pool.free_queue.block_ids() == [2, 3]
    pool.free_blocks(reversed(a))
    assert pool.free_queue.block_ids() == [2, 3, 1, 0]
    assert [b.block_id for b in pool.get_new_blocks(3)] == [2, 3, 1]
    assert pool.num_free_blocks == 1


def test_prefix_hit_reuses_exact_blocks_and_touch_removes_them_from_free_queue():
    kv = KVCacheManager(num_blocks=6, block_size=4)
    a = _req("a", list(range(10)))  # blocks [0, 1, 2]; the first two are full and cached
    hits, n = kv.get_computed_blocks(a)
    assert (hits, n) == ([], 0)
    kv.allocate_slots(a, 10)
    assert kv.get_block_ids("a") == [0, 1, 2]
    kv.free(a)
    assert kv.pool.free_queue.block_ids() == [3, 4, 5, 2, 1, 0]

    b = _req("b", list(range(8)) + [99, 98])  # same first 8 tokens
    hits, n = kv.get_computed_blocks(b)
    assert [blk.block_id for blk in hits] == [0, 1] and n == 8
    b.num_computed_tokens = 0
    kv.allocate_slots(b, 2, hits)
    assert kv.get_block_ids("b") == [0, 1, 3]
    assert kv.pool.free_queue.block_ids() == [4, 5, 2]


def test_full_prompt_hit_leaves_last_token_to_compute():
    kv = KVCacheManager(num_blocks=4, block_size=4)
    a = _req("a", list(range(8)))
    kv.allocate_slots(a, 8)
    kv.free(a)
    b = _req("b", list(range(8)))
    hits, n = kv.get_computed_blocks(b)
    assert [blk.block_id for blk in hits] == [0] and n == 4  # block 1 is recomputed for the last token's logits


def test_hit_compares_token_ids_not_only_position():
    kv = KVCacheManager(num_blocks=4, block_size=4)
    kv.allocate_slots(_req("a", [1, 2, 3, 4, 5]), 5)
    hits, _ = kv.get_computed_blocks(_req("b", [1, 2, 3, 5, 5]))
    assert hits == []


def test_eviction_takes_the_oldest_free_block_and_drops_its_hash():
    kv = KVCacheManager(num_blocks=3, block_size=2)
    a = _req("a", [1, 2, 3])
    kv.allocate_slots(a, 3)  # blocks [0, 1]; block 0 (tokens 1, 2) is full and cached
    kv.free(a)  # free queue, eviction order: [2, 1, 0]
    c = _req("c", [7, 8, 9])
    assert kv.get_computed_blocks(c) == ([], 0)
    kv.allocate_slots(c, 3)
    assert kv.get_block_ids("c") == [2, 1]  # the cached block 0 is kept: it is last in eviction order
    hits, n = kv.get_computed_blocks(_req("probe", [1, 2, 5]))
    assert [blk.block_id for blk in hits] == [0] and n == 2
    d = _req("d", [5])
    kv.allocate_slots(d, 1)
    assert kv.get_block_ids("d") == [0]  # evicted now
    assert kv.pool.blocks[0].block_hash is None
    assert kv.get_computed_blocks(_req("probe2", [1, 2, 5])) == ([], 0)


def test_allocate_returns_none_and_changes_nothing_when_pool_is_short():
    kv = KVCacheManager(num_blocks=3, block_size=4)
    a = _req("a", list(range(9)))
    assert kv.allocate_slots(a, 9) is not None
    b = _req("b", list(range(100, 105)))
    before = kv.pool.free_queue.block_ids()
    assert kv.allocate_slots(b, 5) is None
    assert kv.pool.free_queue.block_ids() == before and kv.get_block_ids("b") == []


def test_shared_block_is_freed_only_when_last_owner_leaves():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    a = _req("a", list(range(9)))
    kv.allocate_slots(a, 9)
    b = _req("b", list(range(9)))
    hits, n = kv.get_computed_blocks(b)
    kv.allocate_slots(b, 9 - n, hits)
    shared = kv.pool.blocks[0]
    assert shared.ref_cnt == 2 and kv.get_block_ids("b")[:2] == [0, 1]
    kv.free(a)
    assert shared.ref_cnt == 1 and 0 not in kv.pool.free_queue.block_ids()
    kv.free(b)
    assert shared.ref_cnt == 0 and kv.num_free_blocks == 8
