"""Side by side: B against A (the first --url is A, the baseline), level by level, as ratios B/A, each side's
knee, and a verdict in words.

Ratios: B's figure over A's (None when either is missing or A's is 0): throughput (output tokens/s, requests/s),
goodput (requests/s meeting the objectives), TTFT/TPOT/ITL/E2E P50 and P99. A latency ratio over 1 means B is
slower; a throughput ratio under 1 means B serves less. The verdict judges both sides by the same limits: the
objectives when given, else A's own knee limits (2x A's level-1 P99), so that "holds" means the same on both.
"""
from __future__ import annotations

from typing import Sequence

from deployctl.bench.knee import Knee, find_knee
from deployctl.bench.stats import LevelStats, Objectives

LATENCIES = (("ttft", "ttft_ms"), ("tpot", "tpot_ms"), ("itl", "itl_ms"), ("e2e", "e2e_ms"))


def _ratio(b: float | None, a: float | None) -> float | None:
    if a is None or b is None or a == 0:
        return None
    return round(b / a, 3)


def level_ratios(a: LevelStats, b: LevelStats) -> dict:
    """{"concurrency", "output_tokens_per_s", "requests_per_s", "goodput_rps", "ttft_p50", "ttft_p99", ...}: B/A."""
    out: dict = {"concurrency": a.concurrency,
                 "output_tokens_per_s": _ratio(b.output_tokens_per_s, a.output_tokens_per_s),
                 "requests_per_s": _ratio(b.requests_per_s, a.requests_per_s),
                 "goodput_rps": _ratio(b.goodput["requests_per_s"] if b.goodput else None,
                                       a.goodput["requests_per_s"] if a.goodput else None)}
    for name, key in LATENCIES:
        for q in ("p50", "p99"):
            out[f"{name}_{q}"] = _ratio(getattr(b, key)[q], getattr(a, key)[q])
    return out


def _holds(knee: Knee) -> str:
    return f"up to {knee.concurrency} concurrent" if knee.concurrency is not None else "at no level"


LABELS = {"output_tokens_per_s": "output tok/s", "tpot_p50": "P50 TPOT", "ttft_p99": "P99 TTFT"}


def compare(a: Sequence[LevelStats], b: Sequence[LevelStats], objectives: Objectives, a_knee: Knee,
            max_error_rate: float = 0.01, names: tuple[str, str] = ("A", "B")) -> dict:
    """{"levels": [level_ratios], "limits": {...}, "knees": {"A": int|None, "B": ...} under the shared limits,
    "verdict": str}."""
    shared = Objectives(ttft_ms=objectives.ttft_ms if objectives.ttft_ms is not None else a_knee.ttft_p99_limit_ms,
                        tpot_ms=objectives.tpot_ms if objectives.tpot_ms is not None else a_knee.tpot_p99_limit_ms,
                        e2e_ms=objectives.e2e_ms)
    ka = find_knee(a, shared, max_error_rate=max_error_rate)
    kb = find_knee(b, shared, max_error_rate=max_error_rate)
    source = "the objectives" if objectives.any else f"{names[0]}'s limits, 2x its level-1 P99"
    limits = [f"P99 TTFT <= {shared.ttft_ms:.1f} ms" if shared.ttft_ms is not None else "",
              f"P99 TPOT <= {shared.tpot_ms:.1f} ms" if shared.tpot_ms is not None else ""]
    limit_text = " and ".join(x for x in limits if x) or "no latency limit"
    (k1, n1), (k2, n2) = ([(kb, names[1]), (ka, names[0])] if (kb.concurrency or 0) > (ka.concurrency or 0)
                          else [(ka, names[0]), (kb, names[1])])
    if ka.concurrency == kb.concurrency:
        verdict = f"both hold {limit_text} {_holds(ka)} ({source})"
    else:
        verdict = f"{n1} holds {limit_text} {_holds(k1)} ({source}), {n2} {_holds(k2)}"
    ratios = [level_ratios(x, y) for x, y in zip(a, b)]
    top = ratios[-1] if ratios else {}
    parts = [f"{label} {top[k]:.2f}x" for k, label in LABELS.items() if top.get(k) is not None]
    if parts:
        verdict += f"; at concurrency {top['concurrency']}, {names[1]}/{names[0]}: " + ", ".join(parts)
    return {"levels": ratios, "limits": {"ttft_p99_ms": shared.ttft_ms, "tpot_p99_ms": shared.tpot_ms,
                                         "source": source},
            "knees": {names[0]: ka.concurrency, names[1]: kb.concurrency}, "verdict": verdict}
