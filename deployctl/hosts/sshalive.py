"""SSH transport keepalive: a frozen peer or a dropped connection found within interval × count.

paramiko's own ``Transport.set_keepalive`` only sends (no reply asked), so a peer whose kernel still ACKs TCP but
whose sshd is stopped (SIGSTOP, a hung host) looks connected until the next command hangs. ``Keepalive`` asks for
a reply instead: every ``interval_s`` a ``keepalive@openssh.com`` global request with want-reply (OpenSSH answers it
with REQUEST_FAILURE, which is an answer; as ServerAliveInterval does, ssh(1) ssh_config). When no answer arrived
for ``interval_s × count`` seconds (ServerAliveCountMax) it closes the transport: the command in flight fails at
once and ``dead`` holds the reason, which the transport reports (deployctl.hosts.ssh).
"""
from __future__ import annotations

import threading
import time
from typing import Optional


class Keepalive:
    """Watch one paramiko Transport. ``interval_s`` seconds between requests, ``count`` unanswered intervals
    before the peer is declared dead (count >= 2: a reply takes a round trip). ``stop()`` ends both threads."""

    def __init__(self, transport, interval_s: float, count: int, *, host: str = ""):
        self.transport, self.interval_s, self.count, self.host = transport, float(interval_s), int(count), host
        self.last_heard = time.monotonic()
        self.dead: Optional[str] = None
        self._stop = threading.Event()

    @property
    def bound_s(self) -> float:
        """Seconds without an answer after which the peer is declared dead."""
        return self.interval_s * self.count

    def start(self) -> "Keepalive":
        for fn in (self._ping, self._watch):
            threading.Thread(target=fn, name=f"ssh-keepalive-{self.host}", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _ping(self) -> None:
        while not self._stop.is_set() and self.transport.is_active():
            try:
                # blocks until the peer answers (success or failure) or the transport closes
                self.transport.global_request("keepalive@openssh.com", wait=True)
            except Exception:  # the transport went away: the watcher or the command reports it
                return
            if not self.transport.is_active():
                return
            self.last_heard = time.monotonic()
            self._stop.wait(self.interval_s)

    def _watch(self) -> None:
        tick = min(0.5, self.interval_s / 10)
        while not self._stop.wait(tick):
            if not self.transport.is_active():
                return
            silent = time.monotonic() - self.last_heard
            if silent > self.bound_s:
                self.dead = (f"no answer to SSH keepalives for {silent:.1f} s (keepalive_interval_s "
                             f"{self.interval_s:g} × keepalive_count {self.count}): the host or its sshd is frozen, "
                             "or the network drops the connection")
                try:
                    self.transport.close()
                except Exception:  # closing a dead transport must not raise in a daemon thread
                    pass
                return


__all__ = ["Keepalive"]
