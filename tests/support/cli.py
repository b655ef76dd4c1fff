"""deployctl's command line for tests, two ways.

- ``deployctl(*args)``: a fresh interpreter (``python -m deployctl``): exit codes and streams exactly as an operator
  sees them; the repository first on PYTHONPATH.
- ``run_cli(*args)``: the same typer app in this process (faster; the same error boundary, cli._app._Group), with
  ``.returncode``, ``.stdout`` and ``.stderr`` like a CompletedProcess. Environment changes go through ``env``.
"""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional

from support.paths import REPO


def repo_env(extra: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    """This process's environment with the repository (and runtime/, for ``python -m deployctl_runtime``) first on
    PYTHONPATH, plus ``extra``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), str(REPO / "runtime"), env.get("PYTHONPATH", "")) if p)
    return {**env, **(extra or {})}


def deployctl(*args: str, env: Optional[Mapping[str, str]] = None, input: Optional[str] = None,
              cwd: Optional[Path] = None, timeout: float = 240) -> subprocess.CompletedProcess:
    """``python -m deployctl ARGS`` in a fresh interpreter; ``env`` is added to this process's environment."""
    return subprocess.run([sys.executable, "-m", "deployctl", *args], input=input if input is not None else "",
                          capture_output=True, text=True, env=repo_env(env), cwd=cwd, timeout=timeout)


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str


def run_cli(*args: str, env: Optional[Mapping[str, str]] = None, input: Optional[str] = None) -> CliResult:
    """``deployctl ARGS`` in this process (typer's CliRunner over deployctl.cli.app)."""
    from typer.testing import CliRunner

    from deployctl.cli import app

    result = CliRunner().invoke(app, list(args), input=input, env=dict(env or {}))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return CliResult(result.exit_code, result.stdout, result.stderr)
