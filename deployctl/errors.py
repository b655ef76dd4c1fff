"""The project's exceptions. Each carries the exit code of ../shared/CONTRACTS.md; the CLI turns
one into a one-line message and that code. Messages name the thing, the value and the fix."""
from __future__ import annotations

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_USAGE = 2
EXIT_CONFIG = 3
EXIT_REMOTE = 4
EXIT_HEALTH = 5
EXIT_ABORTED = 6
EXIT_INTERRUPTED = 130


class DeployctlError(Exception):
    """Base class: ``str(err)`` is the one-line message shown to the operator."""

    exit_code = EXIT_CHECK_FAILED

    def __init__(self, message: str, *, fix: str | None = None):
        super().__init__(message)
        self.message = message
        self.fix = fix

    def __str__(self) -> str:
        return f"{self.message}; {self.fix}" if self.fix else self.message


class CheckFailed(DeployctlError):
    """A check, verification or analysis failed (exit 1)."""

    exit_code = EXIT_CHECK_FAILED


class UsageError(DeployctlError):
    """Wrong command-line usage (exit 2)."""

    exit_code = EXIT_USAGE


class ConfigError(DeployctlError):
    """deploy.yaml, a model config or another input file is wrong (exit 3)."""

    exit_code = EXIT_CONFIG


class RemoteError(DeployctlError):
    """A remote or SSH operation failed (exit 4)."""

    exit_code = EXIT_REMOTE


class HealthError(DeployctlError):
    """Health or sample inference failed (exit 5)."""

    exit_code = EXIT_HEALTH


class RolloutAborted(DeployctlError):
    """The rollout was aborted and traffic is back on stable (exit 6)."""

    exit_code = EXIT_ABORTED


def about(host: str, err: object) -> str:
    """``"host: message"`` for an error on ``host``, without doubling a prefix the message already has."""
    text = str(err)
    return text if text.startswith(f"{host}:") else f"{host}: {text}"
