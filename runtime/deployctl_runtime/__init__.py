"""deployctl-runtime: the paged-KV inference engine and OpenAI-compatible server that deployctl deploys.

`from deployctl_runtime import LLM, SamplingParams` is the offline API. Attributes are lazy so that importing the
package (e.g. for the CLI's --help) does not import torch.
"""
from __future__ import annotations

import os

# OpenMP worker threads sleep when idle instead of spinning (OMP_WAIT_POLICY is read once, when torch loads its
# libgomp; an operator's own value is kept). A serving host always has other work on its cores (the HTTP server,
# tokenization, exporters): with libgomp's default spin-then-sleep, every parallel region waits a time slice for a
# descheduled thread. bench/bench_engine.py --cotenant 1 on this project's 2-core machine (2026-12-06): the engine
# at 105 tok/s with the default, 265 tok/s with PASSIVE (0.73x and 1.71x transformers' continuous batching).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

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
