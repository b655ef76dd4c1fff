"""Small statistics over time series: the least-squares slope, per hour, and thirds of a series.

Slope: ordinary least squares, b = sum((t - t_mean)(y - y_mean)) / sum((t - t_mean)^2) (y per second), times 3600
for per hour. None with fewer than two points or no spread in time.
"""
from __future__ import annotations

from typing import Optional, Sequence


def slope_per_s(points: Sequence[tuple[float, float]]) -> Optional[float]:
    """dy/dt by least squares over (t seconds, y) points, or None."""
    if len(points) < 2:
        return None
    n = len(points)
    tm = sum(t for t, _ in points) / n
    ym = sum(y for _, y in points) / n
    den = sum((t - tm) ** 2 for t, _ in points)
    if den <= 0:
        return None
    return sum((t - tm) * (y - ym) for t, y in points) / den


def slope_per_h(points: Sequence[tuple[float, float]]) -> Optional[float]:
    s = slope_per_s(points)
    return None if s is None else s * 3600.0


def thirds(values: Sequence[float]) -> tuple[float, float]:
    """(mean of the first third, mean of the last third); one value: (it, it); none: (0, 0)."""
    if not values:
        return 0.0, 0.0
    k = max(1, len(values) // 3)
    return sum(values[:k]) / k, sum(values[-k:]) / k
