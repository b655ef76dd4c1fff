"""Each analysis window as the journal keeps it, and the replay that recomputes its verdict from those numbers.

``window_record`` is the journal's ``window`` point (deployctl.rollout.journal): the step's ``weight``, the
window's length ``window_s``, each side's figures (``canary``, ``stable``: requests, generations, 5xx ``errors``,
4xx ``client_errors``, P99 TTFT / TPOT / E2E in seconds, latency sample count, KV usage, hosts down, restarted,
NaN or reset), the stable ``baseline`` the window was compared with (None: this window's stable), the thresholds
(``rollout.analysis`` less its outputs and probes sections, and ``slo``), the probes' verdict, and the verdict with
its ``result``, ``reason`` and ``source``.

``replay(records)`` judges every such record again with deployctl.rollout.analysis.judge and
deployctl.rollout.verdicts.combine, from the record alone (no config file, no hosts): an audit that the journal
holds what each verdict rested on, and a way to ask what a window would have been under other thresholds
(``recompute(rec, thresholds=...)``).
"""
from __future__ import annotations

from dataclasses import asdict, fields
from types import SimpleNamespace
from typing import Any, Optional

from deployctl.config import DeployConfig
from deployctl.config.models import SloConfig
from deployctl.config.rollout import AnalysisConfig
from deployctl.rollout.analysis import GroupStats, Verdict, judge
from deployctl.rollout.verdicts import combine

_SIDE = {f.name for f in fields(GroupStats)}


def thresholds(cfg: DeployConfig) -> dict[str, Any]:
    """The figures a verdict is judged against: ``{"analysis": {...}, "slo": {...}}`` (JSON)."""
    return {"analysis": cfg.rollout.analysis.model_dump(mode="json", exclude={"outputs", "probes"}),
            "slo": cfg.slo.model_dump(mode="json")}


def window_record(cfg: DeployConfig, v: Verdict) -> dict[str, Any]:
    """The journal's ``window`` point for Verdict ``v`` (module doc); JSON-ready."""
    return {"weight": v.weight, "window_s": round(v.window_s, 3), "result": v.result, "reason": v.reason,
            "source": v.source, "canary": asdict(v.canary), "stable": asdict(v.stable),
            "baseline": asdict(v.baseline) if v.baseline is not None else None,
            "probes": ({"result": v.probes["result"], "reason": v.probes["reason"]} if v.probes else None),
            "thresholds": thresholds(cfg)}


def _side(d: Optional[dict]) -> Optional[GroupStats]:
    return None if d is None else GroupStats(**{k: v for k, v in d.items() if k in _SIDE})


def recompute(rec: dict[str, Any], thresholds: Optional[dict] = None) -> tuple[str, str]:
    """(result, reason) of the window record ``rec`` judged again (``thresholds``: other ones than recorded).
    Raises KeyError on a record without numbers (journals written before they were kept)."""
    t = thresholds or rec["thresholds"]
    an = AnalysisConfig(**t["analysis"])
    cfg = SimpleNamespace(rollout=SimpleNamespace(analysis=an), slo=SloConfig(**t["slo"]))
    v = judge(cfg, _side(rec["canary"]), _side(rec["stable"]), rec["window_s"], rec["weight"],
              _side(rec.get("baseline")))
    p = rec.get("probes")
    v = combine(v, (p["result"], p["reason"], p) if p else None, an.min_client_requests)
    return v.result, v.reason


def replay(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every ``window`` point with numbers in the journal ``records``, in order: ``{"weight", "recorded":
    [result, reason], "recomputed": [result, reason], "match": bool}``."""
    out = []
    for rec in records:
        if rec.get("kind") != "point" or rec.get("what") != "window" or "canary" not in rec:
            continue
        got = list(recompute(rec))
        want = [rec["result"], rec["reason"]]
        out.append({"weight": rec["weight"], "recorded": want, "recomputed": got, "match": got == want})
    return out
