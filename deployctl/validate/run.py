"""One validation run: the layers asked for, in order (functional, latency, stability), each judged on its own.

Stability's load is ``load_fraction`` x the latency layer's knee (at least 1) when latency ran and found one, else
``load_concurrency``. A layer whose set-up fails (e.g. the server cannot be reached) fails with that reason; the
others still run.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Optional

import httpx

from deployctl.bench import fit, workload
from deployctl.bench.client import Target
from deployctl.bench.ladder import LadderConfig
from deployctl.bench.stats import Objectives
from deployctl.validate.client import Endpoint
from deployctl.validate.functional import run_functional
from deployctl.validate.latency import run_latency
from deployctl.validate.result import LayerResult, ValidationRun
from deployctl.validate.stability import StabilityConfig, run_stability

LAYERS = ("functional", "latency", "stability", "failover")  # failover: opt-in, with -c (it kills a runtime)


@dataclass(frozen=True)
class Options:
    """Everything a run can be told (the CLI's flags). Times in seconds."""

    layers: tuple[str, ...] = LAYERS
    duration_s: float = 600.0
    concurrencies: tuple[int, ...] = (1, 2, 4, 8)
    requests: int = 16
    load_fraction: float = 0.5
    load_concurrency: int = 2
    burst_s: float = 10.0
    gap_s: float = 2.0
    timeout_s: float = 120.0
    objectives: Objectives = field(default_factory=Objectives)
    max_error_rate: float = 0.01
    max_repeats: int = 8
    metrics_urls: tuple[str, ...] = ()
    engine_kind: str = "deployctl-runtime"
    seed: int = 0
    failover_host: Optional[str] = None
    failover_after_s: float = 15.0


def validate(ep: Endpoint, opts: Options, on_layer: Optional[Callable[[str, LayerResult | None], None]] = None,
             cfg: Any = None) -> ValidationRun:
    """Run ``opts.layers`` against ``ep``; ``on_layer(name, None)`` before and ``on_layer(name, result)`` after each.
    ``cfg``: the DeployConfig the failover layer needs (its hosts, launcher and router)."""
    run = ValidationRun(ep.base_url, ep.model, ep.max_model_len,
                        datetime.now(timezone.utc).isoformat(timespec="seconds"))
    t0 = time.monotonic()
    knee: Optional[int] = None
    if any(n in opts.layers for n in ("functional", "latency", "stability")):
        from dataclasses import replace

        from deployctl.validate.accepts import left_out, refused_fields

        ep = replace(ep, refused=refused_fields(ep, min(opts.timeout_s, 30.0)))
    for name in opts.layers:
        if on_layer:
            on_layer(name, None)
        try:
            if name == "functional":
                res = run_functional(ep, max_repeats=opts.max_repeats, timeout=opts.timeout_s, seed=opts.seed)
            elif name == "latency":
                res = run_latency(ep, concurrencies=opts.concurrencies, requests=opts.requests,
                                  objectives=opts.objectives, max_error_rate=opts.max_error_rate,
                                  timeout=opts.timeout_s, seed=opts.seed)
                knee = (res.details.get("knee") or {}).get("concurrency")
            elif name == "stability":
                res = _stability(ep, opts, knee)
            else:
                res = _failover(ep, opts, cfg)
        except httpx.HTTPError as exc:
            res = LayerResult(name, "fail", f"{name}: {ep.base_url} did not answer: {exc}", [f"{name}: {exc}"])
        if ep.refused and name != "failover":
            res.details["left_out"] = dict(ep.refused)
            res.summary += f" ({left_out(ep)})"
        run.layers.append(res)
        if on_layer:
            on_layer(name, res)
    run.duration_s = time.monotonic() - t0
    return run


def _stability(ep: Endpoint, opts: Options, knee: Optional[int]) -> LayerResult:
    conc = max(1, int(opts.load_fraction * knee)) if knee else opts.load_concurrency
    target = Target(base_url=ep.base_url, route="chat", model=ep.model, api_key=ep.api_key,
                    ignore_eos="ignore_eos" not in dict(ep.refused))
    ladder = LadderConfig(target=target, concurrencies=(conc,), timeout=opts.timeout_s, seed=opts.seed)
    requests = _stability_requests(target, ep.max_model_len, opts)
    cfg = StabilityConfig(duration_s=opts.duration_s, concurrency=conc, burst_s=min(opts.burst_s, opts.duration_s),
                          gap_s=opts.gap_s, max_error_rate=opts.max_error_rate, engine_kind=opts.engine_kind)
    res = run_stability(cfg, ladder, requests, opts.metrics_urls or (ep.base_url + "/metrics",))
    res.details["concurrency_from"] = (f"{opts.load_fraction:g} x the knee {knee}" if knee
                                       else f"--load-concurrency {conc} (no knee measured)")
    return res


def _stability_requests(target: Target, max_model_len: Optional[int], opts: Options) -> list:
    """64 synthetic requests that fit with room to spare: a sustained load must not trip over the context limit
    (a 400 would count as an error): max_tokens a quarter of the context (at most 128), prompts of up to half of
    what is left, by the server's measured tokens per word (deployctl.bench.fit)."""
    if max_model_len is None:
        return workload.synthetic(64, "32-128", "128", opts.seed)
    out = max(1, min(128, max_model_len // 4))
    est = fit.probe_tokens(target, min(opts.timeout_s, 30.0))
    words = max(2, est.words_for(0.5 * (max_model_len - out)))
    return workload.synthetic(64, f"{max(1, words // 2)}-{words}", str(out), opts.seed)


def _failover(ep: Endpoint, opts: Options, cfg: Any) -> LayerResult:
    if cfg is None:
        return LayerResult("failover", "skipped", "failover: needs -c deploy.yaml (its hosts and router)")
    from deployctl.validate.failover import run_failover

    return run_failover(cfg, ep.base_url, model=ep.model, api_key=ep.api_key, victim=opts.failover_host,
                        concurrency=max(2, opts.load_concurrency), after_s=opts.failover_after_s,
                        timeout=opts.timeout_s)
