"""The shape every validation layer returns, and the run as a whole.

JSON (``to_json``): ``{"layer", "verdict": "pass"|"fail"|"skipped", "summary", "problems": [str], "details": {...}}``;
a run: ``{"url", "model", "max_model_len", "layers": {name: layer}, "verdict", "started_at", "duration_s"}``.
A failed layer makes the run's verdict ``fail`` (the CLI exits 1).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class LayerResult:
    """One layer's verdict. ``problems``: one line per failed check, each naming the check and where it failed;
    ``details``: the layer's own data (rows, series, ladder) for the JSON document and the report."""

    layer: str
    verdict: str  # pass | fail | skipped
    summary: str
    problems: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"layer": self.layer, "verdict": self.verdict, "summary": self.summary,
                "problems": list(self.problems), "details": self.details}


@dataclass
class ValidationRun:
    url: str
    model: Optional[str]
    max_model_len: Optional[int]
    started_at: str
    duration_s: float = 0.0
    layers: list[LayerResult] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        return "fail" if any(r.verdict == "fail" for r in self.layers) else "pass"

    def to_json(self) -> dict[str, Any]:
        return {"url": self.url, "model": self.model, "max_model_len": self.max_model_len,
                "started_at": self.started_at, "duration_s": round(self.duration_s, 3), "verdict": self.verdict,
                "layers": {r.layer: r.to_json() for r in self.layers}}
