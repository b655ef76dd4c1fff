"""Paged attention in plain torch: write this step's K/V into the block-paged cache, then attend over each
request's blocks. Decodes (one query token each) run as one batched gather over their block tables; prefill
chunks run per request with scaled_dot_product_attention."""
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
    slot_mapping: torch.Tensor  # [T] cache slot of each token (block_id * block_size + offset)
    num_decodes: int = 0
    decode_block_tables: torch.Tensor | None = None  # [D, max_blocks] block ids, padded with 0
    decode_mask: torch.Tensor | None = None  # [D, 1, 1, max_blocks*block_size] additive mask (0 or -inf)
    prefills: list[PrefillChunk] = field(default_factory=list)


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """q [T, H, D], k/v [T, KVH, D]; caches [num_blocks, block_size, KVH, D]. Returns [T, H, D]."""
    num_kv_heads, head_dim = k.shape[1], k.shape[2]
    flat_k = k_cache.view(-1, num_kv_heads, head_dim)
    flat_v = v_cache.view(-1, num_kv_heads, head_dim)
    flat_k.index_copy_(0, meta.slot_mapping, k)
    flat_v.index_copy_(0, meta.slot_mapping, v)
    out = torch.empty_like(q)
    d = meta.num_decodes
    if d:
        out[:d] = _decode(q[:d], k_cache, v_cache, meta, scale)
    for chunk in meta.prefills:
        qs = q[chunk.start:chunk.end].transpose(0, 1)  # [H, q, D]
        if chunk.slots is None:
            ks = k[chunk.start:chunk.end].transpose(0, 1)
            vs = v[chunk.start:chunk.end].transpose(0, 1)
            o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale, enable_gqa=True)
        else:
            ks = flat_k[chunk.slots].transpose(0, 1)  # [KVH, L, D]
            vs = flat_v[chunk.slots].transpose(0, 1)
            n_q, n_ctx = chunk.end - chunk.start, chunk.context_len
            rows = torch.arange(n_q, device=q.device).unsqueeze(1) + (n_ctx - n_q)
            mask = torch.arange(n_ctx, device=q.device).unsqueeze(0) <= rows
            o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=scale, enable_gqa=True)
        out[chunk.start:chunk.end] = o.transpose(0, 1)
    return out


def _decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
            scale: float) -> torch.Tensor:
    """One query per request: gather each request's blocks [D, L, KVH, Dh] and attend with grouped heads."""
    n, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    tables = meta.decode_block_tables
    ks = k_cache[tables].flatten(1, 2).permute(0, 2, 3, 1)  # [D, KVH, Dh, L]
    vs = v_cache[tables].flatten(1, 2).transpose(1, 2)  # [D, KVH, L, Dh]
    qg = q.view(n, num_kv_heads, group, head_dim)
    scores = torch.matmul(qg, ks).mul_(scale).float()  # [D, KVH, G, L]
    scores.add_(meta.decode_mask)
    probs = torch.softmax(scores, dim=-1).to(vs.dtype)
    return torch.matmul(probs, vs).reshape(n, num_heads, head_dim)
