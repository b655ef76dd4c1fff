"""The knee of the ladder: the highest concurrency at which tail latency still holds.

A level holds when its P99 TTFT and P99 TPOT are within the objectives (or, for an objective not given, within
``baseline_factor`` (2x) of the first level's P99) and its error rate is at most ``max_error_rate``. The knee is
the last level of the unbroken run of holding levels from the bottom of the ladder (a level that holds above a
broken one is noise, not capacity).

Recommendations: ``max_num_seqs`` = the knee's concurrency (the batch size the server sustains within the
objectives); a rate-limit threshold of ``headroom`` (0.8) x the knee's measured requests/s, so that the router
sheds load before the server reaches the knee.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Sequence

from deployctl.bench.stats import LevelStats, Objectives


@dataclass(frozen=True)
class Knee:
    """The verdict. ``concurrency`` is None when even the first level breaks the limits. Limits in ms;
    ``criterion`` is "objectives", "2x_level1" or "objectives+2x_level1" (mixed)."""

    concurrency: int | None
    criterion: str
    ttft_p99_limit_ms: float | None
    tpot_p99_limit_ms: float | None
    max_error_rate: float
    recommended_max_num_seqs: int | None
    rate_limit_rps: float | None
    headroom: float
    broken_at: int | None
    reason: str

    def to_json(self) -> dict:
        return asdict(self)


def _limit(objective: float | None, level1: float | None, factor: float) -> tuple[float | None, bool]:
    if objective is not None:
        return objective, True
    if level1 is None:
        return None, False
    return level1 * factor, False


def _why_broken(s: LevelStats, ttft_lim: float | None, tpot_lim: float | None, max_err: float) -> str | None:
    if s.num_ok == 0:
        return f"no request succeeded ({', '.join(f'{k}: {v}' for k, v in s.errors.items()) or 'none sent'})"
    if s.error_rate > max_err:
        return f"error rate {s.error_rate:.1%} > {max_err:.1%}"
    ttft, tpot = s.ttft_ms["p99"], s.tpot_ms["p99"]
    if ttft_lim is not None and ttft is not None and ttft > ttft_lim:
        return f"P99 TTFT {ttft:.1f} ms > {ttft_lim:.1f} ms"
    if tpot_lim is not None and tpot is not None and tpot > tpot_lim:
        return f"P99 TPOT {tpot:.2f} ms > {tpot_lim:.2f} ms"
    return None


def find_knee(
    levels: Sequence[LevelStats],
    objectives: Objectives = Objectives(),
    baseline_factor: float = 2.0,
    max_error_rate: float = 0.01,
    headroom: float = 0.8,
) -> Knee:
    """The knee of ``levels`` (in ladder order). See the module docstring for the rule."""
    first = levels[0] if levels else None
    ttft_lim, ttft_obj = _limit(objectives.ttft_ms, first.ttft_ms["p99"] if first else None, baseline_factor)
    tpot_lim, tpot_obj = _limit(objectives.tpot_ms, first.tpot_ms["p99"] if first else None, baseline_factor)
    kinds = {ttft_obj, tpot_obj}
    criterion = "objectives" if kinds == {True} else "2x_level1" if kinds == {False} else "objectives+2x_level1"
    if baseline_factor != 2.0:
        criterion = criterion.replace("2x", f"{baseline_factor:g}x")
    knee: LevelStats | None = None
    broken_at, reason = None, "every level held"
    for s in levels:
        why = _why_broken(s, ttft_lim, tpot_lim, max_error_rate)
        if why is not None:
            broken_at, reason = s.concurrency, f"concurrency {s.concurrency}: {why}"
            break
        knee = s
    if knee is not None and broken_at is None and levels:
        reason = f"every level held up to {knee.concurrency}; the knee may be higher: extend the ladder"
    rps = None
    if knee is not None and not math.isnan(knee.requests_per_s):
        rps = round(knee.requests_per_s * headroom, 2)
    return Knee(
        concurrency=knee.concurrency if knee else None,
        criterion=criterion,
        ttft_p99_limit_ms=round(ttft_lim, 3) if ttft_lim is not None else None,
        tpot_p99_limit_ms=round(tpot_lim, 3) if tpot_lim is not None else None,
        max_error_rate=max_error_rate,
        recommended_max_num_seqs=knee.concurrency if knee else None,
        rate_limit_rps=rps,
        headroom=headroom,
        broken_at=broken_at,
        reason=reason,
    )
