"""The latency layer: the bench ladder (deployctl.bench, its code unchanged) under deploy.yaml's SLOs.

The objectives are ``slo.ttft_p99_s`` and ``slo.tpot_p99_s`` (ms here, as bench's), the error bound
``slo.max_error_rate``; without a deploy.yaml the knee rule falls back to 2x the first level's P99
(deployctl.bench.knee). Verdict: ``fail`` when no level holds (not even concurrency 1 meets the SLOs) or nothing
succeeded; else ``pass`` with the knee and the recommendation (max_num_seqs, router limits).
"""
from __future__ import annotations

from typing import Optional

from deployctl.bench import prepare
from deployctl.bench.client import Target
from deployctl.bench.ladder import LadderConfig, ProgressFn
from deployctl.bench.report import run_bench
from deployctl.bench.stats import Objectives
from deployctl.validate.client import Endpoint
from deployctl.validate.result import LayerResult


def objectives_from_slo(slo) -> Objectives:
    """deploy.yaml's ``slo`` (seconds) as bench objectives (ms); None: no objectives (2x level 1)."""
    if slo is None:
        return Objectives()
    return Objectives(slo.ttft_p99_s * 1000.0, slo.tpot_p99_s * 1000.0, None)


def run_latency(ep: Endpoint, *, concurrencies: tuple[int, ...] = (1, 2, 4, 8), requests: int = 16,
                objectives: Objectives = Objectives(), max_error_rate: float = 0.01, timeout: float = 60.0,
                seed: int = 0, metrics_url: Optional[str] = None, output_len: Optional[str] = None,
                on_progress: Optional[ProgressFn] = None) -> LayerResult:
    """Run the ladder (synthetic prompts fitted to max_model_len, ``ignore_eos`` so outputs reach max_tokens).
    ``details``: the bench JSON document (levels, knee, recommendation)."""
    target = Target(base_url=ep.base_url, route="chat", model=ep.model, api_key=ep.api_key,
                    ignore_eos="ignore_eos" not in dict(ep.refused))  # validate.accepts
    cfg = LadderConfig(target=target, concurrencies=concurrencies, requests_per_level=requests, timeout=timeout,
                       seed=seed, objectives=objectives, metrics_url=metrics_url, warmup=1)
    need = max(cfg.level_requests(c) for c in concurrencies)
    work = prepare.build(need, seed, target, ep.max_model_len, min(timeout, 30.0), output_len=output_len)
    rep = run_bench(cfg, work.requests, on_progress, measure_loadgen=False, max_error_rate=max_error_rate)
    rep.max_model_len, rep.workload = ep.max_model_len, work.info
    doc = rep.to_json()
    knee = rep.knee
    limits = ", ".join(x for x in (f"P99 TTFT <= {knee.ttft_p99_limit_ms:g} ms" if knee.ttft_p99_limit_ms else "",
                                   f"P99 TPOT <= {knee.tpot_p99_limit_ms:g} ms" if knee.tpot_p99_limit_ms else "") if x)
    if rep.num_ok == 0 or knee.concurrency is None:
        why = "no request succeeded" if rep.num_ok == 0 else knee.reason
        return LayerResult("latency", "fail", f"latency: no level holds ({limits}, {knee.criterion}): {why}",
                           [f"knee: {why}"], doc)
    summary = (f"latency: knee at concurrency {knee.concurrency} ({limits}, {knee.criterion}); {knee.reason}; "
               f"recommend max_num_seqs {knee.recommended_max_num_seqs}")
    return LayerResult("latency", "pass", summary, [], doc)
