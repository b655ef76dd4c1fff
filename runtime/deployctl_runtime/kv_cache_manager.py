"""Which blocks each request holds; prefix-cache lookups; allocation for the next step. No torch."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from deployctl_runtime import block_pool
from deployctl_runtime.block_pool import BlockPool, KVCacheBlock
from deployctl_runtime.request import Request

_PROCESS_SEED = os.urandom(32)  # prefix-cache keys are never the same across processes


def model_identity(model_dir: str | Path, dtype: str) -> bytes:
    """What besides token ids decides a block's KV: the weights (manifest.sha256 when present, else config.json and
    the weight files' names, sizes and mtimes) and the dtype. Returns bytes for `root_digest`."""
    root = Path(model_dir).resolve()
    h = hashlib.sha256(str(root).encode() + b"\0" + dtype.encode())
    manifest = root / "manifest.sha256"
    if manifest.is_file():
        h.update(manifest.read_bytes())
    else:
        for p in sorted(root.glob("*.json")) + sorted(root.glob("*.safetensors")):
            st = p.stat()
            h.update(f"{p.name}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    return h.digest()


class KVCacheManager:
    """Owns the block table of every running request (request_id -> blocks in order).

    Invariant: a request holding blocks has exactly ceil(tokens with slots / block_size) of them; each block it
    holds has ref_cnt >= 1; free blocks (ref_cnt 0) are in the pool's free queue and in no block table.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True, identity: bytes = b""):
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.pool = BlockPool(num_blocks, enable_caching)
        self.root_key = block_pool.root_digest(_PROCESS_SEED, identity)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        # request_id -> per leading block offered to the cache: the serial of the cached instance standing for it
        # (None after a digest collision: nothing after it is cached)
        self.chain_serials: dict[str, list[int | None]] = {}
        self.prefix_cache_queries = 0  # tokens looked up
        self.prefix_cache_hits = 0  # tokens found

    def reset(self) -> None:
        """A fresh pool of the same size: every block free, the prefix cache empty (after a sleep, whose KV is gone).
        Only while no request holds blocks; the prefix-cache counters keep counting."""
        if self.req_to_blocks:
            raise RuntimeError(f"{len(self.req_to_blocks)} request(s) still hold KV blocks")
        self.pool = BlockPool(self.pool.num_blocks, self.enable_caching)
        self.chain_serials.clear()

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def usage(self) -> float:
        n = self.pool.num_blocks
        return 0.0 if n == 0 else 1.0 - self.pool.num_free_blocks / n

    def _update_block_hashes(self, request: Request) -> None:
        """Extend the request's hash chain over its full blocks: key = block_digest(parent key, token ids)."""
        bs, hashes, tokens = self.block_size, request.block_hashes, request.all_token_ids
        parent = hashes[-1] if hashes else self.root_key
        for i in range(len(hashes), len(tokens) // bs):
            parent = block_pool.block_digest(parent, tokens[i * bs:(i + 1) * bs])
            hashes.append(parent)

    def _block_tokens(self, request: Request, i: int) -> tuple[int, ...]:
        return tuple(request.all_token_ids[i * self.block_size:(i + 1) * self.block_size])

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """Longest run of cached full blocks matching the request's prefix, and the tokens they cover.

        At least one token is always left to compute (its logits are needed to sample)."""
        if not self.enable_caching:
            return [], 0
        self._update_block_hashes(request)
        max_hit_blocks = (request.num_tokens - 1) // self.block_size
        hits: list[KVCacheBlock] = []
        parent_serial = 0
        for i, key in enumerate(request.block_hashes[:max_hit_blocks]):
            block = self.pool.get_cached_block(key, self._block_tokens(request, i), parent_serial)
            if block is None:
                break
            hits.append(block)
            parent_serial = block.serial
        return hits, len(hits) * self.block_size

    def record_prefix_query(self, num_tokens: int, num_hit_tokens: int) -> None:
        """Count one admitted request's lookup (tokens), once, however many steps it waited."""
        if self.enable_caching:
            self.prefix_cache_queries += num_tokens
            self.prefix_cache_hits += num_hit_tokens

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       new_computed_blocks: list[KVCacheBlock] | None = None) -> list[KVCacheBlock] | None:
        """Make room for `num_new_tokens` more tokens after the computed ones (including `new_computed_blocks`,
        prefix-cache hits just found). Returns the newly allocated blocks, or None (and changes nothing) when the
        pool cannot supply them. Full blocks are cached as soon as their token ids are known."""
        new_computed_blocks = new_computed_blocks or []
        blocks = self.req_to_blocks.get(request.request_id, [])
        num_computed = request.num_computed_tokens + len(new_computed_blocks) * self.block_size
        num_needed = -(-(num_computed + num_new_tokens) // self.block_size)
        num_new_blocks = num_needed - len(blocks) - len(new_computed_blocks)
        num_evictable_hits = sum(1 for b in new_computed_blocks if b.ref_cnt == 0)
        if num_new_blocks > self.pool.num_free_blocks - num_evictable_hits:
            return None
        if new_computed_blocks:
            self.pool.touch(new_computed_blocks)
        blocks = self.req_to_blocks.setdefault(request.request_id, blocks)
        blocks.extend(new_computed_blocks)
        new_blocks = self.pool.get_new_blocks(num_new_blocks) if num_new_blocks > 0 else []
        blocks.extend(new_blocks)
        if self.enable_caching:
            self._update_block_hashes(request)
            num_full = min(num_computed + num_new_tokens, request.num_tokens) // self.block_size
            chain = self.chain_serials.setdefault(request.request_id, [])
            for i in range(len(chain), num_full):
                parent = chain[i - 1] if i else 0
                chain.append(None if parent is None else self.pool.cache_full_block(
                    blocks[i], request.block_hashes[i], self._block_tokens(request, i), parent))
        return new_blocks

    def uncache(self, blocks) -> None:
        """Take these blocks out of the prefix cache (their KV cannot be trusted, e.g. the step filling them
        failed); they stay allocated to whoever holds them."""
        self.pool.uncache(blocks)

    def free(self, request: Request) -> None:
        """Release the request's blocks, tail first, so its last blocks are evicted before its shared prefix."""
        blocks = self.req_to_blocks.pop(request.request_id, None)
        self.chain_serials.pop(request.request_id, None)
        if blocks:
            self.pool.free_blocks(reversed(blocks))

    def get_block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self.req_to_blocks.get(request_id, ())]
