"""The progress watchdog: a runtime whose engine loop is wedged must not stay "healthy".

Its own thread (neither the engine loop, which is what may be blocked, nor the event loop, which answers /healthz
happily while the engine thread is stuck) checks every ``min(1 s, timeout / 4)`` whether requests are open and no
engine step completed for ``--engine-stall-timeout-s`` (async_engine.AsyncEngine.stall; an idle engine, or a slow one
whose steps still complete within the timeout, never trips it). When it trips: ``ctx.stall`` is set, so /healthz,
/health and /readyz answer 503 ``engine_stalled`` (OpenAI's error shape; the message gives the seconds since the
last completed step and the step's last phase: "schedule", "prepare_inputs", "forward", "sample", "update" or
"commands"); the open requests end with 503 ``engine_stalled`` (streams: an error event, then [DONE]); and the
process exits ``EXIT_ENGINE_STALLED`` (4) so that its supervisor restarts it.
"""
from __future__ import annotations

import logging
import threading
from typing import Callable

log = logging.getLogger("deployctl_runtime.server")


class EngineWatchdog:
    """Watches ``ctx.engine`` (an AsyncEngine) once started; ``on_stall(message)`` is called once, from the watchdog
    thread, after the open requests were failed."""

    def __init__(self, ctx, timeout_s: float, on_stall: Callable[[str], None]):
        self.ctx, self.timeout_s, self.on_stall = ctx, timeout_s, on_stall
        self.interval_s = min(1.0, timeout_s / 4)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the thread (nothing when the timeout is 0: off)."""
        if self.timeout_s <= 0:
            return
        self._thread = threading.Thread(target=self._run, name="engine-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def check(self) -> bool:
        """One look; True when it tripped (then it has done everything: state, open requests, on_stall)."""
        engine = self.ctx.engine
        stall = engine.stall(self.timeout_s) if engine is not None else None
        if stall is None:
            return False
        message = stall.message()
        if not engine.fail_stalled(message):  # it died meanwhile: engine_died has it (exit 3)
            return True
        log.error("%s", message)
        self.ctx.stall = message
        self.on_stall(message)
        return True

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                if self.check():
                    return
            except Exception:  # noqa: BLE001 - the watchdog must keep watching
                log.exception("engine watchdog check failed")
