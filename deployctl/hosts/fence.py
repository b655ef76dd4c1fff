"""Fencing tokens on the host side: the deploy lock's generation, checked in the same remote command that acts.

Every host of a service (and the router host) keeps ``<deploy_root>/state/fence``: line 1 the newest lock
generation (an integer, raised by every taking of the deploy lock: deployctl.rollout.lock), line 2 who took it (a
one-line description). A Host that carries a ``Fence`` (its holder's generation) prefixes every command it runs
with ``guard``: when the file holds a newer generation, the command is refused before it does anything (exit
FENCE_EXIT, ``deployctl-fenced: CURRENT WHO`` on stderr) and ``Host.run`` raises ``Fenced`` (exit 7). Files are
written to a temporary name, then moved in by a guarded ``mv``. So a holder that was stopped (SIGSTOP, a frozen VM)
while another command took the lock over changes nothing once it runs again: the check happens on the host at
the moment of the change, not once at the start. A Host without a Fence (reads before any lock, a rollback's
first traffic move) runs unguarded.
"""
from __future__ import annotations

import re
import shlex
import threading
from typing import Optional

from deployctl.config.layout import state_file
from deployctl.errors import Fenced

# the exit status of a refused command (outside the range of deployctl's host scripts and of signals)
FENCE_EXIT = 87
MARKER = "deployctl-fenced:"
FILE = "fence"


class Fence:
    """The generation a lock holder presents on every host (``generation``, an int > 0), ``command`` naming that
    holder for messages. ``refused`` keeps the first refusal, so that code which swallows a host's error (a best
    effort abort) can still tell that it was fenced. Shared by all of one holder's Host objects; thread-safe."""

    def __init__(self, generation: int, command: str = "deploy"):
        self.generation = int(generation)
        self.command = command
        self.refused: Optional[Fenced] = None
        self._lock = threading.Lock()

    def path(self, host_config) -> str:
        return state_file(host_config, FILE)

    def guard(self, host_config) -> str:
        """The shell line run before each command on the host (module doc)."""
        f = shlex.quote(self.path(host_config))
        return (f"{{ g=$(head -n 1 {f} 2>/dev/null); case \"$g\" in ''|*[!0-9]*) g=0;; esac; "
                f"if [ \"$g\" -gt {self.generation} ]; then printf '{MARKER} %s %s\\n' \"$g\" "
                f"\"$(sed -n 2p {f} 2>/dev/null)\" >&2; exit {FENCE_EXIT}; fi; }}")

    def check(self, host_name: str, exit_code: int, stderr: str) -> None:
        """Raise Fenced when a command's result is the guard's refusal (and remember it in ``refused``)."""
        if exit_code != FENCE_EXIT or MARKER not in (stderr or ""):
            return
        line = next(ln for ln in stderr.splitlines() if MARKER in ln)
        m = re.search(re.escape(MARKER) + r" (\d+) ?(.*)", line)
        current, by = (int(m.group(1)), m.group(2).strip()) if m else (0, "")
        err = Fenced(f"{self.command} (lock generation {self.generation}) was taken over: {host_name} refused its "
                     f"action, the lock's generation there is {current}"
                     + (f", taken over by {by}" if by else ""),
                     generation=self.generation, current=current, by=by,
                     fix="this process changed nothing after the takeover; see `deployctl status` and "
                         "`deployctl history`")
        with self._lock:
            if self.refused is None:
                self.refused = err
        raise err


def write_command(host_config, generation: int, who: str) -> str:
    """A shell command that raises the host's fence file to ``generation`` (never lowers it), atomically."""
    f = shlex.quote(state_file(host_config, FILE))
    tmp = shlex.quote(state_file(host_config, f".{FILE}.tmp")) + ".$$"
    who = shlex.quote(who.replace("\n", " "))
    return (f"g=$(head -n 1 {f} 2>/dev/null); case \"$g\" in ''|*[!0-9]*) g=0;; esac; "
            f"if [ \"$g\" -lt {int(generation)} ]; then printf '%s\\n%s\\n' {int(generation)} {who} > {tmp} "
            f"&& mv -f {tmp} {f}; fi")


def read_command(host_config) -> str:
    """A shell command printing the host's fence generation (0 when there is none)."""
    f = shlex.quote(state_file(host_config, FILE))
    return f"g=$(head -n 1 {f} 2>/dev/null); case \"$g\" in ''|*[!0-9]*) g=0;; esac; echo \"$g\""
