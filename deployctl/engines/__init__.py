"""Engine adapters: one declarative module per inference server deployctl deploys (see base.Adapter).

``adapter(kind)`` is the only way in. ``KINDS`` lists the engine.kind values deploy.yaml accepts; the first is
the default. Nothing outside this package spells an engine's flag or metric name.
"""
from __future__ import annotations

from deployctl.engines.base import METRIC_ROLES, SETTINGS, Adapter, Flag, Metrics, Switch

KINDS = ("deployctl-runtime", "vllm", "sglang", "transformers")
_MODULES = {"deployctl-runtime": "runtime", "vllm": "vllm", "sglang": "sglang", "transformers": "transformers"}


def adapter(kind: str) -> Adapter:
    """The adapter of engine ``kind`` (one of KINDS). Raises KeyError for another kind (config validation
    refuses unknown kinds first, with the fix)."""
    import importlib

    return importlib.import_module(f"deployctl.engines.{_MODULES[kind]}").ADAPTER


def metric(kind: str, role: str):
    """The Prometheus name of ``role`` (base.METRIC_ROLES) for engine ``kind``, or None when it has none."""
    return adapter(kind).metrics[role]


__all__ = ["KINDS", "METRIC_ROLES", "SETTINGS", "Adapter", "Flag", "Metrics", "Switch", "adapter", "metric"]
