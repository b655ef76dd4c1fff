"""Prometheus histograms from the text exposition format: parse, subtract two scrapes, estimate quantiles.

Standard library only, so that bench (client-vs-server consistency) and the rollout's canary analysis
(P99 TTFT/TPOT of a window) share one implementation.

Format: https://prometheus.io/docs/instrumenting/exposition_formats/ (text format 0.0.4).
Quantile estimate: Prometheus' ``histogram_quantile`` (promql/quantile.go, ``bucketQuantile``): find the bucket
whose cumulative count reaches rank = q * total, interpolate linearly between its lower and upper bound; the
lowest bucket's lower bound is 0 (when its upper bound is positive); a rank in the +Inf bucket returns the highest
finite upper bound.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Iterable, Mapping

__all__ = [
    "Sample",
    "Histogram",
    "parse_text",
    "histogram",
    "histogram_quantile",
    "min_samples_for_quantile",
    "PromParseError",
]


class PromParseError(ValueError):
    """A line of the exposition text is not valid; the message names the line number and the line."""


@dataclass(frozen=True)
class Sample:
    """One sample line: ``name{labels} value``. ``labels`` is a sorted tuple of (name, value) pairs."""

    name: str
    labels: tuple[tuple[str, str], ...]
    value: float

    def label(self, key: str, default: str | None = None) -> str | None:
        for k, v in self.labels:
            if k == key:
                return v
        return default


_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LINE = re.compile(rf"^(?P<name>{_NAME})\s*(?:\{{(?P<labels>.*)\}})?\s+(?P<value>\S+)(?:\s+(?P<ts>-?\d+))?\s*$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,|$)')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def _parse_float(text: str) -> float:
    low = text.lower()
    if low in ("+inf", "inf"):
        return math.inf
    if low == "-inf":
        return -math.inf
    if low == "nan":
        return math.nan
    return float(text)


def _parse_labels(text: str, lineno: int, line: str) -> tuple[tuple[str, str], ...]:
    pairs: list[tuple[str, str]] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _LABEL.match(text, pos)
        if not m:
            raise PromParseError(f"metrics line {lineno}: bad labels in {line!r}")
        value = re.sub(r"\\[\\\"n]", lambda e: _UNESCAPE[e.group(0)], m.group(2))
        pairs.append((m.group(1), value))
        pos = m.end()
    return tuple(sorted(pairs))


def parse_text(text: str) -> list[Sample]:
    """Parse Prometheus text exposition format into samples (comments and blank lines skipped).

    Raises PromParseError on a malformed sample line.
    """
    samples: list[Sample] = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            raise PromParseError(f"metrics line {lineno}: cannot parse {line!r}")
        labels = _parse_labels(m.group("labels") or "", lineno, line)
        try:
            value = _parse_float(m.group("value"))
        except ValueError:
            raise PromParseError(f"metrics line {lineno}: bad value in {line!r}") from None
        samples.append(Sample(m.group("name"), labels, value))
    return samples


@dataclass
class Histogram:
    """A cumulative histogram: ``buckets`` are (upper bound ``le``, cumulative count) sorted by ``le``, the
    last one +Inf. ``count`` and ``sum`` are the ``_count``/``_sum`` series (seconds for latency metrics)."""

    buckets: list[tuple[float, float]] = field(default_factory=list)
    count: float = 0.0
    sum: float = 0.0

    def __sub__(self, before: "Histogram") -> "Histogram":
        """The observations between two scrapes (self is the later one). Buckets are matched by bound;
        a counter reset (a count going down) raises ValueError."""
        prev = dict(before.buckets)
        out = []
        for le, n in self.buckets:
            d = n - prev.get(le, 0.0)
            if d < 0:
                raise ValueError(f"histogram bucket le={le} went down ({prev.get(le)} -> {n}): counter reset")
            out.append((le, d))
        if self.count < before.count:
            raise ValueError(f"histogram count went down ({before.count} -> {self.count}): counter reset")
        return Histogram(out, self.count - before.count, self.sum - before.sum)

    def quantile(self, q: float) -> float:
        """Estimated q-quantile (0 <= q <= 1), as Prometheus' histogram_quantile; NaN when empty."""
        return histogram_quantile(q, self.buckets)

    def bucket_of(self, value: float) -> tuple[float, float]:
        """(lower, upper) bounds of the bucket that ``value`` falls into (lower exclusive, upper inclusive)."""
        lower = 0.0
        for le, _ in self.buckets:
            if value <= le:
                return lower, le
            lower = le
        return lower, math.inf


def histogram(
    samples: Iterable[Sample], name: str, match: Mapping[str, str] | None = None
) -> Histogram:
    """The histogram ``name`` (without _bucket/_count/_sum), summed over every label set that contains
    ``match`` (like ``sum by (le)`` in PromQL). Missing metric: an empty Histogram (count 0)."""
    match = dict(match or {})
    by_le: dict[float, float] = {}
    h = Histogram()
    for s in samples:
        if s.name not in (f"{name}_bucket", f"{name}_count", f"{name}_sum"):
            continue
        labels = dict(s.labels)
        if any(labels.get(k) != v for k, v in match.items()):
            continue
        if s.name.endswith("_bucket"):
            le = labels.get("le")
            if le is None:
                continue
            bound = _parse_float(le)
            by_le[bound] = by_le.get(bound, 0.0) + s.value
        elif s.name.endswith("_count"):
            h.count += s.value
        else:
            h.sum += s.value
    h.buckets = sorted(by_le.items())
    return h


def min_samples_for_quantile(q: float) -> int:
    """The fewest observations whose q-quantile is more than the largest one: ceil(1 / (1 - q)) for q >= 0.5
    (P99: 100, P95: 20, P90: 10, P50: 2), ceil(1 / q) below the median (one observation under it).

    Why: the rank is q * n (``histogram_quantile`` above; the same holds for sample quantiles, Hyndman & Fan 1996,
    definitions 4-9): with n < 1 / (1 - q) the rank lies inside the top observation, so a "P99" of 3 requests is
    the slowest request, interpolated towards its bucket's upper bound, not a tail of many. Raises ValueError for
    q outside (0, 1).
    """
    if not 0 < q < 1:
        raise ValueError(f"quantile q={q} is not within (0, 1)")
    tail = 1 - q if q >= 0.5 else q
    return max(1, math.ceil(round(1 / tail, 9)))  # round: 1 / (1 - 0.99) is 100.00000000000009 in floats


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus' histogram_quantile on cumulative ``buckets`` [(le, count)] sorted by le, ending in +Inf.

    Returns NaN for no observations or no +Inf bucket, -inf/+inf for q < 0 / q > 1.
    """
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    if not buckets or not math.isinf(buckets[-1][0]):
        return math.nan
    total = buckets[-1][1]
    if total <= 0:
        return math.nan
    rank = q * total
    idx = next(i for i, (_, n) in enumerate(buckets) if n >= rank)
    if idx == len(buckets) - 1:
        return buckets[-2][0] if len(buckets) >= 2 else math.nan
    if idx == 0 and buckets[0][0] <= 0:
        return buckets[0][0]
    upper, upper_count = buckets[idx]
    lower, lower_count = (0.0, 0.0) if idx == 0 else buckets[idx - 1]
    in_bucket = upper_count - lower_count
    if in_bucket <= 0:
        return upper
    return lower + (upper - lower) * ((rank - lower_count) / in_bucket)
