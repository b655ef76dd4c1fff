"""Where a runtime start spent its time, read from the runtime log (launch.sh's and the runtime's own lines).

``phases(text) -> dict[str, float]`` over the log written since the start (``launcher.start``'s offset):
  ``boot_s``    launch.sh "starting runtime" (or the first runtime line) → uvicorn "Uvicorn running": the
                interpreter, the server's imports, the port bound
  ``load_s``    → "KV cache:": manifest verification, torch import, weights load, KV cache allocation
  ``warmup_s``  → "ready:": the warm-up forward pass and the engine loop start
A phase whose lines are missing (another runtime, a log rotated away) is left out. Seconds, two decimals; the
launch.sh line has a one-second resolution, so ``boot_s`` is ±1 s when that is the first line.
"""
from __future__ import annotations

import re
from datetime import datetime

_PY = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ")  # logging's asctime
_SH = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)Z launch\.sh\[\d+\]: starting runtime")
_MARKS = (("boot_s", "Uvicorn running on"), ("load_s", "KV cache:"), ("warmup_s", "ready: serving model"))


def _when(line: str):
    m = _PY.match(line)
    if m:
        return datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").timestamp() + int(m.group(2)) / 1000
    m = _SH.match(line)
    if m:
        return datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S").timestamp()
    return None


def phases(text: str) -> dict[str, float]:
    """The phases of the first start in ``text`` (module doc)."""
    start = None
    found: dict[str, float] = {}
    for line in text.splitlines():
        t = _when(line)
        if t is None:
            continue
        if start is None:
            start = t
        for key, mark in _MARKS:
            if key not in found and mark in line:
                found[key] = t
    out, prev = {}, start
    for key, _ in _MARKS:
        if key not in found or prev is None:
            break
        out[key] = round(max(0.0, found[key] - prev), 2)
        prev = found[key]
    return out


def start_phases(host, since: int) -> dict[str, float]:
    """``phases`` of the host's runtime log from byte ``since`` ({} when unreadable). Never raises."""
    import shlex

    from deployctl.config.layout import log_file

    try:
        r = host.run(f"tail -c +{int(since) + 1} {shlex.quote(log_file(host.config))} 2>/dev/null | head -c 200000",
                     timeout=15)
        return phases(r.stdout)
    except Exception:  # noqa: BLE001 - timing is a report, never a failure
        return {}
