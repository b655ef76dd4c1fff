"""What deployctl reads from its own process environment.

``actor()``: who runs deployctl, ``user@machine``.
"""
from __future__ import annotations

import getpass
import os
import socket


def actor() -> str:
    """``user@machine`` of the operator running deployctl."""
    try:
        user = getpass.getuser()
    except Exception:  # no passwd entry (containers)
        user = os.environ.get("USER", "unknown")
    return f"{user}@{socket.gethostname()}"
