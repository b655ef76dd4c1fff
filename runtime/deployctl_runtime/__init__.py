"""deployctl-runtime: the paged-KV inference engine and OpenAI-compatible server that deployctl deploys.

`from deployctl_runtime import LLM, SamplingParams` is the offline API. Attributes are lazy so that importing the
package (e.g. for the CLI's --help) does not import torch.
"""
from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams", "EngineArgs", "LLMEngine", "RequestRejected"]

_LAZY = {
    "LLM": "deployctl_runtime.llm",
    "SamplingParams": "deployctl_runtime.sampling_params",
    "EngineArgs": "deployctl_runtime.engine_args",
    "LLMEngine": "deployctl_runtime.engine",
    "RequestRejected": "deployctl_runtime.engine",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'deployctl_runtime' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
