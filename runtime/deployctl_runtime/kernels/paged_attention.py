"""Paged decode attention in Triton: one query token per request, K/V read straight from the block-paged cache
through the block table (no gather copy), grouped-query heads handled in one program per (request, KV head).

Online softmax over tiles of TILE tokens (Milakov & Gimelshein 2018, "Online normalizer calculation for softmax";
the flash-decoding form of Dao et al.), accumulated in float32. The loop bound is each request's context length,
read on the device, so the launch has fixed shapes and a CUDA graph can capture it. Rows with context length 0
produce garbage (callers pad with length >= 1 and a scratch block).

Cache layout: [num_kv_heads, num_blocks * block_size, head_dim] per layer (see attention.py)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _paged_decode_kernel(q_ptr, k_ptr, v_ptr, bt_ptr, lens_ptr, o_ptr, scale,
                         stride_qn, stride_qh, stride_kh, stride_ks, stride_btn, stride_on, stride_oh,
                         BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
                         GROUP: tl.constexpr, G_PAD: tl.constexpr, TILE: tl.constexpr):
    seq = tl.program_id(0).to(tl.int64)  # 64-bit offsets: a layer's cache can pass 2**31 elements
    kvh = tl.program_id(1).to(tl.int64)
    ctx = tl.load(lens_ptr + seq)
    offs_g = tl.arange(0, G_PAD)
    offs_d = tl.arange(0, D_PAD)
    offs_t = tl.arange(0, TILE)
    g_mask = offs_g < GROUP
    d_mask = offs_d < HEAD_DIM
    heads = kvh * GROUP + offs_g
    q = tl.load(q_ptr + seq * stride_qn + heads[:, None] * stride_qh + offs_d[None, :],
                mask=g_mask[:, None] & d_mask[None, :], other=0.0).to(tl.float32)
    m = tl.full([G_PAD], float("-inf"), tl.float32)
    l_sum = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([G_PAD, D_PAD], tl.float32)
    for start in range(0, ctx, TILE):
        tok = start + offs_t
        t_mask = tok < ctx
        block = tl.load(bt_ptr + seq * stride_btn + tok // BLOCK_SIZE, mask=t_mask, other=0).to(tl.int64)
        slot = block * BLOCK_SIZE + tok % BLOCK_SIZE
        kv_off = kvh * stride_kh + slot[:, None] * stride_ks + offs_d[None, :]
        kv_mask = t_mask[:, None] & d_mask[None, :]
        k = tl.load(k_ptr + kv_off, mask=kv_mask, other=0.0).to(tl.float32)  # [TILE, D_PAD]
        s = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale  # [G_PAD, TILE]
        s = tl.where(t_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        v = tl.load(v_ptr + kv_off, mask=kv_mask, other=0.0).to(tl.float32)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        l_sum = l_sum * alpha + tl.sum(p, axis=1)
        m = m_new
    out = acc / l_sum[:, None]
    tl.store(o_ptr + seq * stride_on + heads[:, None] * stride_oh + offs_d[None, :],
             out.to(o_ptr.dtype.element_ty), mask=g_mask[:, None] & d_mask[None, :])


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                 context_lens: torch.Tensor, scale: float, block_size: int, tile: int | None = None) -> torch.Tensor:
    """q [n, H, D]; k_cache/v_cache [KVH, num_slots, D] (the same strides); block_tables [n, W] int32 (block ids;
    entries past a request's context are not read); context_lens [n] int32 (>= 1); block_size tokens per block;
    tile: tokens per loop iteration (default: 8192 / (group x head_dim) products in flight, clamped to 16-64).
    Returns [n, H, D] in q's dtype.
    H must be a multiple of KVH. Raises ValueError on mismatched shapes."""
    n, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[0]
    if num_heads % num_kv_heads or k_cache.shape[2] != head_dim or v_cache.stride() != k_cache.stride():
        raise ValueError(f"paged_decode: q {tuple(q.shape)} does not fit caches {tuple(k_cache.shape)}")
    if block_tables.shape[0] != n or context_lens.shape[0] != n:
        raise ValueError(f"paged_decode: {n} queries but block_tables {tuple(block_tables.shape)}, "
                         f"context_lens {tuple(context_lens.shape)}")
    group = num_heads // num_kv_heads
    g_pad, d_pad = max(2, triton.next_power_of_2(group)), triton.next_power_of_2(head_dim)
    tile = tile or min(64, max(16, triton.next_power_of_2(8192 // (g_pad * d_pad))))
    q = q.contiguous()
    out = torch.empty_like(q)
    if n == 0:
        return out
    _paged_decode_kernel[(n, num_kv_heads)](
        q, k_cache, v_cache, block_tables, context_lens, out, scale,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), block_tables.stride(0),
        out.stride(0), out.stride(1),
        BLOCK_SIZE=block_size, HEAD_DIM=head_dim, D_PAD=d_pad, GROUP=group, G_PAD=g_pad, TILE=tile)
    return out
