"""Cooperative Ctrl-C for the commands that change a fleet (deploy, rollback): the signal handler only records the
request; the step machine acts on it at its own check points.

Why (issue 31, seen in CI): a handler that raises KeyboardInterrupt lands wherever the main thread happens to be —
inside paramiko or ``threading`` code it can leave a lock held (a ``Condition`` acquired and never released), and
the abort that follows, reusing the same SSH transport, waits on that lock forever. Here nothing is ever raised
from the handler into library code:

- first SIGINT: the request is recorded (``requested``), a line on stderr says what happens next; ``check()`` —
  called by the step machine between steps, in every wait, and by the host workers' readiness waits — raises
  ``StopRequested`` from our own code;
- second SIGINT: ``on_force()`` says what is left undone (which hosts, which release), that line goes to stderr and
  the process exits 130 at once (``os._exit``: no clean-up that could hang; the lock it held reads as stale and
  the next ``rollback`` breaks it).

The handler writes with ``os.write`` (no buffered stream, whose lock the interrupted code may hold).
"""
from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager
from typing import Callable, Iterator, Optional

FORCE_EXIT_CODE = 130  # 128 + SIGINT, as errors.ExitCode.INTERRUPTED


class StopRequested(Exception):
    """Ctrl-C was pressed: raised by ``Interruption.check()`` at a check point of the step machine (never from a
    signal handler). An ``Exception``, so a host worker that raises it reports it as its outcome."""


class Interruption:
    """One command's Ctrl-C state. ``first_note``: the line printed at the first Ctrl-C; ``on_force() -> str``:
    what is left undone, printed before a second Ctrl-C exits."""

    def __init__(self, first_note: str, on_force: Optional[Callable[[], str]] = None):
        self.first_note = first_note
        self.on_force = on_force
        self._event = threading.Event()

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    def request(self) -> None:
        """Record a stop request (what the first Ctrl-C does; tests and callers without a terminal use it too)."""
        self._event.set()

    def check(self) -> None:
        """Raise StopRequested once a stop was requested. Safe from any thread."""
        if self._event.is_set():
            raise StopRequested("interrupted (Ctrl-C)")

    def _handler(self, signum, frame) -> None:
        if not self._event.is_set():
            self._event.set()
            _write(f"\nCtrl-C: {self.first_note} (Ctrl-C again exits at once)\n")
            return
        left = ""
        if self.on_force is not None:
            try:
                left = self.on_force()
            except Exception as e:  # noqa: BLE001 - the exit must happen whatever the description does
                left = f"(could not tell what is left: {e})"
        _write(f"\nsecond Ctrl-C: exiting now. {left}\n")
        os._exit(FORCE_EXIT_CODE)

    @contextmanager
    def installed(self) -> Iterator["Interruption"]:
        """Install the handler for the duration (main thread only; elsewhere a no-op: signals reach only the main
        thread, and a caller there owns them)."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = signal.signal(signal.SIGINT, self._handler)
        try:
            yield self
        finally:
            signal.signal(signal.SIGINT, previous)

    @contextmanager
    def suspended(self) -> Iterator[None]:
        """Ctrl-C raises KeyboardInterrupt again for the duration: for a prompt (input() would otherwise wait on
        through a recorded request), where no SSH call is in flight that the exception could cut. Main thread only;
        elsewhere a no-op."""
        if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) != self._handler:
            yield
            return
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, self._handler)


def _write(text: str) -> None:
    try:
        os.write(2, text.encode("utf-8", "replace"))
    except OSError:
        pass
