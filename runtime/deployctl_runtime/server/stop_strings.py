"""Stop strings matched across token boundaries with hold-back (case C05).

Text arrives in deltas that may cut a stop string anywhere. The matcher holds back the longest tail of the unsent
text that is a prefix of some stop string, since the next delta may complete it; everything before that tail is safe
to send. When a stop string appears, the text before it is released and the rest (stop string included) is dropped;
with `include_stop` (vLLM's include_stop_str_in_output) the stop string itself is released too, the rest dropped.
Generation stops at the stop string that completes first (earliest end; on a tie the one starting earlier), as if
text arrived one character at a time, so the result does not depend on where token boundaries fall.
Invariant: no character of a stop string is ever released (with `include_stop`: none past its end); concatenating
every release equals the full text cut just before (just after) that stop string, or the whole text after `flush()`.
"""
from __future__ import annotations

from typing import Sequence


class StopStringMatcher:
    def __init__(self, stops: Sequence[str], include_stop: bool = False):
        self._stops = [s for s in stops if s]
        self._include = include_stop
        self._pending = ""
        self.stopped = False
        self.matched: str | None = None

    def feed(self, delta: str) -> str:
        """Add `delta`; return the text that can be sent now. After a match `stopped` is True and more input is ignored."""
        if self.stopped:
            return ""
        if not self._stops:
            return delta
        buf = self._pending + delta
        best: tuple[int, int, str] | None = None  # (end, start, stop) of the match that completes first
        for s in self._stops:
            i = buf.find(s)
            if i != -1 and (best is None or (i + len(s), i) < best[:2]):
                best = (i + len(s), i, s)
        if best is not None:
            self.stopped, self.matched, self._pending = True, best[2], ""
            return buf[: best[0] if self._include else best[1]]
        hold = self._held_tail(buf)
        self._pending = buf[len(buf) - hold :] if hold else ""
        return buf[: len(buf) - hold]

    def _held_tail(self, buf: str) -> int:
        """Length of the longest suffix of `buf` that is a proper prefix of a stop string."""
        best = 0
        for s in self._stops:
            for k in range(min(len(s) - 1, len(buf)), best, -1):
                if buf.endswith(s[:k]):
                    best = k
                    break
        return best

    def flush(self) -> str:
        """Release the held text at the end of generation (no stop string matched)."""
        out, self._pending = ("" if self.stopped else self._pending), ""
        return out
