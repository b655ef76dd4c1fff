"""The canary verdict as an Argo Rollouts AnalysisTemplate: PromQL over the engine adapter's metric names and the
thresholds of deploy.yaml ``rollout.analysis`` (the same AnalysisConfig deployctl.rollout.analysis.judge reads).

Each Prometheus metric's query answers one number per measurement and carries both conditions
(``result[0] <= limit`` succeeds, ``result[0] > limit`` fails). A query whose window lacks the data to judge
answers NaN (``or vector(NaN)``): neither condition holds, so Argo counts the measurement Inconclusive, as judge()
says ``inconclusive`` for the same window. Rules, as judge() applies them to one window of ``interval_s``:

- ``error-rate``: canary errors / canary requests, judged once the canary served ``min_requests`` and stable
  served any; errors are rejections whose reason is not the client's (render.targets.CLIENT_REASONS), requests
  are successes + rejections. Only engines exporting both counters get it (the bundled runtime); on others errors
  show in the golden-output Job and the alerts.
- ``p99-ttft-ratio`` / ``p99-tpot-ratio``: P99 canary / P99 stable (histogram_quantile over the window's bucket
  increases, each side pooled over its pods), 0 when canary − stable is within ``min_p99_delta_s`` (bucket noise),
  judged once the canary also holds ``min_latency_samples`` TTFT observations; fails over ``max_p99_*_ratio``.

Canary and stable pods are told apart by the ``rollouts-pod-template-hash`` pod label that Argo sets, copied onto
every series by the PodMonitor (render.monitoring) as ``rollouts_pod_template_hash``; the Rollout passes the two
hashes as the ``canary-hash`` / ``stable-hash`` arguments (``podTemplateHashValue: Latest`` / ``Stable``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from deployctl.config import DeployConfig

HASH_LABEL = "rollouts_pod_template_hash"
ARG_CANARY, ARG_STABLE = "canary-hash", "stable-hash"


@dataclass(frozen=True)
class PromMetric:
    """One AnalysisTemplate metric: ``query`` (PromQL with ``{{args.*}}`` placeholders) and its limit; the
    conditions are ``result[0] <= limit`` (success) and ``result[0] > limit`` (failure)."""

    name: str
    query: str
    limit: float
    what: str

    @property
    def success(self) -> str:
        return f"result[0] <= {self.limit!r}"

    @property
    def failure(self) -> str:
        return f"result[0] > {self.limit!r}"


def window(cfg: DeployConfig) -> str:
    """The PromQL range of one measurement: rollout.analysis.interval_s, whole seconds."""
    return f"{math.ceil(cfg.rollout.analysis.interval_s)}s"


def _sel(cfg: DeployConfig, arg: str, extra: str = "") -> str:
    return (f'{{namespace="{cfg.container.namespace}", deployctl_service="{cfg.service.name}", '
            f'{HASH_LABEL}="{{{{args.{arg}}}}}"{extra}}}')


def _requests(cfg: DeployConfig, m: dict, arg: str, w: str) -> Optional[str]:
    sel = _sel(cfg, arg)
    if m["success"]:
        out = f"sum(increase({m['success']}{sel}[{w}]))"
        if m["rejected"]:
            out += f" + (sum(increase({m['rejected']}{sel}[{w}])) or vector(0))"
        return f"({out})"
    if m["e2e"]:
        return f"sum(increase({m['e2e']}_count{sel}[{w}]))"
    return None


def _p99(cfg: DeployConfig, name: str, arg: str, w: str) -> str:
    return f"histogram_quantile(0.99, sum by (le) (increase({name}_bucket{_sel(cfg, arg)}[{w}])))"


def prom_metrics(cfg: DeployConfig, client_reasons: str) -> list[PromMetric]:
    """The Prometheus metrics of the AnalysisTemplate for ``cfg``'s engine (none for an engine without /metrics)."""
    from deployctl.engines import METRIC_ROLES, adapter

    a = cfg.rollout.analysis
    m = {role: adapter(cfg.engine.kind).metrics[role] for role in METRIC_ROLES}
    w = window(cfg)
    nr_c, nr_s = _requests(cfg, m, ARG_CANARY, w), _requests(cfg, m, ARG_STABLE, w)
    if nr_c is None:
        return []
    gate = f"({nr_c} >= {a.min_requests})\n  and ({nr_s} > 0)"
    out = []
    if m["rejected"] and m["success"]:
        server_fault = _sel(cfg, ARG_CANARY, f', reason!~"{client_reasons}"')
        errors = f"(sum(increase({m['rejected']}{server_fault}[{w}])) or vector(0))"
        out.append(PromMetric("error-rate", f"(\n  ({errors} / {nr_c})\n  and {gate}\n) or vector(NaN)",
                              a.max_error_rate, "canary error share over max_error_rate"))
    if m["ttft"]:
        samples = f"(sum(increase({m['ttft']}_count{_sel(cfg, ARG_CANARY)}[{w}])) >= {a.min_latency_samples})"
        for role, limit in (("ttft", a.max_p99_ttft_ratio), ("tpot", a.max_p99_tpot_ratio)):
            if not m[role]:
                continue
            c, s = _p99(cfg, m[role], ARG_CANARY, w), _p99(cfg, m[role], ARG_STABLE, w)
            ratio = f"(({c})\n    / ({s}))\n  * (({c}) - ({s}) > bool {a.min_p99_delta_s!r})"
            out.append(PromMetric(f"p99-{role}-ratio", f"(\n  ({ratio})\n  and {gate}\n  and {samples}\n) or vector(NaN)",
                                  limit, f"canary P99 {role.upper()} over max_p99_{role}_ratio × stable's"))
    return out


def measurements(cfg: DeployConfig) -> int:
    """Measurements per canary step: the step's pause_s cut into interval_s windows (at least one), as
    `deployctl deploy` evaluates a window every interval_s through the step."""
    a = cfg.rollout.analysis
    return max(1, math.floor(cfg.rollout.pause_s / a.interval_s))


def inconclusive_limit(cfg: DeployConfig) -> int:
    """Argo's inconclusiveLimit: the metric turns Inconclusive (the Rollout pauses for a human) once more than this
    many measurements were inconclusive; deploy pauses at ``inconclusive_limit`` (0: never, so all of a step's)."""
    limit = cfg.rollout.analysis.inconclusive_limit
    return max(0, limit - 1) if limit else measurements(cfg)


__all__ = ["ARG_CANARY", "ARG_STABLE", "HASH_LABEL", "PromMetric", "inconclusive_limit", "measurements",
           "prom_metrics", "window"]
