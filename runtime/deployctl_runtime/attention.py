"""Paged attention in plain torch: write this step's K/V into the block-paged cache, then attend over each
request's blocks. Decodes (one query token each) run as one batched gather over their block tables; prefill
chunks run per request with scaled_dot_product_attention.

Cache layout per layer: [num_kv_heads, num_blocks * block_size, head_dim] (head-major, so that a gather over slot
indices yields [KVH, ..., L, D] directly, the layout attention wants, without another copy). Slot of token at
position p of a request: block_table[p // block_size] * block_size + p % block_size."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


@dataclass
class PrefillChunk:
    start: int  # first token of the chunk in the flat batch
    end: int
    context_len: int  # tokens of the request attended to (computed before + this chunk)
    slots: torch.Tensor | None  # [context_len] cache slots of the whole context; None when the chunk is the context


@dataclass
class AttentionMetadata:
    """Built once per step by the model runner, shared by every layer.

    Flat batch order: the num_decodes decode tokens first, then the prefill chunks."""
    slot_mapping: torch.Tensor  # [T] cache slot of each token
    num_decodes: int = 0
    decode_slots: torch.Tensor | None = None  # [D * L] slots of each decode's context, padded to L with slot 0
    decode_len: int = 0  # L: the longest decode context, rounded up to whole blocks
    decode_mask: torch.Tensor | None = None  # [1, D, 1, L] bool, True where the slot is part of the context
    prefills: list[PrefillChunk] = field(default_factory=list)


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """q [T, H, D], k/v [T, KVH, D]; caches [KVH, num_slots, D]. Returns [T, H, D]."""
    k_cache.index_copy_(1, meta.slot_mapping, k.transpose(0, 1))
    v_cache.index_copy_(1, meta.slot_mapping, v.transpose(0, 1))
    d = meta.num_decodes
    if d and not meta.prefills:
        return _decode(q, k_cache, v_cache, meta, scale)
    out = torch.empty_like(q)
    if d:
        out[:d] = _decode(q[:d], k_cache, v_cache, meta, scale)
    for chunk in meta.prefills:
        qs = q[chunk.start:chunk.end].transpose(0, 1)  # [H, q, D]
        if chunk.slots is None:
            ks = k[chunk.start:chunk.end].transpose(0, 1)
            vs = v[chunk.start:chunk.end].transpose(0, 1)
            o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale, enable_gqa=True)
        else:
            ks = k_cache.index_select(1, chunk.slots)  # [KVH, L, D]
            vs = v_cache.index_select(1, chunk.slots)
            n_q, n_ctx = chunk.end - chunk.start, chunk.context_len
            rows = torch.arange(n_q, device=q.device).unsqueeze(1) + (n_ctx - n_q)
            mask = torch.arange(n_ctx, device=q.device).unsqueeze(0) <= rows
            o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=scale, enable_gqa=True)
        out[chunk.start:chunk.end] = o.transpose(0, 1)
    return out


def _decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
            scale: float) -> torch.Tensor:
    """One query per request: gather each request's context [KVH, D, L, Dh] and attend with grouped heads."""
    n, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[0]
    group = num_heads // num_kv_heads
    ks = k_cache.index_select(1, meta.decode_slots).view(num_kv_heads, n, meta.decode_len, head_dim)
    vs = v_cache.index_select(1, meta.decode_slots).view(num_kv_heads, n, meta.decode_len, head_dim)
    qg = q.view(n, num_kv_heads, group, head_dim).transpose(0, 1)  # [KVH, D, G, Dh]
    o = F.scaled_dot_product_attention(qg, ks, vs, attn_mask=meta.decode_mask, scale=scale)  # [KVH, D, G, Dh]
    return o.transpose(0, 1).reshape(n, num_heads, head_dim)
