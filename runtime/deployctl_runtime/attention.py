"""Paged attention: write this step's K/V into the block-paged cache, then attend over each request's blocks.

Decodes (one query token each) take one of two paths, chosen by the model runner (meta.decode_kernel):
  * a kernel that reads K/V straight from the block table (no gather copy): on CUDA the Triton kernel in
    kernels/paged_attention.py (fixed-shape inputs, so a CUDA graph can capture it), on CPU the C kernel in
    kernels/cpu_paged_decode.c (float32, where the host can build it: kernels/cpu_kernels.py).
  * torch (the reference, and the fallback): batched gathers over the block tables, in groups of similar context
    length to limit padding; the gather indices and masks are built once per step and shared by every layer.
Prefill chunks run per request with scaled_dot_product_attention (flash / memory-efficient kernels on CUDA).

Cache layout per layer: [num_kv_heads, num_blocks * block_size, head_dim] (head-major, so that a gather over slot
indices yields [KVH, ..., L, D] directly, the layout attention wants, without another copy). Slot of token at
position p of a request: block_table[p // block_size] * block_size + p % block_size."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F


@dataclass
class PrefillChunk:
    start: int  # first token of the chunk in the flat batch
    end: int
    context_len: int  # tokens of the request attended to (computed before + this chunk)
    slots: torch.Tensor | None  # [context_len] cache slots of the whole context; None when the chunk is the context


@dataclass
class DecodeGroup:
    """Decodes [start, end) of the flat batch with similar context lengths, attended to in one batched call."""
    start: int
    end: int
    slots: torch.Tensor  # [(end - start) * context_len] cache slots, each context padded with slot 0
    context_len: int  # L: the group's longest context, rounded up to whole blocks
    mask: torch.Tensor  # [1, end - start, 1, L] bool, True where the slot belongs to the context
    # built by the first layer that attends and reused by the rest (the same for every layer of a step)
    rows: torch.Tensor | None = None  # [KVH * (end - start) * L] rows of a cache viewed as [KVH * num_slots, D]
    bias: torch.Tensor | None = None  # [1, end - start, 1, L] mask as 0 / -inf in the query dtype

    def cache_rows(self, num_kv_heads: int, num_slots: int) -> torch.Tensor:
        """Row of every (head, slot) pair in a [KVH, num_slots, D] cache flattened to [KVH * num_slots, D]: one
        index_select over dim 0 copies whole rows, about twice as fast on CPU as index_select over dim 1."""
        if self.rows is None or self.rows.numel() != num_kv_heads * self.slots.numel():
            heads = torch.arange(num_kv_heads, device=self.slots.device).unsqueeze(1) * num_slots
            self.rows = (heads + self.slots).flatten()
        return self.rows

    def attn_bias(self, dtype: torch.dtype) -> torch.Tensor:
        """The mask as an additive float bias (SDPA converts a bool mask to one on every call)."""
        if self.bias is None or self.bias.dtype != dtype:
            self.bias = torch.zeros(self.mask.shape, dtype=dtype, device=self.mask.device).masked_fill_(
                ~self.mask, float("-inf"))
        return self.bias


@dataclass
class AttentionMetadata:
    """Built once per step by the model runner, shared by every layer.

    Flat batch order: the num_decodes decode tokens first, then the prefill chunks. The kernel path
    (decode_kernel(q, k_cache, v_cache, block_tables, context_lens, scale, block_size) -> [n, H, D]) reads
    block_tables [num_decodes, W] int32 (rows padded with block 0) and context_lens [num_decodes] int32; the torch
    path reads decode_groups."""
    slot_mapping: torch.Tensor  # [T] cache slot of each token
    num_decodes: int = 0
    decode_groups: list[DecodeGroup] = field(default_factory=list)
    prefills: list[PrefillChunk] = field(default_factory=list)
    block_tables: torch.Tensor | None = None
    context_lens: torch.Tensor | None = None
    decode_kernel: Callable | None = None
    block_size: int = 16


def decode_group(start: int, tables: torch.Tensor, lens: list[int], block_size: int) -> DecodeGroup:
    """Gather indices and mask for decodes [start, start + len(lens)): tables [n, W] long (padded with block 0),
    lens the context length of each."""
    n, width = tables.shape
    dev = tables.device
    slots = (tables.unsqueeze(2) * block_size + torch.arange(block_size, device=dev)).flatten()
    valid = torch.arange(width * block_size, device=dev).unsqueeze(0) < torch.tensor(lens, device=dev).unsqueeze(1)
    return DecodeGroup(start, start + n, slots, width * block_size, valid[None, :, None, :])


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, meta: AttentionMetadata, scale: float, stored: bool = False
                    ) -> torch.Tensor:
    """q [T, H, D], k/v [T, KVH, D]; caches [KVH, num_slots, D]. Returns [T, H, D]. stored: k and v are already in
    the cache at meta.slot_mapping (the CPU path's rope_store put them there)."""
    if not stored:
        k_cache.index_copy_(1, meta.slot_mapping, k.transpose(0, 1))
        v_cache.index_copy_(1, meta.slot_mapping, v.transpose(0, 1))
    nd = meta.num_decodes
    if meta.decode_kernel is not None and nd:
        dec = meta.decode_kernel(q[:nd], k_cache, v_cache, meta.block_tables, meta.context_lens, scale,
                                 meta.block_size)
        if not meta.prefills:
            return dec
        out = torch.empty_like(q)
        out[:nd] = dec
    elif len(meta.decode_groups) == 1 and not meta.prefills:
        return decode_torch(q, k_cache, v_cache, meta.decode_groups[0], scale)
    else:
        out = torch.empty_like(q)
        for group in meta.decode_groups:
            out[group.start:group.end] = decode_torch(q[group.start:group.end], k_cache, v_cache, group, scale)
    for chunk in meta.prefills:
        out[chunk.start:chunk.end] = _prefill(q, k, v, k_cache, v_cache, chunk, scale)
    return out


def _prefill(q, k, v, k_cache, v_cache, chunk: PrefillChunk, scale: float) -> torch.Tensor:
    # 4-D inputs ([1, heads, tokens, D]): torch's CPU flash kernel takes them; 3-D falls back to the math path
    qs = q[chunk.start:chunk.end].transpose(0, 1).unsqueeze(0)  # [1, H, q, D]
    if chunk.slots is None:
        ks = k[chunk.start:chunk.end].transpose(0, 1).unsqueeze(0)
        vs = v[chunk.start:chunk.end].transpose(0, 1).unsqueeze(0)
        o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale, enable_gqa=True)
    else:
        ks = k_cache.index_select(1, chunk.slots).unsqueeze(0)  # [1, KVH, L, D]
        vs = v_cache.index_select(1, chunk.slots).unsqueeze(0)
        n_q, n_ctx = chunk.end - chunk.start, chunk.context_len
        rows = torch.arange(n_q, device=q.device).unsqueeze(1) + (n_ctx - n_q)
        mask = torch.arange(n_ctx, device=q.device).unsqueeze(0) <= rows
        o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=scale, enable_gqa=True)
    return o[0].transpose(0, 1)


def decode_torch(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, g: DecodeGroup,
                 scale: float) -> torch.Tensor:
    """One query per request: gather each request's context [KVH, n, L, Dh] and attend with grouped heads.
    q [n, H, Dh] -> [n, H, Dh]. The reference the Triton kernel is tested against."""
    n, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[0]
    group = num_heads // num_kv_heads
    shape = (num_kv_heads, n, g.context_len, head_dim)
    if k_cache.is_contiguous() and v_cache.is_contiguous():
        rows = g.cache_rows(num_kv_heads, k_cache.shape[1])
        ks = k_cache.view(-1, head_dim).index_select(0, rows).view(shape)
        vs = v_cache.view(-1, head_dim).index_select(0, rows).view(shape)
    else:
        ks = k_cache.index_select(1, g.slots).view(shape)
        vs = v_cache.index_select(1, g.slots).view(shape)
    qg = q.view(n, num_kv_heads, group, head_dim).transpose(0, 1)  # [KVH, n, G, Dh]
    o = F.scaled_dot_product_attention(qg, ks, vs, attn_mask=g.attn_bias(q.dtype), scale=scale)  # [KVH, n, G, Dh]
    return o.transpose(0, 1).reshape(n, num_heads, head_dim)
