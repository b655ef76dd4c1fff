"""``engine.server``: any OpenAI-compatible server described in deploy.yaml (``engine.kind: openai``).

TGI, llama.cpp's server, LMDeploy, ``trtllm-serve`` or ``transformers serve``: deployctl knows none of their flags,
so the command line is a template (one word per item) whose ``{placeholders}`` are the settings deploy.yaml models
(deployctl.engines.SETTINGS: ``{model}``, ``{port}``, ``{host}``, ``{max_model_len}``, ``{num_gpu_blocks}``, ...)
plus ``{python}`` (the engine's interpreter) and ``{bin}`` (its bin/ directory). Everything else the adapter of a
known engine says (routes, metric names, stop signal and drain) is declared here; what is left out is what the
server cannot be judged on, and the canary analysis names it (deployctl.rollout.analysis ``cannot_judge``).
"""
from __future__ import annotations

import re
import string
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator

# One word of the command: safe unquoted in a systemd ExecStart and sh (placeholders in braces).
_WORD = re.compile(r"^[A-Za-z0-9_./+@:,=%{}-]{1,200}$")
_ROUTE = r"^/[A-Za-z0-9_./-]{0,200}$"
_METRIC = r"^[A-Za-z_:][A-Za-z0-9_:]{0,200}$"
# Placeholders besides the settings: the engine's interpreter and its bin/ directory.
PATH_PLACEHOLDERS = ("python", "bin")
_SECRET_WORDS = ("--api-key", "--api-key-file", "api_key")


class ErrorShareSpec(BaseModel):
    """A counter of the server's requests and the label matchers (PromQL, no braces) selecting the failed ones."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)
    counter: str = Field(pattern=_METRIC)
    """The Prometheus counter of the server's requests."""
    errors: str = Field(min_length=1, max_length=200)
    """Label matchers (PromQL, no braces) selecting the failed requests on that counter."""
    total: str = Field("", max_length=200)
    """Label matchers selecting the requests counted as the total; default: every request."""


class OpenAIServerConfig(BaseModel):
    """How to start, probe, scrape and stop one OpenAI-compatible server. ``metrics``: role
    (deployctl.engines.METRIC_ROLES: ttft, tpot, itl, e2e, queue_time histograms in seconds; kv_usage, waiting,
    running gauges; preemptions, success, rejected counters) -> the server's Prometheus name; a role left out is
    a signal deployctl cannot judge it on. ``distribution`` (optional): a pip distribution pinned by
    engine.version, installed per release like vLLM's; without it ``{python}`` is hosts[].python."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)
    command: list[str] = Field(min_length=1, max_length=200)
    """The server's command template ({python}, {bin} and the settings as placeholders)."""
    distribution: Optional[str] = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
    """A pip distribution pinned by engine.version, installed per release; default: none (`{python}` is
    hosts[].python).
    """
    module: Optional[str] = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_.]{0,99}$")
    """The Python module the server is imported as; default: the distribution's name."""
    image: Optional[str] = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/:-]{0,254}$")
    """The server's container image for the container targets; its tag is engine.version."""
    ready_route: str = Field("/health", pattern=_ROUTE)
    """The route that answers 200 once the server takes requests."""
    live_route: Optional[str] = Field(None, pattern=_ROUTE)
    """The liveness route; default: ready_route."""
    metrics_route: Optional[str] = Field(None, pattern=_ROUTE)
    """The Prometheus metrics route; default null: the server exports no metrics."""
    metrics: dict[str, str] = Field(default_factory=dict)
    """Metric role (ttft, tpot, itl, e2e, queue_time, kv_usage, waiting, running, preemptions, success, rejected) ->
    the server's Prometheus name; a role left out is a signal deployctl cannot judge it on.
    """
    error_share: Optional[ErrorShareSpec] = None
    """How the share of failed requests is read from the server's metrics; default: not judged."""
    api_key_env: Optional[str] = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,99}$")
    """The environment variable the server reads its API key from."""
    stop_signal: Literal["SIGTERM", "SIGINT", "SIGQUIT"] = "SIGTERM"
    """The signal that stops the server."""
    sigterm_drains: bool = True
    """the stop signal lets in-flight requests finish (False: it cuts them; a pod waits out the drain in preStop)"""
    drain: str = Field("declared in deploy.yaml (engine.server)", max_length=400)
    """what the stop does, in words"""
    stop_overhead_s: int = Field(0, ge=0, le=3600)
    """seconds it takes to exit after its drain"""
    probe_timeout_s: int = Field(5, ge=1, le=600)
    """seconds one readiness probe may take"""
    ready_log: str = Field("", max_length=200)
    """a line its start-up log prints once it serves"""
    keep_alive_s: float = Field(5.0, gt=0, le=3600)
    """its HTTP keep-alive timeout in seconds (nginx's is set below it); 5: uvicorn's default, the common case"""
    sse_done: bool = True
    """streams end with data: [DONE]"""
    model_name_is_path: bool = False
    """clients must name the model by its path (model.served_name: model.path)"""

    @field_validator("command")
    @classmethod
    def _command(cls, v: list[str]) -> list[str]:
        from deployctl.engines import SETTINGS

        allowed = set(SETTINGS) | set(PATH_PLACEHOLDERS)
        for word in v:
            if not _WORD.match(word):
                raise ValueError(f"word {word!r} has characters deployctl will not put on a command line; one word "
                                 "per item, letters, digits and _ . / + @ : , = % - {{placeholders}} only")
            if any(s in word for s in _SECRET_WORDS):
                raise ValueError(f"{word!r} would put the API key on the command line; name the variable the server "
                                 "reads it from in engine.server.api_key_env (the key travels in the 0600 env file)")
            try:
                names = [f for _, f, _, _ in string.Formatter().parse(word) if f is not None]
            except ValueError as exc:
                raise ValueError(f"word {word!r}: {exc} (a literal brace is not allowed)") from None
            for name in names:
                if name not in allowed:
                    raise ValueError(f"word {word!r}: unknown placeholder {{{name}}}; one of "
                                     + ", ".join("{" + n + "}" for n in sorted(allowed)))
        return v

    @field_validator("metrics")
    @classmethod
    def _metrics(cls, v: dict[str, str]) -> dict[str, str]:
        from deployctl.engines import METRIC_ROLES

        for role, name in v.items():
            if role not in METRIC_ROLES:
                raise ValueError(f"unknown metric role {role!r}; one of {', '.join(METRIC_ROLES)}")
            if not re.match(_METRIC, name):
                raise ValueError(f"metrics.{role} {name!r} is not a Prometheus metric name")
        return v
