"""The torch decode path (attention.decode_torch, CPU) equals attention computed request by request.

It gathers K/V by whole rows of a flattened cache when the caches are contiguous (the model runner's layout) and by
slot over dim 1 otherwise; both must give the per-request answer, and one group's gather rows and float bias are
built once and reused by every layer of the step."""
from __future__ import annotations

import math

import pytest
import torch

from deployctl_runtime.attention import decode_group, decode_torch


def _reference(q, k_cache, v_cache, tables, lens, block_size, scale):
    """softmax(q k^T * scale) v for each request alone, over exactly its context (no padding, no mask)."""
    out = torch.empty_like(q)
    num_kv_heads = k_cache.shape[0]
    group = q.shape[1] // num_kv_heads
    for i, n in enumerate(lens):
        slots = torch.tensor([tables[i][p // block_size] * block_size + p % block_size for p in range(n)])
        k, v = k_cache[:, slots], v_cache[:, slots]  # [KVH, n, D]
        for h in range(q.shape[1]):
            w = torch.softmax(q[i, h] @ k[h // group].T * scale, dim=-1)
            out[i, h] = w @ v[h // group]
    return out


@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim,lens", [
    (8, 2, 64, [1, 17, 40, 33]),  # GQA 4:1; one token of context; partial last blocks
    (4, 4, 32, [16, 5]),  # no grouping; exactly one full block
    (6, 1, 24, [50, 2, 31]),  # multi-query, head size not a power of two
])
def test_decode_torch_equals_each_request_alone(num_heads, num_kv_heads, head_dim, lens):
    bs = 16
    g = torch.Generator().manual_seed(len(lens) * head_dim)
    need = [-(-n // bs) for n in lens]
    num_blocks = sum(need) + 4
    perm = torch.randperm(num_blocks - 1, generator=g) + 1  # block 0 stays the padding block
    tables, used = [], 0
    for nb in need:
        tables.append(perm[used:used + nb].tolist() + [0] * (max(need) - nb))
        used += nb
    kv = torch.randn(2, num_kv_heads, num_blocks * bs, head_dim, generator=g)
    q = torch.randn(len(lens), num_heads, head_dim, generator=g)
    scale = 1 / math.sqrt(head_dim)
    want = _reference(q, kv[0], kv[1], tables, lens, bs, scale)

    group = decode_group(0, torch.tensor(tables), lens, bs)
    contiguous = decode_torch(q, kv[0], kv[1], group, scale)
    torch.testing.assert_close(contiguous, want, atol=1e-5, rtol=1e-5)
    rows, bias = group.rows, group.bias
    assert rows is not None and rows.numel() == num_kv_heads * group.slots.numel()
    assert bias is not None and bias.dtype == q.dtype
    assert torch.equal(bias == 0, group.mask) and bool(torch.isneginf(bias[~group.mask]).all())
    # a second layer of the same step reuses them
    again = decode_torch(q, kv[0].clone(), kv[1].clone(), group, scale)
    assert group.rows is rows and group.bias is bias and torch.equal(again, contiguous)

    # caches that are not contiguous (rows padded to twice the head size) take the dim-1 gather: the same answer
    wide = torch.zeros(*kv.shape[:3], 2 * head_dim)
    wide[..., :head_dim] = kv
    strided_kv = wide[..., :head_dim]
    assert not strided_kv[0].is_contiguous()
    strided = decode_torch(q, strided_kv[0], strided_kv[1], decode_group(0, torch.tensor(tables), lens, bs), scale)
    torch.testing.assert_close(strided, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_is_hf_llama_rms_norm_bit_for_bit(dtype):
    """The runtime's RMSNorm on torch ops (five in float32, not torch's composite F.rms_norm; the path wherever the
    C operators are not built) against transformers' LlamaRMSNorm, the definition the checkpoints were trained
    with: equal to the last bit. (The C operator's own test: test_cpu_ops.py.)"""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    from deployctl_runtime.kernels import cpu_kernels
    from deployctl_runtime.layers import RMSNorm

    g = torch.Generator().manual_seed(3)
    ours, theirs = RMSNorm(512, 1e-6), LlamaRMSNorm(512, eps=1e-6)
    with torch.no_grad():
        weight = torch.randn(512, generator=g)
        ours.weight.copy_(weight)
        theirs.weight.copy_(weight)
    ours.to(dtype), theirs.to(dtype)
    for rows, spread in ((16, 1.0), (300, 1e-3), (7, 1e3)):
        x = (torch.randn(rows, 512, generator=g) * spread).to(dtype)
        with torch.inference_mode(), cpu_kernels.disabled():
            assert torch.equal(ours(x), theirs(x)), (rows, spread)
