"""Per-level statistics: percentiles of TTFT, TPOT, ITL and E2E latency, throughput, errors, goodput.

Percentiles: linear interpolation between closest ranks (Hyndman & Fan type 7, numpy's default).
TPOT of one request: (E2E latency - TTFT) / (output tokens - 1), defined for requests with at least two output
tokens (vLLM benchmarks/benchmark_serving.py, and the field's definition). Goodput: the share of all requests sent
that succeeded and met every given objective (DistServe, Zhong et al. 2024).

Empty answers (successes with no output text) count as successes: in E2E and throughput, not in TTFT, TPOT or
ITL, and separately in ``num_empty``. Open loop (``rate`` set): ``schedule_lag_ms`` is how late each request was
sent against its Poisson schedule (P50/P99/max) and ``achieved_rate`` the rate requests were actually sent at,
(n - 1) / (last send - first send).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from deployctl.bench.client import RequestResult

QUANTILES = (0.5, 0.9, 0.99)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) of ``values`` by linear interpolation; NaN when empty."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def tpot(result: RequestResult) -> float | None:
    """(E2E - TTFT) / (output_tokens - 1) in seconds, or None for failures and single-token outputs."""
    if not result.ok or result.ttft is None or result.e2e is None or result.output_tokens < 2:
        return None
    return (result.e2e - result.ttft) / (result.output_tokens - 1)


@dataclass(frozen=True)
class Objectives:
    """Latency objectives in milliseconds; None means not set."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None

    @property
    def any(self) -> bool:
        return any(v is not None for v in (self.ttft_ms, self.tpot_ms, self.e2e_ms))

    def met_by(self, r: RequestResult) -> bool:
        if not r.ok:
            return False
        t = tpot(r)
        return (
            # an empty answer has no first token: it was answered when it ended
            (self.ttft_ms is None or ((r.ttft if r.ttft is not None else r.e2e) or 0.0) * 1e3 <= self.ttft_ms)
            and (self.tpot_ms is None or t is None or t * 1e3 <= self.tpot_ms)
            and (self.e2e_ms is None or (r.e2e is not None and r.e2e * 1e3 <= self.e2e_ms))
        )


def summarize(values_s: Sequence[float]) -> dict[str, float | None]:
    """{"mean", "p50", "p90", "p99"} in milliseconds (None when there are no values)."""
    if not values_s:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    out: dict[str, float | None] = {"mean": round(sum(values_s) / len(values_s) * 1e3, 3)}
    for q in QUANTILES:
        out[f"p{round(q * 100)}"] = round(percentile(values_s, q) * 1e3, 3)
    return out


@dataclass
class LevelStats:
    """The numbers of one ladder level. Latency dicts are in ms (see ``summarize``); rates per second."""

    concurrency: int
    rate: float | None
    num_requests: int
    num_ok: int
    num_errors: int
    errors: dict[str, int]
    error_examples: dict[str, str]
    error_rate: float
    duration_s: float
    requests_per_s: float
    output_tokens_per_s: float
    total_output_tokens: int
    total_prompt_tokens: int | None
    num_usage_missing: int
    ttft_ms: dict[str, float | None]
    tpot_ms: dict[str, float | None]
    itl_ms: dict[str, float | None]
    e2e_ms: dict[str, float | None]
    goodput: dict[str, float] | None = None
    server: dict | None = None
    loop: str = "closed"
    num_empty: int = 0
    num_no_done: int = 0
    error_codes: dict[str, int] = field(default_factory=dict)
    achieved_rate: float | None = None
    scheduled_rate: float | None = None
    schedule_lag_ms: dict[str, float | None] | None = None
    slot_wait_share: float | None = None
    raw_ttft_s: list[float] = field(default_factory=list, repr=False)
    raw_tpot_s: list[float] = field(default_factory=list, repr=False)
    raw_e2e_s: list[float] = field(default_factory=list, repr=False)
    raw_itl_s: list[float] = field(default_factory=list, repr=False)
    raw_input_lens: list[int] = field(default_factory=list, repr=False)
    raw_output_lens: list[int] = field(default_factory=list, repr=False)

    def to_json(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if not k.startswith("raw_")}
        return d


def level_stats(
    concurrency: int,
    rate: float | None,
    results: Sequence[RequestResult],
    duration_s: float,
    objectives: Objectives | None = None,
) -> LevelStats:
    """Aggregate one level's results measured over ``duration_s`` seconds of wall time."""
    ok = [r for r in results if r.ok]
    errors: dict[str, int] = {}
    codes: dict[str, int] = {}
    examples: dict[str, str] = {}
    for r in results:
        if r.error is not None:
            errors[r.error] = errors.get(r.error, 0) + 1
            examples.setdefault(r.error, r.detail)
            if r.error_code:
                key = f"{r.error} {r.error_code}"
                codes[key] = codes.get(key, 0) + 1
    ttfts = [r.ttft for r in ok if r.ttft is not None]
    e2es = [r.e2e for r in ok if r.e2e is not None]
    tpots = [t for t in (tpot(r) for r in ok) if t is not None]
    itls = [x for r in ok for x in r.itl]
    out_tokens = sum(r.output_tokens for r in ok)
    prompt_counts = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]
    dur = max(duration_s, 1e-9)
    goodput = None
    if objectives is not None and objectives.any:
        met = sum(1 for r in results if objectives.met_by(r))
        goodput = {
            "num_met": met,
            "ratio": round(met / len(results), 4) if results else 0.0,
            "requests_per_s": round(met / dur, 3),
        }
    return LevelStats(
        concurrency=concurrency,
        rate=rate,
        num_requests=len(results),
        num_ok=len(ok),
        num_errors=len(results) - len(ok),
        errors=dict(sorted(errors.items())),
        error_examples=examples,
        error_rate=round((len(results) - len(ok)) / len(results), 4) if results else 0.0,
        duration_s=round(duration_s, 3),
        requests_per_s=round(len(ok) / dur, 3),
        output_tokens_per_s=round(out_tokens / dur, 2),
        total_output_tokens=out_tokens,
        total_prompt_tokens=sum(prompt_counts) if prompt_counts else None,
        num_usage_missing=sum(1 for r in ok if not r.usage_reported),
        ttft_ms=summarize(ttfts),
        tpot_ms=summarize(tpots),
        itl_ms=summarize(itls),
        e2e_ms=summarize(e2es),
        goodput=goodput,
        loop="closed" if rate is None else "open",
        num_empty=sum(1 for r in ok if r.empty),
        num_no_done=sum(1 for r in ok if r.no_done),
        error_codes=dict(sorted(codes.items())),
        **_schedule(rate, results),
        raw_ttft_s=ttfts,
        raw_tpot_s=tpots,
        raw_e2e_s=e2es,
        raw_itl_s=itls,
        raw_input_lens=[r.prompt_tokens or 0 for r in ok],
        raw_output_lens=[r.output_tokens for r in ok],
    )


def _rate(times: list[float]) -> float | None:
    """(n - 1) / (last - first), requests/s; None for fewer than two distinct times."""
    if len(times) < 2 or max(times) <= min(times):
        return None
    return round((len(times) - 1) / (max(times) - min(times)), 3)


def _schedule(rate: float | None, results: Sequence[RequestResult]) -> dict:
    """achieved_rate, scheduled_rate, schedule_lag_ms and slot_wait_share (the time the sender waited for a free
    concurrency slot over the largest lag, at most 1) of an open-loop level; {} for a closed loop."""
    if rate is None:
        return {}
    lags = [r.schedule_lag for r in results if r.schedule_lag is not None]
    max_lag = max(lags, default=0.0)
    return {
        "achieved_rate": _rate([r.start for r in results]),
        "scheduled_rate": _rate([r.start - r.schedule_lag for r in results if r.schedule_lag is not None]),
        "schedule_lag_ms": {
            "p50": round(percentile(lags, 0.5) * 1e3, 3) if lags else None,
            "p99": round(percentile(lags, 0.99) * 1e3, 3) if lags else None,
            "max": round(max(lags) * 1e3, 3) if lags else None,
        },
        # lag accumulates: while the sender waits for a slot every later request falls behind, so the time spent
        # waiting for slots is compared with the largest lag, not with the sum of the lags
        "slot_wait_share": round(min(1.0, sum(r.slot_wait for r in results) / max_lag), 3) if max_lag > 0 else None,
    }
