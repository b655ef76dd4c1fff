"""Qwen3 family: the Llama architecture with per-head RMSNorm on q and k before RoPE (and head_dim from config)."""
from deployctl_runtime.models.llama import LlamaForCausalLM


class Qwen3ForCausalLM(LlamaForCausalLM):
    qk_norm = True
