"""The engine's step loop on its own thread, and the asyncio side the HTTP layer talks to.

The engine is single-threaded, so only the loop thread touches it: `add` and `abort` are queued as commands and
applied between steps. Each step's outputs are handed to the event loop in one `call_soon_threadsafe` and put on
the per-request `asyncio.Queue` given at `add` (several engine requests, e.g. the n choices of one HTTP request,
may share one queue). `stats` is refreshed after every step and every command batch, so /metrics shows freed
blocks right after an abort even when the engine is idle.

Errors: a request that fails alone was already ended by the engine with finish_reason "error" (a step exception
bisected down to it, isolation.py; non-finite logits, a grammar matcher or a stop check that raised, sampler.py and
scheduler.py), or by the server (its detokenizer raised: `report_isolated`); the loop goes on. Both are counted in
one place, `_count_isolated`: `on_error("isolated")` per request, and the window rule below. The loop dies (every
open request gets EngineDead, then `on_fatal(message)` so the server exits to be restarted) when a step raises past
the engine's isolation (EngineFatalError: a poisoned device; or any other exception, which leaves the engine's
state unknown), or when `max_isolated_errors` requests failed alone within `isolated_error_window_s` (something is
wrong beyond one request, e.g. a model whose activations overflow on most prompts). `on_error("fatal")` then.

Progress (for the watchdog, watchdog.py): `progress_at` is the monotonic time the loop last completed a step or
was found idle (it wakes every `idle_wait_s` while idle), and `phase` says where it is now ("idle", "commands" while
it applies adds/aborts/sleep/wake, else the engine's step_phase: "schedule", "prepare_inputs", "forward", "sample",
"update"). `on_progress()` is called on the loop thread at those same moments (the systemd watchdog ping: a wedged
loop stops pinging). `stall(timeout_s)` tells another thread whether requests are open while no step completed for
that long; `fail_stalled(message)` then ends the loop's open requests with EngineDead(code "engine_stalled") from
that thread, as the loop itself can no longer do it.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

log = logging.getLogger("deployctl_runtime.server")


@dataclass
class _Add:
    request_ids: list[str]
    prompts: list[list[int]]
    params: list[Any]
    queue: asyncio.Queue
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future


@dataclass
class _Call:
    fn: Any  # fn(engine) -> result, run on the loop thread between steps
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future


@dataclass
class _Abort:
    request_ids: list[str]


@dataclass
class _Isolated:
    error: str  # a request the server failed alone (its detokenizer raised)


@dataclass
class EngineDead:
    """Put on every open queue when the step loop crashed (code None) or is wedged (code "engine_stalled"); the
    request ends with an error finish."""

    message: str
    code: str | None = None


@dataclass(frozen=True)
class Stall:
    """The loop has open requests and completed no step for `since_s` seconds; it is in `phase`."""

    since_s: float
    phase: str

    def message(self) -> str:
        since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - self.since_s))
        return (f"the engine is stalled: no engine step completed for {self.since_s:.1f} s (since {since}) with "
                f"requests open (last phase: {self.phase}); the runtime exits to be restarted")


@dataclass
class AsyncEngine:
    """Owns the step loop thread. `engine` must follow the LLMEngine interface (add_request/abort_request/step/stats)."""

    engine: Any
    step_delay_s: float = 0.0  # fault injection: sleep per step
    on_fatal: Callable[[str], None] | None = None  # called on the loop thread once the open requests were failed
    on_error: Callable[[str], None] | None = None  # called with "isolated" or "fatal" per error
    max_isolated_errors: int = 10  # this many requests failed alone ...
    isolated_error_window_s: float = 60.0  # ... within this many seconds: the engine is declared dead
    on_progress: Callable[[], None] | None = None  # loop thread: after each completed step and each idle wake-up
    idle_wait_s: float = 0.5  # an idle loop wakes this often (to show progress)
    stats: Any = None
    error: str | None = None
    error_code: str | None = None  # "engine_stalled" when fail_stalled ended it; None for a crash
    progress_at: float = field(default_factory=time.monotonic)  # last completed step or idle wake-up (monotonic)
    _in_commands: bool = False
    _error_times: deque = field(default_factory=deque)  # monotonic times of the isolated errors in the window
    _reported: list = field(default_factory=list)  # errors report_isolated queued, counted after the next step
    _cmds: deque = field(default_factory=deque)
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _queues: dict = field(default_factory=dict)  # request id -> (loop, queue); loop thread only
    _stop: bool = False
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self.stats = self.engine.stats()
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._thread.start()

    @property
    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.error is None

    def _push(self, cmd) -> None:
        with self._cond:
            if self.error is not None:  # the loop is gone: nothing would ever answer
                if isinstance(cmd, _Add):
                    raise RuntimeError(self.error)
                return
            self._cmds.append(cmd)
            self._cond.notify()

    async def add(self, request_ids: Sequence[str], prompts: Sequence[list[int]], params: Sequence[Any],
                  queue: asyncio.Queue) -> None:
        """Add engine requests whose outputs go to `queue`. Returns once the engine accepted all of them;
        re-raises the engine's RequestRejected (none of them is then left in the engine)."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._push(_Add(list(request_ids), list(prompts), list(params), queue, loop, fut))
        await fut

    async def call(self, fn) -> Any:
        """Run ``fn(engine)`` on the loop thread between steps (sleep, wake); returns its result or re-raises."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._push(_Call(fn, loop, fut))
        return await fut

    def abort(self, request_ids: Sequence[str]) -> None:
        """Abort (no-op for finished or unknown ids); blocks are freed before the next step."""
        if request_ids:
            self._push(_Abort(list(request_ids)))

    def report_isolated(self, error: str) -> None:
        """Count a request the server failed alone (outside the engine, e.g. its detokenizer raised) as the
        engine's own are: the engine_errors metric and the window rule. Thread-safe; counted on the loop thread."""
        self._push(_Isolated(error))

    def shutdown(self, timeout: float = 5.0) -> None:
        """Stop the loop; waits up to `timeout` for it (not at all when it was found stalled: it would not end)."""
        with self._cond:
            self._stop = True
            self._cond.notify()
        if self._thread is not None and self.error_code != "engine_stalled":
            self._thread.join(timeout)

    @property
    def phase(self) -> str:
        """Where the loop is now (module doc). Safe from any thread."""
        if self._in_commands:
            return "commands"
        return getattr(self.engine, "step_phase", None) or "step"

    @property
    def has_open_requests(self) -> bool:
        """Requests added and not finished, or adds queued for the loop. Safe from any thread (a racy read)."""
        if self._queues:
            return True
        with self._cond:
            return any(isinstance(c, _Add) for c in self._cmds)

    def stall(self, timeout_s: float, now: float | None = None) -> Stall | None:
        """A Stall when requests are open and no step completed (nor idle wake-up) for more than `timeout_s`
        seconds; None otherwise, and always for an idle loop or a dead one."""
        since = (time.monotonic() if now is None else now) - self.progress_at
        if self.error is not None or since <= timeout_s or not self.has_open_requests:
            return None
        return Stall(since, self.phase)

    def fail_stalled(self, message: str) -> bool:
        """From another thread, once stall() said so: refuse new work and end every open request with
        EngineDead(message, "engine_stalled") (queued adds and calls fail too). The loop thread stays wherever it
        is blocked; if it ever comes back it stops. False (nothing done) when the loop had already died."""
        with self._cond:
            if self.error is not None:
                return False
            self.error, self.error_code = message, "engine_stalled"
            self._stop = True
            cmds = list(self._cmds)
            self._cmds.clear()
        for _ in range(3):  # the loop thread owns _queues; should it be moving after all, copy again
            try:
                open_queues = list(self._queues.values())
                break
            except RuntimeError:
                continue
        else:
            open_queues = []
        if self.on_error:
            self.on_error("fatal")
        self._fail(cmds, open_queues, EngineDead(message, "engine_stalled"))
        return True

    # ---- loop thread ----
    def _apply(self, cmd) -> None:
        if isinstance(cmd, _Isolated):
            self._reported.append(cmd.error)
            return
        if isinstance(cmd, _Call):
            try:
                result = cmd.fn(self.engine)
            except Exception as exc:  # the caller decides (e.g. a wake that did not fit)
                cmd.loop.call_soon_threadsafe(_set_exception, cmd.future, exc)
            else:
                cmd.loop.call_soon_threadsafe(_set_value, cmd.future, result)
            return
        if isinstance(cmd, _Abort):
            ids = [r for r in cmd.request_ids if r in self._queues]
            for r in ids:
                del self._queues[r]
            if ids:
                self.engine.abort_request(ids)
            return
        added: list[str] = []
        try:
            for rid, prompt, params in zip(cmd.request_ids, cmd.prompts, cmd.params):
                self.engine.add_request(rid, prompt, params)
                added.append(rid)
                self._queues[rid] = (cmd.loop, cmd.queue)
        except Exception as exc:  # RequestRejected or a bug: the caller decides
            for r in added:
                self._queues.pop(r, None)
            if added:
                self.engine.abort_request(added)
            cmd.loop.call_soon_threadsafe(_set_exception, cmd.future, exc)
            return
        cmd.loop.call_soon_threadsafe(_set_result, cmd.future)

    def _progress(self) -> None:
        self.progress_at = time.monotonic()
        if self.on_progress is not None:
            try:
                self.on_progress()
            except Exception:  # noqa: BLE001 - a ping that failed must not end the loop
                log.exception("on_progress failed")

    def _run(self) -> None:
        engine = self.engine
        while True:
            with self._cond:
                while not self._cmds and not self._stop and not engine.has_unfinished_requests():
                    self._progress()  # idle is not stalled
                    self._cond.wait(self.idle_wait_s)
                if self._stop:
                    return
                cmds = list(self._cmds)
                self._cmds.clear()
            outputs = []
            try:
                self._in_commands = True
                for cmd in cmds:
                    self._apply(cmd)
                if cmds:
                    self.stats = engine.stats()
                self._in_commands = False
                if engine.has_unfinished_requests():
                    outputs = engine.step()
                    if self.step_delay_s:
                        time.sleep(self.step_delay_s)
                    self.stats = engine.stats()
                    self._progress()
            except Exception as exc:
                log.exception("engine step loop crashed; failing all open requests")
                self._die(f"engine step loop crashed: {type(exc).__name__}: {exc}", cmds)
                return
            self._deliver(outputs)
            errors = [o.error or "error" for o in outputs if o.finished and o.finish_reason == "error"]
            errors += self._reported
            self._reported = []
            if self._count_isolated(errors):
                self._die(f"{len(self._error_times)} requests failed alone within {self.isolated_error_window_s:g} s "
                          f"(--fatal-after-errors {self.max_isolated_errors}); the last: {errors[-1]}", [])
                return

    def _count_isolated(self, errors: list[str]) -> bool:
        """The one place requests failed alone are counted (engine outputs finished with "error", and those the
        server reported): on_error("isolated") each; True when the window holds max_isolated_errors."""
        now = time.monotonic()
        for _ in errors:
            self._error_times.append(now)
            if self.on_error:
                self.on_error("isolated")
        while self._error_times and now - self._error_times[0] > self.isolated_error_window_s:
            self._error_times.popleft()
        return bool(errors) and self.max_isolated_errors > 0 and len(self._error_times) >= self.max_isolated_errors

    def _die(self, message: str, cmds) -> None:
        with self._cond:  # from here on _push refuses; what was queued meanwhile is failed too
            self.error = message
            cmds = list(cmds) + list(self._cmds)
            self._cmds.clear()
        if self.on_error:
            self.on_error("fatal")
        self._fail_all(cmds)
        if self.on_fatal:
            try:
                self.on_fatal(message)
            except Exception:  # noqa: BLE001 - the loop is ending anyway
                log.exception("on_fatal failed")

    def _deliver(self, outputs) -> None:
        batches: dict[asyncio.AbstractEventLoop, list] = {}
        for out in outputs:
            target = self._queues.get(out.request_id)
            if target is None:
                continue  # aborted meanwhile
            if out.finished:
                del self._queues[out.request_id]
            batches.setdefault(target[0], []).append((target[1], out))
        for loop, items in batches.items():
            loop.call_soon_threadsafe(_put_all, items)

    def _fail_all(self, cmds) -> None:
        open_queues = list(self._queues.values())
        self._queues.clear()
        self._fail(cmds, open_queues, EngineDead(self.error or "engine failed"))

    @staticmethod
    def _fail(cmds, open_queues, dead: EngineDead) -> None:
        for cmd in cmds:
            if isinstance(cmd, (_Add, _Call)) and not cmd.future.done():
                cmd.loop.call_soon_threadsafe(_set_exception, cmd.future, RuntimeError(dead.message))
        items: dict = {}
        for loop, q in open_queues:
            items.setdefault(loop, set()).add(q)
        for loop, queues in items.items():
            loop.call_soon_threadsafe(_put_all, [(q, dead) for q in queues])


def _put_all(items) -> None:
    for q, item in items:
        q.put_nowait(item)


def _set_result(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


def _set_value(fut: asyncio.Future, value: Any) -> None:
    if not fut.done():
        fut.set_result(value)


def _set_exception(fut: asyncio.Future, exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)
