"""New SSH connections start at a bounded rate per sshd endpoint, so that many host entries behind one sshd (a bastion,
a NAT address, several replicas of one machine) do not all handshake at once.

sshd counts connections that have not authenticated yet against MaxStartups ``start:rate:full`` and drops them over
``start`` with a probability rising to 100 % at ``full`` (sshd_config(5)). A token bucket per endpoint (the address
and port deployctl connects to, shared by every entry that names it) lets ``hosts[].connect_rate`` connections start
per second, in bursts of up to the same number: with the default 10 the first 10 start at once, OpenSSH's default
MaxStartups start (10:30:100), and a loopback or LAN handshake finishes well inside the 0.1 s that each further
token takes. Within one deployctl process; the bound holds for every fan-out (preflight, deploy, status) alike.
"""
from __future__ import annotations

import threading
import time

DEFAULT_PER_S = 10.0  # OpenSSH's MaxStartups default start, 10:30:100 (sshd_config(5))


class _Bucket:
    """Tokens for one endpoint: ``rate`` per second, at most ``rate`` saved (the burst). ``tokens`` may go below 0:
    each caller reserves its token and sleeps until the bucket has refilled to it."""

    def __init__(self, rate: float):
        self.rate = rate
        self.tokens = rate
        self.stamp = time.monotonic()

    def reserve(self, rate: float) -> float:
        """Take one token; returns the seconds to wait before starting. The lowest rate any entry asked for wins."""
        now = time.monotonic()
        self.rate = min(self.rate, rate)
        self.tokens = min(self.rate, self.tokens + (now - self.stamp) * self.rate) - 1
        self.stamp = now
        return max(0.0, -self.tokens / self.rate)


_lock = threading.Lock()
_buckets: dict[tuple[str, int], _Bucket] = {}


def wait_turn(host: str, port: int, rate: float) -> float:
    """Block until a new connection to ``host``:``port`` may start under ``rate`` connections per second (module
    doc); returns the seconds waited."""
    with _lock:
        bucket = _buckets.get((host, int(port)))
        if bucket is None:
            bucket = _buckets[(host, int(port))] = _Bucket(float(rate))
        wait = bucket.reserve(float(rate))
    if wait > 0:
        time.sleep(wait)
    return wait
