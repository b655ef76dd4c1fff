"""The variables a runbook may use, and filling them into templates.

Variables come from deploy.yaml and the host (``VARIABLES`` lists them); ``{obs.STEP}`` is the value a
previous step observed and ``{obs.STEP.FIELD}`` one of its recorded fields (``None`` until that step ran).
Paths, ``bind`` (where the runtime answers on its host) and ``port`` come from deployctl.config.layout.
"""
from __future__ import annotations

import shlex
import string
from typing import Any

from deployctl.config import DeployConfig, HostConfig, layout

VARIABLES = (
    "host", "address", "deploy_root", "python", "gpu", "service", "bind", "port", "model_path", "manifest",
    "served_name", "device", "max_model_len", "max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization",
    "block_size", "enable_chunked_prefill", "max_queued_requests", "current", "runtime_yaml", "log_file",
    "pid_file", "child_pid_file", "state_dir", "slo_ttft_p99_s", "slo_tpot_p99_s", "slo_max_kv_cache_usage",
    "request_timeout_s",
)


def host_variables(cfg: DeployConfig, host: HostConfig) -> dict[str, Any]:
    """Every name of ``VARIABLES`` for ``host``."""
    root = host.deploy_root.rstrip("/")
    e = cfg.engine
    return {
        "host": host.name, "address": host.address, "deploy_root": root, "python": host.python, "gpu": host.gpu,
        "service": cfg.service.name, "bind": layout.runtime_address(cfg), "port": layout.service_port(cfg, host),
        "model_path": cfg.model.path, "manifest": cfg.model.manifest, "served_name": cfg.model.name,
        "device": e.device, "max_model_len": e.max_model_len, "max_num_seqs": e.max_num_seqs,
        "max_num_batched_tokens": e.max_num_batched_tokens, "gpu_memory_utilization": e.gpu_memory_utilization,
        "block_size": e.block_size, "enable_chunked_prefill": e.enable_chunked_prefill,
        "max_queued_requests": cfg.server.max_queued_requests,
        "current": layout.current_link(host), "runtime_yaml": layout.runtime_yaml(host),
        "log_file": layout.log_file(host), "pid_file": layout.pid_file(host),
        "child_pid_file": layout.child_pid_file(host), "state_dir": layout.state_dir(host),
        "slo_ttft_p99_s": cfg.slo.ttft_p99_s, "slo_tpot_p99_s": cfg.slo.tpot_p99_s,
        "slo_max_kv_cache_usage": cfg.slo.max_kv_cache_usage, "request_timeout_s": cfg.server.request_timeout_s,
    }


class _Obs:
    """``{obs.STEP}`` → the value; ``{obs.STEP.FIELD}`` → a field of that observation."""

    def __init__(self, observed: dict[str, Any]):
        self._observed = observed

    def __getattr__(self, step_id: str) -> Any:
        obs = self._observed.get(step_id)
        return _ObsValue(obs)


class _ObsValue:
    def __init__(self, obs: Any):
        self._obs = obs

    def __getattr__(self, field: str) -> Any:
        return None if self._obs is None else self._obs.fields.get(field)

    def __format__(self, spec: str) -> str:
        return format(_plain(None if self._obs is None else self._obs.value), spec)

    def __str__(self) -> str:
        return format(self, "")


def _plain(value: Any) -> Any:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "none" if value is None else value


class _Formatter(string.Formatter):
    def __init__(self, quote: bool):
        self.quote = quote

    def format_field(self, value: Any, format_spec: str) -> str:
        text = format(_plain(value) if not isinstance(value, _ObsValue) else value, format_spec)
        return shlex.quote(text) if self.quote else text


def fill(text: str, variables: dict[str, Any], observed: dict[str, Any], *, quote: bool = False) -> str:
    """``text`` with its ``{placeholders}`` filled; ``quote=True`` shell-quotes each value (commands)."""
    return _Formatter(quote).vformat(text, (), {**variables, "obs": _Obs(observed)})
