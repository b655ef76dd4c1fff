"""The canary verdict as an Argo Rollouts AnalysisTemplate: PromQL over the engine adapter's metric names and the
thresholds of deploy.yaml ``rollout.analysis`` (the same AnalysisConfig deployctl.rollout.analysis.judge reads).

Each Prometheus metric's query answers one number per measurement and carries both conditions
(``result[0] <= limit`` succeeds, ``result[0] > limit`` fails). A query whose window lacks the data to judge
answers NaN (``or vector(NaN)``): neither condition holds, so Argo counts the measurement Inconclusive, as judge()
says ``inconclusive`` for the same window. Rules, as judge() applies them to one window of ``interval_s``:

- ``error-rate``: canary errors / canary requests, judged once the canary served ``min_requests`` and stable
  served any; errors are rejections whose reason is not the client's (render.targets.CLIENT_REASONS), requests
  are successes + rejections (the bundled runtime); for an engine with its own count (Adapter.error_share: vLLM's
  ``vllm:request_success_total{finished_reason="error"}``, SGLang's ``sglang:http_responses_total`` 5xx on /v1)
  errors / all of that counter. An engine with neither shows its errors in the golden-output Job and the alerts.
- ``p99-ttft-ratio`` / ``p99-tpot-ratio``: P99 canary / P99 stable (histogram_quantile over the window's bucket
  increases, each side pooled over its pods), 0 when canary − stable is within ``min_p99_delta_s`` (bucket noise),
  judged once the canary also holds ``min_latency_samples`` TTFT observations; fails over ``max_p99_*_ratio``.
- ``p99-ttft-slo`` / ``p99-tpot-slo`` / ``p99-e2e-slo``: the canary's own P99, judged once it holds
  ``min_latency_samples`` TTFT observations, whatever its request count and whatever stable does (a quiet canary
  cannot pass, but it can fail its SLO: deployctl.rollout.canaryrules); fails over ``slo.*_p99_s ×
  max_slo_factor`` (E2E only with ``slo.e2e_p99_s``); NaN (inconclusive) when stable, with requests and
  latency samples of its own, is over the same objective ("SLO breached on stable and canary").
- ``kv-usage``: the highest canary pod's KV cache usage gauge, always judged (0 without the gauge); fails over
  ``slo.max_kv_cache_usage``, the KVCacheUsageHigh alert's threshold.

A restart of the canary fails judge()'s window; here Argo's own pod handling and the golden-output Job see it.

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
    from deployctl.engines import METRIC_ROLES, of

    a = cfg.rollout.analysis
    m = {role: of(cfg).metrics[role] for role in METRIC_ROLES}
    share = of(cfg).error_share
    w = window(cfg)
    nr_c, nr_s = _requests(cfg, m, ARG_CANARY, w), _requests(cfg, m, ARG_STABLE, w)
    if nr_c is None:
        return []
    need = max(a.min_requests, a.min_client_requests)
    canary_gate = f"({nr_c} >= {need})"
    gate = f"{canary_gate}\n  and ({nr_s} > 0)"
    out = []
    if m["rejected"] and m["success"]:
        server_fault = _sel(cfg, ARG_CANARY, f', reason!~"{client_reasons}"')
        errors = f"(sum(increase({m['rejected']}{server_fault}[{w}])) or vector(0))"
        out.append(PromMetric("error-rate", f"(\n  ({errors} / {nr_c})\n  and {gate}\n) or vector(NaN)",
                              a.max_error_rate, "canary error share over max_error_rate"))
    elif share is not None:  # the engine's own count (vLLM finished_reason="error", SGLang's HTTP 5xx)
        sep = ", " if share.total else ""
        errors = f"(sum(increase({share.counter}{_sel(cfg, ARG_CANARY, ', ' + share.errors)}[{w}])) or vector(0))"
        total = f"sum(increase({share.counter}{_sel(cfg, ARG_CANARY, sep + share.total)}[{w}]))"
        out.append(PromMetric("error-rate", f"(\n  ({errors} / {total})\n  and {gate}\n) or vector(NaN)",
                              a.max_error_rate, "canary error share over max_error_rate"))
    if m["ttft"]:
        samples = f"(sum(increase({m['ttft']}_count{_sel(cfg, ARG_CANARY)}[{w}])) >= {a.min_latency_samples})"
        stable_samples = (f"(sum(increase({m['ttft']}_count{_sel(cfg, ARG_STABLE)}[{w}])) >= "
                          f"{a.min_latency_samples})")
        for role, limit in (("ttft", a.max_p99_ttft_ratio), ("tpot", a.max_p99_tpot_ratio)):
            if not m[role]:
                continue
            c, s = _p99(cfg, m[role], ARG_CANARY, w), _p99(cfg, m[role], ARG_STABLE, w)
            ratio = f"(({c})\n    / ({s}))\n  * (({c}) - ({s}) > bool {a.min_p99_delta_s!r})"
            out.append(PromMetric(f"p99-{role}-ratio", f"(\n  ({ratio})\n  and {gate}\n  and {samples}\n) or vector(NaN)",
                                  limit, f"canary P99 {role.upper()} over max_p99_{role}_ratio × stable's"))
        for role, slo in (("ttft", cfg.slo.ttft_p99_s), ("tpot", cfg.slo.tpot_p99_s), ("e2e", cfg.slo.e2e_p99_s)):
            if not m[role] or slo is None:
                continue
            c, s = _p99(cfg, m[role], ARG_CANARY, w), _p99(cfg, m[role], ARG_STABLE, w)
            limit = slo * a.max_slo_factor
            # stable over the same objective with traffic and samples of its own: "SLO breached on stable and
            # canary", inconclusive (NaN), as deployctl.rollout.canaryrules.shared_breach
            shared = f"(({s}) > {limit!r})\n    and {stable_samples}\n    and ({nr_s} > 0)"
            out.append(PromMetric(f"p99-{role}-slo", f"(\n  (({c})\n  and {samples})\n  unless (\n    {shared}\n  )\n) "
                                                     "or vector(NaN)",
                                  slo * a.max_slo_factor,
                                  f"canary P99 {role.upper()} over slo.{role}_p99_s × max_slo_factor"))
    if m["kv_usage"]:
        out.append(PromMetric("kv-usage", f"max({m['kv_usage']}{_sel(cfg, ARG_CANARY)}) or vector(0)",
                              cfg.slo.max_kv_cache_usage, "canary KV cache usage over slo.max_kv_cache_usage"))
    return out


def measurements(cfg: DeployConfig, weight: Optional[int] = None) -> int:
    """Measurements of the canary step at ``weight``: its pause (rollout.steps[].pause, else pause_s) cut into
    interval_s windows (at least one), as `deployctl deploy` evaluates a window every interval_s through the step.
    ``weight`` None: the most any step below 100% takes."""
    a = cfg.rollout.analysis
    if weight is None:
        return max(measurements(cfg, w) for w in cfg.rollout.weights)
    return max(1, math.floor(cfg.rollout.pause_of(weight) / a.interval_s))


def counts_per_step(cfg: DeployConfig) -> bool:
    """True when the steps below 100% take different measurement counts: the AnalysisTemplate's ``count`` is then
    the ``measurements`` argument each Rollout step passes."""
    return len({measurements(cfg, w) for w in cfg.rollout.weights if w < 100}) > 1


def inconclusive_limit(cfg: DeployConfig) -> int:
    """Argo's inconclusiveLimit: the metric turns Inconclusive (the Rollout pauses for a human) once more than this
    many measurements were inconclusive; deploy pauses at ``inconclusive_limit`` (0: never, so all of a step's)."""
    limit = cfg.rollout.analysis.inconclusive_limit
    return max(0, limit - 1) if limit else measurements(cfg)


__all__ = ["ARG_CANARY", "ARG_STABLE", "HASH_LABEL", "PromMetric", "counts_per_step", "inconclusive_limit", "measurements",
           "prom_metrics", "window"]
