"""KV cache blocks, the free queue in eviction order, and the prefix-hash cache. No torch.

Names follow vLLM's v1 core (KVCacheBlock, FreeKVCacheBlockQueue, BlockPool).
"""
from __future__ import annotations

import hashlib
import itertools
from array import array
from typing import Iterable, Sequence

DIGEST_BYTES = 32  # SHA-256


def block_digest(parent: bytes, token_ids: Sequence[int]) -> bytes:
    """Key of a full block: SHA-256 over the parent block's key and the block's token ids (int64 little-endian).

    The chain's root (the first block's parent) is `root_digest(...)`, which carries the per-process seed and the
    model identity, so keys differ across processes and models. Cost: one hashlib call per block (see
    bench/bench_prefix_hash.py)."""
    return hashlib.sha256(parent + array("q", token_ids).tobytes()).digest()


def root_digest(seed: bytes, identity: bytes) -> bytes:
    """The parent key of a request's first block: SHA-256 over a per-process random seed and what else changes
    the KV for the same token ids (model/weights identity and dtype; a LoRA or cache salt when added)."""
    return hashlib.sha256(b"deployctl-prefix-cache-v1\0" + seed + b"\0" + identity).digest()


class KVCacheBlock:
    """One block of block_size token slots. ref_cnt counts the requests using it; block_hash is set once the
    block is full and cached, and cleared when it is evicted."""

    __slots__ = ("block_id", "ref_cnt", "block_hash", "token_ids", "parent_serial", "serial", "prev_free",
                 "next_free")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: bytes | None = None
        self.token_ids: tuple[int, ...] = ()  # while cached: the block's tokens, compared on every hit
        self.parent_serial = 0  # while cached: serial of the cached parent block its KV was computed after (0: root)
        self.serial = 0  # while cached: unique per caching, so a chain never points at a since-evicted instance
        self.prev_free: KVCacheBlock | None = None
        self.next_free: KVCacheBlock | None = None

    def __repr__(self) -> str:
        return f"KVCacheBlock(id={self.block_id}, ref_cnt={self.ref_cnt}, cached={self.block_hash is not None})"


class FreeKVCacheBlockQueue:
    """Doubly linked list of free blocks (ref_cnt 0) in eviction order: the head is evicted first.

    O(1) popleft, append and remove from the middle (a cached free block hit by a new request)."""

    def __init__(self, blocks: list[KVCacheBlock]):
        self.num_free_blocks = len(blocks)
        self._head = KVCacheBlock(-1)
        self._tail = KVCacheBlock(-2)
        prev = self._head
        for block in blocks:
            prev.next_free, block.prev_free = block, prev
            prev = block
        prev.next_free, self._tail.prev_free = self._tail, prev

    def popleft(self) -> KVCacheBlock:
        block = self._head.next_free
        if block is self._tail:
            raise ValueError("no free blocks left")
        self.remove(block)
        return block

    def remove(self, block: KVCacheBlock) -> None:
        block.prev_free.next_free = block.next_free
        block.next_free.prev_free = block.prev_free
        block.prev_free = block.next_free = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        last = self._tail.prev_free
        last.next_free, block.prev_free = block, last
        block.next_free, self._tail.prev_free = self._tail, block
        self.num_free_blocks += 1

    def block_ids(self) -> list[int]:
        """Free block ids from head (next evicted) to tail."""
        out, block = [], self._head.next_free
        while block is not self._tail:
            out.append(block.block_id)
            block = block.next_free
        return out


class BlockPool:
    """All blocks of the KV cache, the free queue and the map from block hash to cached block.

    A block's key is `block_digest(parent key, token ids)` (SHA-256). A hit is verified against the whole chain, so
    even a forced digest collision cannot serve another prompt's KV: the cached block must hold the same token ids
    and must have been computed after exactly the cached parent instance the lookup matched before it (its
    `serial`), by induction from the root. Counting: prefix_cache_queries/hits are in tokens.
    """

    def __init__(self, num_blocks: int, enable_caching: bool = True):
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.free_queue = FreeKVCacheBlockQueue(self.blocks)
        self.cached: dict[bytes, KVCacheBlock] = {}
        self._serials = itertools.count(1)

    @property
    def num_free_blocks(self) -> int:
        return self.free_queue.num_free_blocks

    def get_cached_block(self, block_hash: bytes, token_ids: tuple[int, ...], parent_serial: int
                         ) -> KVCacheBlock | None:
        """The cached block for this key, only if it holds these token ids after the parent instance
        `parent_serial` (0 for a first block); None otherwise."""
        if not self.enable_caching:
            return None
        block = self.cached.get(block_hash)
        if block is None or block.token_ids != token_ids or block.parent_serial != parent_serial:
            return None
        return block

    def get_new_blocks(self, n: int) -> list[KVCacheBlock]:
        """Pop n free blocks from the head of the free queue (evicting their cached hash), ref_cnt = 1."""
        if n > self.free_queue.num_free_blocks:
            raise ValueError(f"cannot get {n} free blocks, only {self.free_queue.num_free_blocks} left")
        out = []
        for _ in range(n):
            block = self.free_queue.popleft()
            if block.block_hash is not None:
                del self.cached[block.block_hash]
                block.block_hash, block.token_ids, block.serial = None, (), 0
            block.ref_cnt = 1
            out.append(block)
        return out

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Take a reference on cache-hit blocks; a free one leaves the free queue."""
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_queue.remove(block)
            block.ref_cnt += 1

    def cache_full_block(self, block: KVCacheBlock, block_hash: bytes, token_ids: tuple[int, ...],
                         parent_serial: int) -> int | None:
        """Offer a full block to the cache. Returns the serial of the cached instance that now stands for this
        content (this block, or an equal one cached before), or None when the key is taken by different content
        (a digest collision): then none of the request's later blocks is cached either."""
        if not self.enable_caching:
            return None
        held = block if block.block_hash is not None else self.cached.get(block_hash)
        if held is not None:  # already cached (a hit), or the same key cached in another block: keep the first
            same = held.token_ids == token_ids and held.parent_serial == parent_serial
            return held.serial if same and held.block_hash == block_hash else None
        block.block_hash, block.token_ids, block.parent_serial = block_hash, token_ids, parent_serial
        block.serial = next(self._serials)
        self.cached[block_hash] = block
        return block.serial

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference on each block; blocks reaching 0 join the free-queue tail in the given order
        (callers pass a request's blocks tail first, so its last blocks are evicted before its prefix)."""
        for block in ordered_blocks:
            block.ref_cnt -= 1
            if block.ref_cnt < 0:
                raise RuntimeError(f"block {block.block_id} freed more often than allocated")
            if block.ref_cnt == 0:
                self.free_queue.append(block)

    def uncache(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Evict these blocks from the prefix cache (no later lookup finds them); ref counts are unchanged."""
        for block in blocks:
            if block.block_hash is not None and self.cached.get(block.block_hash) is block:
                del self.cached[block.block_hash]
            block.block_hash, block.token_ids, block.serial = None, (), 0

    def reset_prefix_cache(self) -> None:
        for block in self.cached.values():
            block.block_hash, block.token_ids, block.serial = None, (), 0
        self.cached.clear()
