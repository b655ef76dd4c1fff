"""Llama family (Llama 2/3, Mistral): GQA, RoPE (theta, Llama-3 scaling), RMSNorm, SwiGLU MLP.

Module names mirror HF checkpoints (model.layers.N.self_attn..., lm_head) except two fused projections:
qkv_proj = [q_proj; k_proj; v_proj] and mlp.gate_up_proj = [gate_proj; up_proj] (see loader.STACKED).
Subclasses switch on qkv bias (Qwen2) and per-head q/k RMSNorm (Qwen3)."""
from __future__ import annotations

import torch
from torch import nn

from deployctl_runtime.attention import AttentionMetadata, paged_attention
from deployctl_runtime.layers import GatedMLP, RMSNorm, RotaryEmbedding
from deployctl_runtime.model_config import ModelConfig


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, qkv_bias: bool, qk_norm: bool, rotary: RotaryEmbedding):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=qkv_bias)
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps) if qk_norm else None
        self.rotary = [rotary]  # shared; a list so it is not registered once per layer
        self.scale = self.head_dim ** -0.5
        self.k_cache = self.v_cache = torch.empty(0)  # [KVH, num_slots, D], set by the model runner

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata
                ) -> torch.Tensor:
        t = x.shape[0]
        q, k, v, stored = self.rotary[0].qkv(rope, self.qkv_proj(x), self.num_heads, self.num_kv_heads,
                                             self.q_norm, self.k_norm, (self.k_cache, self.v_cache,
                                                                        meta.slot_mapping))
        o = paged_attention(q, k, v, self.k_cache, self.v_cache, meta, self.scale, stored)
        return self.o_proj(o.reshape(t, self.q_size))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, qkv_bias: bool, qk_norm: bool, rotary: RotaryEmbedding):
        super().__init__()
        self.self_attn = Attention(cfg, qkv_bias, qk_norm, rotary)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, residual, rope, meta):
        """x [T, hidden] (the previous layer's output, or the embeddings with residual None) -> (this layer's
        output, the residual stream before it): the adds are fused into the norms (RMSNorm.forward)."""
        if residual is None:
            x, residual = self.input_layernorm(x), x
        else:
            x, residual = self.input_layernorm(x, residual)
        x, residual = self.post_attention_layernorm(self.self_attn(x, rope, meta), residual)
        return self.mlp(x), residual


class Backbone(nn.Module):
    def __init__(self, cfg: ModelConfig, qkv_bias: bool, qk_norm: bool):
        super().__init__()
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta, cfg.rope_scaling)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, qkv_bias, qk_norm, self.rotary)
                                    for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, input_ids, positions, meta):
        x = self.embed_tokens(input_ids)
        rope = self.rotary.tables(positions)  # once per step, not per layer
        residual = None
        for layer in self.layers:
            x, residual = layer(x, residual, rope, meta)
        return self.norm(x, residual)[0]


class LlamaForCausalLM(nn.Module):
    """forward(input_ids [T], positions [T], meta) -> hidden [T, hidden]; compute_logits(hidden [N, hidden]) ->
    float32 logits [N, vocab]."""

    qkv_bias = False
    qk_norm = False

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.model = Backbone(cfg, self.qkv_bias or cfg.attention_bias, self.qk_norm)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        return self.model(input_ids, positions, meta)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()
