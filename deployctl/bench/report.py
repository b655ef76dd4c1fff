"""A whole bench run: the generator's overhead, the ladder, the knee, and the JSON document.

JSON keys (stable; more may be added): ``url``, ``route``, ``model``, ``config``, ``objectives``,
``loadgen_overhead``, ``levels`` (one per concurrency: LevelStats plus vLLM's result keys, see vllm_format),
``knee`` (Knee), ``warnings``, ``notes``, ``loop`` ("open" or "closed"), ``max_model_len``, ``workload``, ``warmup``,
``recommendation`` (deployctl.bench.recommend).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Sequence

import httpx

from deployctl.bench import diagnose
from deployctl.bench.knee import Knee, find_knee
from deployctl.bench.ladder import LadderConfig, ProgressFn, run_ladders, warm_up
from deployctl.bench.overhead import Overhead, measure_overhead
from deployctl.bench.recommend import recommendation
from deployctl.bench.stats import LevelStats
from deployctl.bench.vllm_format import vllm_keys
from deployctl.bench.workload import BenchRequest

# A level taking in more than this share of the generator's measured chunk capacity may be limited by the
# generator rather than by the server.
LOADGEN_BUSY_SHARE = 0.5


@dataclass
class BenchReport:
    """Everything a run measured; ``to_json`` gives the --json document."""

    cfg: LadderConfig
    levels: list[LevelStats]
    knee: Knee
    overhead: Overhead | None
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    max_model_len: int | None = None
    workload: dict = field(default_factory=dict)
    warmup: dict = field(default_factory=dict)  # ladder.warm_up's result: the requests sent before level 1

    @property
    def num_ok(self) -> int:
        return sum(s.num_ok for s in self.levels)

    def to_json(self) -> dict:
        cfg = self.cfg
        return {
            "url": cfg.target.base_url,
            "route": cfg.target.route,
            "model": cfg.target.model,
            "config": {
                "concurrency": list(cfg.concurrencies),
                "requests_per_level": cfg.requests_per_level,
                "rate": cfg.rate,
                "timeout_s": cfg.timeout,
                "seed": cfg.seed,
                "max_level_s": cfg.max_level_s,
                "metrics_url": cfg.metrics_url,
            },
            "objectives": asdict(cfg.objectives),
            "loadgen_overhead": self.overhead.to_json() if self.overhead else None,
            "loop": "open" if cfg.rate else "closed",
            "max_model_len": self.max_model_len,
            "workload": dict(self.workload),
            "levels": [{**s.to_json(), **vllm_keys(s)} for s in self.levels],
            "knee": self.knee.to_json(),
            "recommendation": recommendation(self.knee, cfg.target.base_url),
            "warnings": list(self.warnings),
            "notes": list(self.notes),
            "warmup": dict(self.warmup),
        }


def detect_model(base_url: str, headers: dict[str, str], timeout: float = 10.0) -> str | None:
    """The first model id of GET /v1/models, or None when the server cannot say (down, error, no models)."""
    try:
        resp = httpx.get(base_url + "/v1/models", headers=headers, timeout=timeout, trust_env=False)
        data = resp.json().get("data") if resp.status_code == 200 else None
        return str(data[0]["id"]) if data else None
    except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError):
        return None


def run_bench(
    cfg: LadderConfig,
    requests: Sequence[BenchRequest],
    on_progress: ProgressFn | None = None,
    measure_loadgen: bool = True,
    max_error_rate: float = 0.01,
) -> BenchReport:
    """Measure the generator's overhead (at the ladder's top concurrency), run the ladder, find the knee."""
    return run_side_by_side([cfg], requests, on_progress, measure_loadgen, max_error_rate)[0]


def run_side_by_side(
    cfgs: Sequence[LadderConfig],
    requests: Sequence[BenchRequest],
    on_progress: ProgressFn | None = None,
    measure_loadgen: bool = True,
    max_error_rate: float = 0.01,
) -> list[BenchReport]:
    """As run_bench for each config, the ladders interleaved level by level on the same requests (ladder.run_ladders);
    the generator's overhead is measured once. One BenchReport per config."""
    overhead = measure_overhead(max(cfgs[0].concurrencies)) if measure_loadgen else None
    warm = [warm_up(cfg, requests) for cfg in cfgs]
    sides = run_ladders(cfgs, requests, on_progress)
    reports = [_report(cfg, levels, overhead, max_error_rate) for cfg, levels in zip(cfgs, sides)]
    for rep, w in zip(reports, warm):
        rep.warmup = w
        if w["requests"]:
            took = ", ".join("failed" if t is None else f"{t:g} s" for t in w["e2e_s"])
            rep.notes.insert(0, f"warm-up: {w['requests']} request(s) before level 1, counted in no level ({took})"
                             + (f"; errors: {'; '.join(w['errors'])[:300]}" if w["errors"] else ""))
    return reports


def _report(cfg: LadderConfig, levels: list[LevelStats], overhead: Overhead | None, max_error_rate: float) -> BenchReport:
    knee = find_knee(levels, cfg.objectives, max_error_rate=max_error_rate)
    warnings = []
    if overhead is not None:
        for s in levels:
            chunks_per_s = s.output_tokens_per_s  # at most one chunk per token
            capacity = overhead.capacity_chunks_per_s
            if capacity and chunks_per_s > LOADGEN_BUSY_SHARE * capacity:
                warnings.append(
                    f"concurrency {s.concurrency}: {chunks_per_s:.0f} tokens/s is over "
                    f"{LOADGEN_BUSY_SHARE:.0%} of the generator's capacity ({capacity:.0f} chunks/s): "
                    "the generator may be the bottleneck; run bench from another machine"
                )
    warnings += [w for w in (diagnose.open_loop_slip(s, s.concurrency) for s in levels) if w]
    missing = sum(s.num_usage_missing for s in levels)
    if missing:
        warnings.append(
            f"{missing} responses had no usage: output tokens counted as text chunks; "
            "the server should support stream_options.include_usage"
        )
    hint = diagnose.refused_field(levels)
    if hint:
        warnings.append(hint)
    return BenchReport(cfg, levels, knee, overhead, warnings, diagnose.notes(levels))
