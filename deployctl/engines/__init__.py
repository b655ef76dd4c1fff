"""Engine adapters: one declarative module per inference server deployctl deploys (see base.Adapter).

``of(cfg)`` (the engine a deploy.yaml runs) and ``adapter(kind)`` (an engine known by its kind alone, e.g. read
from a release.json) are the only ways in. ``KINDS`` lists the engine.kind values deploy.yaml accepts; the first is
the default. ``openai`` is any OpenAI-compatible server described in deploy.yaml (engine.server, engines.openai):
``of(cfg)`` builds its adapter from that description, ``adapter("openai")`` is the description-less fallback.
Nothing outside this package spells an engine's flag or metric name.
"""
from __future__ import annotations

from deployctl.engines.base import METRIC_ROLES, SETTINGS, Adapter, ErrorShare, Flag, Metrics, Sleep, Switch

KINDS = ("deployctl-runtime", "vllm", "sglang", "transformers", "openai")
_MODULES = {"deployctl-runtime": "runtime", "vllm": "vllm", "sglang": "sglang", "transformers": "transformers",
            "openai": "openai"}


def adapter(kind: str) -> Adapter:
    """The adapter of engine ``kind`` (one of KINDS). Raises KeyError for another kind (config validation
    refuses unknown kinds first, with the fix)."""
    import importlib

    return importlib.import_module(f"deployctl.engines.{_MODULES[kind]}").ADAPTER


def of(cfg) -> Adapter:
    """The adapter of the engine ``cfg`` (a DeployConfig, duck-typed) runs: engine.kind's, or for ``openai`` the
    one engine.server describes (engines.openai.from_spec)."""
    e = cfg.engine
    if e.kind == "openai" and getattr(e, "server", None) is not None:
        from deployctl.engines.openai import from_spec

        return from_spec(e.server)
    return adapter(e.kind)


def adapter_for(cfg, kind=None) -> Adapter:
    """The adapter of engine ``kind`` seen from ``cfg``: ``of(cfg)`` when kind is None or cfg's own engine.kind,
    else ``adapter(kind)`` (another release's engine, e.g. the stable side of a mixed fleet)."""
    if kind is None or kind == cfg.engine.kind:
        return of(cfg)
    return adapter(kind)


def metric(kind: str, role: str):
    """The Prometheus name of ``role`` (base.METRIC_ROLES) for engine ``kind``, or None when it has none."""
    return adapter(kind).metrics[role]


def router_refused_paths() -> tuple[str, ...]:
    """Every engine's sleep and control/dev routes (``Adapter.router_refused_paths``), sorted: host-only routes the
    router answers 404 to (it passes ``router_passed_paths`` only), whatever engine the fleet runs."""
    out: set[str] = set()
    for kind in KINDS:
        out.update(adapter(kind).router_refused_paths())
    return tuple(sorted(out))


def router_passed_paths(kinds) -> tuple[str, ...]:
    """The paths the router passes for a fleet running engine ``kinds`` (adapters or kind names): every one's
    ``Adapter.public_routes``, sorted (a mixed fleet mid-switch serves what either side serves). Every other path
    answers 404 at the edge."""
    out: set[str] = set()
    for k in kinds:
        out.update((adapter(k) if isinstance(k, str) else k).public_routes)
    return tuple(sorted(out))


def standby_enabled(cfg) -> bool:
    """The release keeps a sleeping standby: ``rollout.standby_s`` > 0 and the engine has a sleep mode."""
    return cfg.rollout.standby_s > 0 and of(cfg).sleep is not None


def standby_residue_bytes(cfg, hosts=None) -> int:
    """Bytes per GPU a sleeping standby of the previous release keeps beside the new release (the adapter's
    ``Sleep.gpu_residue_bytes``, source in ``residue_source``) on a cuda fleet that keeps standbys
    (``standby_enabled``) on any of ``hosts`` (default: cfg.hosts) with ``spare_port``; else 0."""
    if cfg.engine.device != "cuda" or not standby_enabled(cfg):
        return 0
    if not any(h.spare_port for h in (cfg.hosts if hosts is None else hosts)):
        return 0
    return of(cfg).sleep.gpu_residue_bytes


__all__ = ["KINDS", "METRIC_ROLES", "SETTINGS", "Adapter", "ErrorShare", "Flag", "Metrics", "Sleep", "Switch", "adapter",
           "adapter_for", "metric", "of", "router_passed_paths", "router_refused_paths",
           "standby_enabled", "standby_residue_bytes"]
