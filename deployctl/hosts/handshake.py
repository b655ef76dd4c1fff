"""Handshakes the server dropped, and when to try again.

sshd closes a connection it will not serve before or during the banner and key exchange: MaxStartups (the
unauthenticated connections over ``start`` are dropped with probability rising to 100 % at ``full``, sshd_config(5)),
PerSourcePenalties, a restarting sshd. The client then reads EOF or a reset, not a timeout: such a handshake is
worth trying again after a pause, one that did not answer in time is not.

Backoff: "full jitter" (AWS Architecture Blog, M. Brooker, "Exponential Backoff And Jitter", 2015): try n waits a
uniform random time in [0, min(cap, base * 2**n)], so that many clients dropped together do not come back together.
"""
from __future__ import annotations

import random
import socket

import paramiko

DROPPED = (EOFError, ConnectionResetError, ConnectionAbortedError, BrokenPipeError)
BASE_S = 0.05  # first pause's upper bound
CAP_S = 2.0  # longest pause


def is_dropped(exc: BaseException) -> bool:
    """Whether ``exc`` (raised while connecting) means the server closed or reset the connection during the banner or
    the key exchange. paramiko wraps the cause in SSHException("Error reading SSH protocol banner"): the cause is
    followed through __cause__ / __context__. A timeout is not a drop."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, (socket.timeout, TimeoutError)):
            return False
        if isinstance(exc, DROPPED):
            return True
        if isinstance(exc, paramiko.SSHException) and "Connection reset" in str(exc):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def pause_s(attempt: int, rng: random.Random = random._inst) -> float:
    """Seconds to wait before try ``attempt`` + 1 (attempt 0 is the first retry): full jitter, see module doc."""
    return rng.uniform(0, min(CAP_S, BASE_S * 2 ** attempt))
