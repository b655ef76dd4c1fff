"""--from-log: the service's own traffic shape from the runtime's access log, without its data.

The runtime logs one line per inference request when it ends (deployctl_runtime.server.middleware), after the
logging prefix ``%(asctime)s`` (``2026-12-01 08:50:00,123``)::

    ... request_id=ID method=POST path=/v1/chat/completions status=200 prompt_tokens=N completion_tokens=M
    ttft_ms=T total_ms=E finish=length

Token counts and times only; prompt text is never logged. A request arrived at its line's time minus total_ms.
Lines of other loggers, non-200 answers and requests with no prompt tokens are skipped.

The shape: the joint (prompt tokens, output tokens) distribution, resampled with a seed, and the arrival
pattern: the log's mean rate and its inter-arrival gaps (resampled, so bursts stay bursts).
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Iterator

from deployctl.bench.workload import BenchRequest, prompt_words
from deployctl.errors import ConfigError

_STAMP = re.compile(r"(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[,.]\d{1,6})?)")
_PAIR = re.compile(r"\b(path|status|prompt_tokens|completion_tokens|total_ms)=(\S+)")


@dataclass(frozen=True)
class LogShape:
    """``entries``: (arrival s from the first request, prompt tokens, completion tokens), in arrival order."""

    entries: tuple[tuple[float, int, int], ...]

    @property
    def span_s(self) -> float:
        return self.entries[-1][0] - self.entries[0][0]

    @property
    def rate(self) -> float | None:
        """Requests/s: (n - 1) / (last arrival - first); None with one request or all at once."""
        return (len(self.entries) - 1) / self.span_s if len(self.entries) > 1 and self.span_s > 0 else None

    @property
    def gaps(self) -> list[float]:
        return [b[0] - a[0] for a, b in zip(self.entries, self.entries[1:])]


def parse_log(path: Path) -> LogShape:
    """The inference requests in the runtime log ``path``. Raises ConfigError when unreadable or none found."""
    try:
        lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as err:
        raise ConfigError(f"--from-log {path}: {err.strerror or err}", fix="pass the runtime's log file") from None
    rows = []
    for line in lines:
        if "request_id=" not in line:
            continue
        stamp, pairs = _STAMP.search(line), dict(_PAIR.findall(line))
        if stamp is None or not pairs.get("path", "").endswith("completions") or pairs.get("status") != "200":
            continue
        try:
            end = datetime.fromisoformat(stamp.group(1).replace(",", ".")).timestamp()
            row = (end - float(pairs["total_ms"]) / 1e3, int(pairs["prompt_tokens"]), int(pairs["completion_tokens"]))
        except (KeyError, ValueError):
            continue
        if row[1] > 0:
            rows.append(row)
    if not rows:
        raise ConfigError(f"--from-log {path}: no completed inference request (status=200 prompt_tokens=N "
                          "completion_tokens=M lines) in it", fix="pass the log of deployctl-runtime serve "
                          "(its stderr or journal), which has one such line per request")
    rows.sort()
    t0 = rows[0][0]
    return LogShape(tuple((round(t - t0, 6), p, max(1, c)) for t, p, c in rows))


def sample_lengths(shape: LogShape, num: int, seed: int) -> list[tuple[int, int]]:
    """``num`` (prompt tokens, output tokens) pairs drawn with replacement from the log (seeded)."""
    rng = random.Random(seed)
    return [rng.choice(shape.entries)[1:] for _ in range(num)]


def requests_from_log(shape: LogShape, num: int, seed: int, words_for) -> list[BenchRequest]:
    """``num`` synthetic requests shaped like the log: prompts of ``words_for(prompt_tokens, output_tokens)`` words
    (the caller's token estimate, fitted to the context) and max_tokens the logged output tokens."""
    rng = random.Random(seed ^ 0x5EED)
    out = []
    for prompt_tokens, output_tokens in sample_lengths(shape, num, seed):
        words = words_for(prompt_tokens, output_tokens)
        out.append(BenchRequest(prompt=prompt_words(rng, words), messages=None, max_tokens=output_tokens))
    return out


def arrival_times(gaps: list[float], rate: float, num: int, seed: int) -> Iterator[float]:
    """Send times (s from the level's start) of ``num`` requests: the log's gaps resampled (seeded) and scaled so
    that their mean is 1 / ``rate``. The first request goes at 0."""
    rng = random.Random(seed)
    mean = sum(gaps) / len(gaps) if gaps else 0.0
    scale = (1.0 / rate) / mean if mean > 0 else 0.0
    t = 0.0
    for i in range(num):
        if i:
            t += (rng.choice(gaps) * scale) if mean > 0 else 1.0 / rate
        yield t
