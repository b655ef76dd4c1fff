"""The project's exceptions and its process exit codes. Each exception carries its ``ExitCode`` (the contract's
table); the CLI's ``main()`` turns one into a one-line message and that code. Messages name the thing, the value
and the fix."""
from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """deployctl's process exit statuses."""

    OK = 0
    CHECK_FAILED = 1  # a check, verification or analysis failed
    USAGE = 2  # wrong command line or a bad DEPLOYCTL_* value
    CONFIG = 3  # deploy.yaml or another input file is wrong
    REMOTE = 4  # a remote or SSH operation failed
    HEALTH = 5  # health or sample inference failed
    ABORTED = 6  # the rollout was aborted and traffic is back on stable
    TAKEN_OVER = 7  # another command took the lock over: this one's actions were refused (fenced)
    INTERRUPTED = 130  # Ctrl-C (128 + SIGINT)


class DeployctlError(Exception):
    """Base class: ``str(err)`` is the one-line message shown to the operator."""

    exit_code: ExitCode = ExitCode.CHECK_FAILED

    def __init__(self, message: str, *, fix: str | None = None):
        super().__init__(message)
        self.message = message
        self.fix = fix

    def __str__(self) -> str:
        return f"{self.message}; {self.fix}" if self.fix else self.message


class CheckFailed(DeployctlError):
    """A check, verification or analysis failed (exit 1)."""

    exit_code = ExitCode.CHECK_FAILED


class UsageError(DeployctlError):
    """Wrong command-line usage (exit 2)."""

    exit_code = ExitCode.USAGE


class ConfigError(DeployctlError):
    """deploy.yaml, a model config or another input file is wrong (exit 3)."""

    exit_code = ExitCode.CONFIG


class RemoteError(DeployctlError):
    """A remote or SSH operation failed (exit 4)."""

    exit_code = ExitCode.REMOTE


class HealthError(DeployctlError):
    """Health or sample inference failed (exit 5)."""

    exit_code = ExitCode.HEALTH


class RolloutAborted(DeployctlError):
    """The rollout was aborted and traffic is back on stable (exit 6)."""

    exit_code = ExitCode.ABORTED


class Fenced(DeployctlError):
    """Another command took the deploy lock over (a newer lock generation): an action of this one, presenting
    the older generation, was refused where it would have changed something (exit 7). ``generation`` is ours,
    ``current`` the one that refused it, ``by`` who holds it."""

    exit_code = ExitCode.TAKEN_OVER

    def __init__(self, message: str, *, generation: int = 0, current: int = 0, by: str = "", fix: str | None = None):
        super().__init__(message, fix=fix)
        self.generation, self.current, self.by = generation, current, by


def about(host: str, err: object) -> str:
    """``"host: message"`` for an error on ``host``, without doubling a prefix the message already has."""
    text = str(err)
    return text if text.startswith(f"{host}:") else f"{host}: {text}"
