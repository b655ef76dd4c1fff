"""Qwen2 family: the Llama architecture with a bias on the q, k and v projections."""
from deployctl_runtime.models.llama import LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    qkv_bias = True
