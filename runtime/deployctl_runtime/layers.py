"""Building blocks shared by the model families: RMSNorm, rotary embedding (incl. Llama-3 scaling), gated MLP."""
from __future__ import annotations

import math

import torch
from torch import nn
import torch.nn.functional as F

from deployctl_runtime.kernels import cpu_kernels


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * weight, computed in float32 (as HF Llama does).

    forward(x) -> y; forward(x, residual) -> (norm(x + residual), x + residual): the residual add fused in, as
    vLLM's layers do (one pass on the CPU float32 path, cpu_ops.c, where x is overwritten and residual updated in
    place)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        ops = cpu_kernels.native(x)
        if ops is not None and x.is_contiguous() and (residual is None or residual.is_contiguous()):
            y = ops.rms_norm(x, self.weight, self.eps, residual)
            return y if residual is None else (y, residual)
        if residual is not None:
            residual = x + residual
            return self._norm(residual), residual
        return self._norm(x)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        if dtype == torch.float32:
            # HF's arithmetic, bit for bit, in five ops (three in place); on CPU torch's F.rms_norm is a composite
            # of eight, two of them copies
            return (x * x.pow(2).mean(-1, keepdim=True).add_(self.eps).rsqrt_()).mul_(self.weight)
        # half types: normalise in float32, round, then scale, in HF's order
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None) -> torch.Tensor:
    """Inverse frequencies [head_dim/2]. Llama-3 scaling: Meta's llama3 reference / HF `_compute_llama3_parameters`
    (long wavelengths divided by `factor`, short kept, a smooth blend in between); linear: all divided by factor."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if scaling is None:
        return inv_freq
    factor = float(scaling["factor"])
    if scaling["rope_type"] == "linear":
        return inv_freq / factor
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    old_len = float(scaling["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    """Non-interleaved RoPE (HF's rotate_half form): x * cos + rotate_half(x) * sin, with rotate_half(x) =
    [-x2, x1] folded into a signed sin table, so one position costs a gather, a cat and an addcmul."""

    def __init__(self, head_dim: int, max_position: int, theta: float, scaling: dict | None):
        super().__init__()
        inv_freq = rope_inv_freq(head_dim, theta, scaling)
        t = torch.arange(max_position, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)
        self.head_dim, self.half = head_dim, head_dim // 2
        self.register_buffer("cos", torch.cat((freqs.cos(), freqs.cos()), -1), persistent=False)
        self.register_buffer("sin", torch.cat((-freqs.sin(), freqs.sin()), -1), persistent=False)

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin rows [T, 1, D] for positions [T]: gathered once per step and shared by every layer."""
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)

    def qkv(self, tables: tuple[torch.Tensor, torch.Tensor], qkv: torch.Tensor, num_heads: int, num_kv_heads: int,
            q_norm: RMSNorm | None = None, k_norm: RMSNorm | None = None,
            cache: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None):
        """qkv [T, (H + 2 KVH) * D] (the fused projection's output) -> (q [T, H, D], k [T, KVH, D], v [T, KVH, D],
        stored): q and k normalised per head first when q_norm/k_norm are given (Qwen3), then rotated. On the CPU
        float32 path (kernels/cpu_kernels.py) this is one pass in place over qkv that also writes k and v into
        cache = (k_cache, v_cache, slot_mapping [T]); stored then says the caller need not write them."""
        t, d = qkv.shape[0], self.head_dim
        q_size, kv_size = num_heads * d, num_kv_heads * d
        ops = cpu_kernels.native(qkv)
        stored = False
        if ops is not None and d % 2 == 0 and d <= cpu_kernels.MAX_DIM and qkv.stride(1) == 1:
            k_cache, v_cache, slots = cache if cache is not None and cache[0].numel() else (None, None, None)
            cos, sin = tables
            ops.rope_store(qkv, num_heads, num_kv_heads, d, cos, sin, q_norm and q_norm.weight,
                           k_norm and k_norm.weight, q_norm.eps if q_norm else 0.0, k_cache, v_cache, slots)
            stored = k_cache is not None
            q = qkv[:, :q_size].view(t, num_heads, d)
            k = qkv[:, q_size:q_size + kv_size].view(t, num_kv_heads, d)
        elif q_norm is None:  # q and k side by side in qkv: rotated in one pass, [T, H + KVH, D]
            qk = self.rotate(tables, qkv[:, :q_size + kv_size].view(t, num_heads + num_kv_heads, d))
            q, k = qk[:, :num_heads], qk[:, num_heads:]
        else:
            q, k = self(tables, q_norm(qkv[:, :q_size].view(t, num_heads, d)),
                        k_norm(qkv[:, q_size:q_size + kv_size].view(t, num_kv_heads, d)))
        return q, k, qkv[:, q_size + kv_size:].view(t, num_kv_heads, d), stored

    def forward(self, tables: tuple[torch.Tensor, torch.Tensor], q: torch.Tensor, k: torch.Tensor):
        """q [T, H, D], k [T, KVH, D] -> rotated copies (computed in float32, returned in the input dtype)."""
        return self.rotate(tables, q), self.rotate(tables, k)

    def rotate(self, tables: tuple[torch.Tensor, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """x [T, heads, D] (any heads: q, k, or both side by side) -> a rotated copy, [T, heads, D]."""
        cos, sin = tables
        xf = x.float()
        swapped = torch.cat((xf[..., self.half:], xf[..., :self.half]), dim=-1)
        return torch.addcmul(xf * cos, swapped, sin).to(x.dtype)


class GatedMLP(nn.Module):
    """down(silu(gate(x)) * up(x)) with gate and up fused into one matmul."""

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_up_proj = nn.Linear(hidden, 2 * intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        ops = cpu_kernels.native(gate_up)
        if ops is not None:
            return self.down_proj(ops.silu_mul(gate_up))
        gate, up = gate_up.chunk(2, dim=-1)
        return self.down_proj(F.silu(gate, inplace=True).mul_(up))
