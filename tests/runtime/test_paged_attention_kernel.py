"""The Triton paged decode kernel equals the torch reference (attention.decode_torch) over random block tables.

On CPU it runs under TRITON_INTERPRET=1 (set by tests/runtime/conftest.py; small sizes, a few seconds); the full
sweep (head sizes 64/128, GQA ratios 1-8, contexts 1-4096, bf16) is gpu-marked and runs in bench/gpu_check.sh."""
from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")

from deployctl_runtime.attention import decode_group, decode_torch  # noqa: E402
from deployctl_runtime.kernels.paged_attention import paged_decode  # noqa: E402


def _case(lens, num_heads, num_kv_heads, head_dim, block_size, dtype, device, seed):
    """Random caches and block tables: every request holds distinct random blocks (shuffled, not in order)."""
    g = torch.Generator().manual_seed(seed)
    width = max(-(-n // block_size) for n in lens)
    num_blocks = sum(-(-n // block_size) for n in lens) + 3
    perm = torch.randperm(num_blocks, generator=g)
    tables, used = [], 0
    for n in lens:
        nb = -(-n // block_size)
        row = perm[used:used + nb].tolist()
        used += nb
        tables.append(row + [0] * (width - nb))
    cache = torch.randn(2, num_kv_heads, num_blocks * block_size, head_dim, generator=g).to(dtype).to(device)
    q = torch.randn(len(lens), num_heads, head_dim, generator=g).to(dtype).to(device)
    return q, cache[0], cache[1], torch.tensor(tables, device=device)


def _check(lens, num_heads, num_kv_heads, head_dim, block_size=16, dtype=torch.float32, device="cpu", seed=0,
           atol=2e-5):
    q, k_cache, v_cache, tables = _case(lens, num_heads, num_kv_heads, head_dim, block_size, dtype, device, seed)
    scale = head_dim ** -0.5
    ref = decode_torch(q.float(), k_cache.float(), v_cache.float(), decode_group(0, tables, lens, block_size), scale)
    got = paged_decode(q, k_cache, v_cache, tables.to(torch.int32),
                       torch.tensor(lens, dtype=torch.int32, device=device), scale, block_size)
    assert got.shape == q.shape and got.dtype == q.dtype
    torch.testing.assert_close(got.float(), ref, atol=atol, rtol=atol)


@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim,lens", [
    (4, 4, 64, [1, 17, 40]),  # no grouping; a context of one token; a partial last block
    (8, 2, 64, [33, 5]),  # GQA 4:1
    (6, 2, 128, [16, 31]),  # GQA 3:1 (group padded to 4), head size 128, exactly one full block
    (4, 1, 24, [50]),  # head size not a power of two (tiny Qwen3); multi-query
])
def test_kernel_matches_torch_reference_interpreted(num_heads, num_kv_heads, head_dim, lens):
    _check(lens, num_heads, num_kv_heads, head_dim, seed=len(lens) + head_dim)


def test_kernel_rejects_mismatched_shapes():
    q, k_cache, v_cache, tables = _case([5], 4, 2, 64, 16, torch.float32, "cpu", 0)
    with pytest.raises(ValueError, match="paged_decode"):
        paged_decode(q[:, :3], k_cache, v_cache, tables.int(), torch.tensor([5], dtype=torch.int32), 0.1, 16)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("num_heads,num_kv_heads", [(8, 8), (16, 8), (16, 4), (32, 4)])
def test_kernel_matches_torch_reference_cuda_sweep(dtype, head_dim, num_heads, num_kv_heads):
    lens = [1, 15, 16, 17, 255, 1000, 4096]
    _check(lens, num_heads, num_kv_heads, head_dim, dtype=dtype, device="cuda", seed=head_dim + num_heads,
           atol=2e-5 if dtype == torch.float32 else 2e-2)
