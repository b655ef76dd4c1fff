"""Which failures of a rollout are the infrastructure's, not the release's: a deploy that aborts on one says so and
exits 4 (RemoteError), not 6 ("fix the release"): the release was never judged.

Infrastructure: the SSH connection (unreachable, refused, timed-out keepalive, authentication, host key, a host
that missed its group's deadline, sudo wanting a password), a full disk on a host, an unreadable state file.
Everything else (a failed start, sample inference or analysis, a release whose install fails) stays the release's.
"""
from __future__ import annotations

from typing import Optional

from deployctl.errors import RemoteError
from deployctl.hosts.base import (AuthFailed, HostDeadline, HostKeyChanged, HostKeyUnknown, HostUnreachable,
                                  SudoPasswordRequired)
from deployctl.rollout.state import StateUnreadable

_SSH = (HostUnreachable, AuthFailed, HostKeyUnknown, HostKeyChanged, HostDeadline, SudoPasswordRequired)
_DISK = ("No space left on device", "Disk quota exceeded")


class InfraAborted(RemoteError):
    """The rollout aborted on an infrastructure error (module doc); traffic is back on stable (exit 4)."""


def kind(err: Optional[BaseException]) -> Optional[str]:
    """``"SSH"``, ``"disk"`` or ``"state"`` when ``err`` (or an error it was raised from) is the infrastructure's;
    None when it is not."""
    seen = 0
    while err is not None and seen < 5:
        if isinstance(err, _SSH):
            return "SSH"
        if isinstance(err, StateUnreadable):
            return "state"
        if isinstance(err, RemoteError) and any(d in f"{err} {getattr(err, 'stderr_tail', '')}" for d in _DISK):
            return "disk"
        err, seen = err.__cause__ or err.__context__, seen + 1
    return None
