"""Byte sizes: parse "80GiB" / "40GB" / 1024 and format them for humans.

Binary units (KiB, MiB, GiB, TiB, and the single letters K, M, G, T: ``512m`` is 512 MiB, as docker, nginx and
the JVM read it) are powers of 1024; decimal units (KB, MB, GB, TB) are powers of 1000, as GPU vendors use them
("A100 40GB"). The runtime parses the same grammar (deployctl_runtime/engine_args.py parse_bytes); both are pinned
by tests/data/engine_vectors.json.
"""
from __future__ import annotations

import re

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_bytes(value: object) -> int:
    """Return ``value`` in bytes. Raises ValueError naming the value and the accepted forms."""
    if isinstance(value, bool):
        raise ValueError(f"expected a size like 80GiB, 40GB or 1073741824, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    match = _SIZE.match(str(value))
    unit = match.group(2).lower() if match else None
    if not match or unit not in _UNITS:
        raise ValueError(f"expected a size like 80GiB, 40GB or 1073741824, got {value!r}")
    return int(float(match.group(1)) * _UNITS[unit])


def format_bytes(n: float) -> str:
    """Binary-unit rendering: 536870912 -> '512.0 MiB'."""
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{sign}{n:.0f} {unit}" if unit == "B" else f"{sign}{n:.1f} {unit}"
        n /= 1024
    return f"{sign}{n:.1f} TiB"


_NUMBER = r"([0-9]+(?:\.[0-9]+)?)"
_DURATION = re.compile(rf"^\s*{_NUMBER}\s*(ms|s|m|h|d)?\s*$")
# the compound form format_duration writes (1h30m, 24h10m, 1h1m1s): units from largest to smallest, each once
_COMPOUND_UNITS = ("d", "h", "m", "s", "ms")
_COMPOUND = re.compile(r"^\s*" + "".join(f"(?:{_NUMBER}{u}{'(?!s)' if u == 'm' else ''})?" for u in _COMPOUND_UNITS)
                       + r"\s*$")
_EXPECTED = "expected a duration like 30s, 5m, 24h, 1h30m or a number of seconds"
_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}


def parse_duration(value: object) -> float:
    """Return ``value`` in seconds: a number (seconds) or a string with a unit, ``"30s"``, ``"5m"``, ``"24h"``,
    ``"1.5d"``, ``"250ms"``, or units from largest to smallest as format_duration writes them, ``"1h30m"``,
    ``"24h10m"``, ``"1h1m1s"``. Raises ValueError naming the value and the accepted forms."""
    if isinstance(value, bool):
        raise ValueError(f"{_EXPECTED}, got {value!r}")
    if isinstance(value, (int, float)):
        return float(value)
    match = _DURATION.match(str(value))
    if match:
        return float(match.group(1)) * _SECONDS[match.group(2)]
    parts = _COMPOUND.match(str(value))
    if parts and any(parts.groups()):
        return sum(float(n) * _SECONDS[u] for n, u in zip(parts.groups(), _COMPOUND_UNITS) if n)
    raise ValueError(f"{_EXPECTED}, got {value!r}")


def format_duration(seconds: float) -> str:
    """Hours, minutes and seconds, largest first, zero parts left out: 86400 -> '24h', 87000 -> '24h10m',
    300 -> '5m', 90 -> '1m30s', 0.5 -> '0.5s', 0 -> '0s'."""
    sign = "-" if seconds < 0 else ""
    hours, rest = divmod(abs(seconds), 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{int(hours)}h" if hours else "", f"{int(minutes)}m" if minutes else "",
             f"{secs:g}s" if secs or not (hours or minutes) else ""]
    return sign + "".join(parts)
