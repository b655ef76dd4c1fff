"""systemd's notify protocol (sd_notify(3)) with the standard library: READY=1, WATCHDOG=1, STOPPING=1.

systemd sets ``NOTIFY_SOCKET`` (a unix datagram socket path; a leading ``@`` names the abstract namespace) for a
``Type=notify`` unit, and ``WATCHDOG_USEC`` (with ``WATCHDOG_PID``) when the unit has ``WatchdogSec=``. The runtime
sends ``READY=1`` once it serves (a ``Type=notify`` unit's start completes then, and systemd's watchdog starts
counting only from there: loading is covered by ``TimeoutStartSec=``), ``STOPPING=1`` when a drain begins, and
``WATCHDOG=1`` from the engine loop thread (async_engine.on_progress) after each completed step and while idle, at
most every WATCHDOG_USEC / 4: a wedged engine loop stops the pings and systemd kills and restarts the unit even where
the HTTP side still answers. Without NOTIFY_SOCKET every call is a no-op.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Mapping, Optional

log = logging.getLogger("deployctl_runtime.server")


class Notifier:
    """Sends notify messages to ``address`` (None: disabled). ``watchdog_s``: WATCHDOG_USEC in seconds, or None
    when systemd watches nothing (then ``ping`` sends nothing)."""

    def __init__(self, address: Optional[str], watchdog_s: Optional[float]):
        self.address = address
        self.watchdog_s = watchdog_s
        self._sock: Optional[socket.socket] = None
        self._last_ping = float("-inf")
        self._lock = threading.Lock()
        self._warned = False

    @classmethod
    def from_env(cls, env: Optional[Mapping[str, str]] = None) -> "Notifier":
        """From NOTIFY_SOCKET, WATCHDOG_USEC and WATCHDOG_PID (pings only when WATCHDOG_PID is unset or ours)."""
        env = os.environ if env is None else env
        address = env.get("NOTIFY_SOCKET") or None
        if address and address.startswith("@"):
            address = "\0" + address[1:]
        watchdog_s = None
        usec, pid = env.get("WATCHDOG_USEC", ""), env.get("WATCHDOG_PID", "")
        if usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid())):
            watchdog_s = int(usec) / 1e6
        return cls(address, watchdog_s)

    @property
    def enabled(self) -> bool:
        return self.address is not None

    @property
    def ping_interval_s(self) -> Optional[float]:
        """How often ping() really sends: a quarter of WatchdogSec (systemd asks for at least every half)."""
        return None if self.watchdog_s is None else self.watchdog_s / 4

    def send(self, message: str) -> bool:
        """Send one datagram (e.g. "READY=1"); False when disabled or the send failed (logged once)."""
        if self.address is None:
            return False
        with self._lock:
            try:
                if self._sock is None:
                    self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                    # never block the engine loop on a reader that stopped reading: a full queue drops the ping
                    self._sock.setblocking(False)
                self._sock.sendto(message.encode(), self.address)
                return True
            except OSError as exc:
                if not self._warned:
                    self._warned = True
                    log.warning("sd_notify to %r failed: %s", self.address, exc)
                return False

    def ping(self) -> None:
        """WATCHDOG=1, rate-limited to ping_interval_s. Call it from the engine loop thread only."""
        if self.watchdog_s is None or self.address is None:
            return
        now = time.monotonic()
        if now - self._last_ping >= self.ping_interval_s:
            self._last_ping = now
            self.send("WATCHDOG=1")
