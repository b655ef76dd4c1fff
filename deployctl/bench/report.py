"""A whole bench run: the generator's overhead, the ladder, the knee, and the JSON document.

JSON keys (stable; more may be added): ``url``, ``route``, ``model``, ``config``, ``objectives``,
``loadgen_overhead``, ``levels`` (one per concurrency: LevelStats), ``knee`` (Knee), ``warnings``.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Sequence

import httpx

from deployctl.bench.knee import Knee, find_knee
from deployctl.bench.ladder import LadderConfig, ProgressFn, run_ladder
from deployctl.bench.overhead import Overhead, measure_overhead
from deployctl.bench.stats import LevelStats
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
            "levels": [s.to_json() for s in self.levels],
            "knee": self.knee.to_json(),
            "warnings": list(self.warnings),
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
    overhead = measure_overhead(max(cfg.concurrencies)) if measure_loadgen else None
    levels = run_ladder(cfg, requests, on_progress)
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
    missing = sum(s.num_usage_missing for s in levels)
    if missing:
        warnings.append(
            f"{missing} responses had no usage: output tokens counted as text chunks; "
            "the server should support stream_options.include_usage"
        )
    return BenchReport(cfg, levels, knee, overhead, warnings)
