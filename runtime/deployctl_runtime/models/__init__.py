"""One file per model family. `model_class(family)` maps ModelConfig.family to its nn.Module."""
from __future__ import annotations


def model_class(family: str):
    if family == "llama":
        from deployctl_runtime.models.llama import LlamaForCausalLM
        return LlamaForCausalLM
    if family == "qwen2":
        from deployctl_runtime.models.qwen2 import Qwen2ForCausalLM
        return Qwen2ForCausalLM
    if family == "qwen3":
        from deployctl_runtime.models.qwen3 import Qwen3ForCausalLM
        return Qwen3ForCausalLM
    raise ValueError(f"model family {family!r} is not supported; supported: llama, qwen2, qwen3")
