"""One window's verdict from the engine metrics (deployctl.rollout.analysis.judge) and the active probes
(deployctl.rollout.probes), and the rule that pauses a rollout after too many inconclusive windows.

Probes (``judge_probes``), client-side medians over the window's successful probes:
- every probe to a canary host failed while stable answered → ``fail`` (the canary stopped answering);
- every probe on both sides failed → ``inconclusive`` (deployctl cannot reach the hosts: not the canary's fault);
- canary probe error share over ``max_error_rate`` and more errors than stable → ``fail``;
- only in a window without enough real traffic (``latency``; with traffic the canary and stable carry different
  loads, e.g. all of it on the canary at 100%, and the engine metrics judge latency): fewer than
  ``probes.min_samples`` successful probes on a side → ``inconclusive``; median TTFT or TPOT canary/stable over
  ``max_p99_ttft_ratio`` / ``max_p99_tpot_ratio`` with the difference over ``min_p99_delta_s`` → ``fail`` (the P99
  limits applied to medians: a P99 of a few probes is noise);
- else ``pass``.

Combination (``combine``): a fail from either source fails (a quiet window included: judge fails the canary on its
own figures, its SLO, KV usage and restarts, before it looks at the traffic); a metrics pass passes (source ``metrics``, or
``metrics+probes`` when the probes passed too); a metrics window that is inconclusive only for lack of real
traffic (too few requests or latency samples) takes the probes' verdict (source ``probes``), except that a pass
needs the canary to have served ``min_client_requests`` client generation requests (probes alone never promote unless it is 0:
the window stays inconclusive) and a window short of ``min_latency_samples`` stays inconclusive ("cannot judge:
N samples": a P99 of a few requests is noise, the probes' medians do not stand in for it); any other inconclusive (NaN, counter reset, stable without traffic) stays
inconclusive with its reason.

Streaks (``InconclusiveStreak``): ``inconclusive_limit`` inconclusive windows in a row pause the rollout for a
human. Windows that are ``held`` (too little client traffic, or the SLO breached on both sides) do not count:
they hold the step until a window passes or its ``max_hold`` runs out (deployctl.rollout.weightstep).
"""
from __future__ import annotations

from dataclasses import asdict
from typing import Optional

from deployctl.rollout.probes import ProbeStats

CANNOT_JUDGE = "cannot judge: "  # how a window short of what its statistic needs begins its reason (analysis._judge)
LOW_TRAFFIC = ("canary requests < min_requests", "canary latency samples < min_latency_samples",
               "canary client requests < min_client_requests")
# a window short of latency samples: the probes may fail it, never pass it (their few timings are no P99)
FEW_SAMPLES = "canary latency samples < min_latency_samples"


def held(v) -> bool:
    """The inconclusive Verdict ``v`` holds its step (deployctl.rollout.weightstep) rather than counting toward the
    inconclusive_limit pause: too little client traffic to judge, or the SLO breached on stable and canary alike."""
    from deployctl.rollout.canaryrules import SLO_BOTH

    return v.result == "inconclusive" and (low_traffic(v) or v.reason.startswith(SLO_BOTH))


def idle(v, min_client_requests: int) -> bool:
    """The window's canary served fewer than ``min_client_requests`` client generation requests (a probes-only
    window; a GET of /v1/models is no proof of serving users)."""
    return v.canary.generations < min_client_requests


def low_traffic(v) -> bool:
    """The metrics Verdict ``v`` is inconclusive only for lack of real traffic."""
    return v.result == "inconclusive" and any(k in v.reason for k in LOW_TRAFFIC)


def judge_probes(a, canary: ProbeStats, stable: ProbeStats, *, latency: bool = True) -> tuple[str, str]:
    """(result, reason) for the probes of one window; ``a`` is the AnalysisConfig; ``latency``: judge the probes'
    latencies too (rules in the module doc)."""
    if canary.sent == 0 and stable.sent == 0:
        return "inconclusive", "no probes answered yet"
    if canary.failing and stable.samples:
        return "fail", (f"canary {', '.join(canary.failing)} does not answer probes ({canary.errors}/{canary.sent} "
                        f"failed: {canary.error_detail}); stable answered {stable.samples}")
    if canary.failing and stable.failing and not canary.samples and not stable.samples:
        return "inconclusive", (f"probes reach neither canary nor stable from here ({stable.error_detail}): "
                                "not judged on probes")
    if canary.sent and canary.error_rate > a.max_error_rate and canary.errors > stable.errors:
        return "fail", (f"canary probe errors {canary.errors}/{canary.sent} ({canary.error_rate:.0%}) > max_error_rate "
                        f"{a.max_error_rate:.1%} (stable {stable.errors}/{stable.sent}): {canary.error_detail}")
    if not latency:
        return "pass", ""
    need = a.probes.min_samples
    if canary.samples < need or stable.samples < need:
        return "inconclusive", f"probe samples canary {canary.samples}, stable {stable.samples} < min_samples {need}"
    for label, c, s, limit in (("TTFT", canary.ttft_s, stable.ttft_s, a.max_p99_ttft_ratio),
                               ("TPOT", canary.tpot_s, stable.tpot_s, a.max_p99_tpot_ratio)):
        if c is None or s is None or s <= 0:
            continue
        if c / s > limit and c - s > a.min_p99_delta_s:
            return "fail", (f"canary probe median {label} {c * 1000:.1f} ms is {c / s:.1f}× stable {s * 1000:.1f} ms "
                            f"> max_p99_{label.lower()}_ratio {limit} (probes: canary {canary.samples}, stable {stable.samples})")
    return "pass", ""


def probe_json(canary: ProbeStats, stable: ProbeStats, result: str, reason: str) -> dict:
    return {"canary": asdict(canary), "stable": asdict(stable), "result": result, "reason": reason}


def probe_summary(p: Optional[dict]) -> str:
    """`` | probes canary 4 ok/4, TTFT 21.0 ms, TPOT 3.1 ms; stable …`` for a verdict line ('' without probes)."""
    if not p:
        return ""

    def ms(v):
        return "n/a" if v is None else f"{v * 1000:.1f} ms"

    def side(d):
        return f"{d['samples']} ok/{d['sent']}, median TTFT {ms(d['ttft_s'])}, TPOT {ms(d['tpot_s'])}"

    return f" | probes canary {side(p['canary'])}; stable {side(p['stable'])}"


def combine(v, probe: Optional[tuple[str, str, dict]], min_client_requests: int = 0):
    """Fold the probes' (result, reason, json) into the metrics Verdict ``v`` (rules in the module doc); returns v."""
    if probe is None:
        return v
    result, reason, pj = probe
    v.probes = pj
    if v.result == "fail":
        v.source = "metrics"
    elif result == "fail":
        v.result, v.reason, v.source = "fail", reason, "probes"
    elif v.result == "pass":
        v.source = "metrics+probes" if result == "pass" else "metrics"
    elif low_traffic(v):
        if result == "pass" and idle(v, min_client_requests):
            v.reason = (f"{v.reason}; probes passed, but {v.canary.generations} client requests < min_client_requests "
                        f"{min_client_requests}: probes alone do not promote")
        elif result == "pass" and FEW_SAMPLES in v.reason:
            v.reason = (f"{CANNOT_JUDGE}{v.canary.ttft_count} samples ({v.reason.removeprefix(CANNOT_JUDGE)}); probes "
                        f"passed, not enough for a P99")
        elif result == "pass":
            v.result, v.reason, v.source = "pass", f"judged on probes ({v.reason.removeprefix(CANNOT_JUDGE)})", "probes"
        else:
            v.reason = f"{v.reason}; probes: {reason}"
    return v


class InconclusiveStreak:
    """Counts inconclusive windows in a row; ``add(result, idle) -> True`` when the streak reaches ``limit`` (0:
    never). ``all_idle``: every window of the streak was idle (too few client requests)."""

    def __init__(self, limit: int):
        self.limit, self.count, self.idle = limit, 0, 0

    def add(self, result: str, idle: bool = False) -> bool:
        self.count = self.count + 1 if result == "inconclusive" else 0
        self.idle = self.idle + 1 if result == "inconclusive" and idle else 0
        return bool(self.limit) and self.count >= self.limit

    @property
    def all_idle(self) -> bool:
        return bool(self.count) and self.idle >= self.count
