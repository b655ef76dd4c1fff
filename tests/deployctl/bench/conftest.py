"""Fixtures for the bench tests: running `deployctl bench` as a real subprocess."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from bench_helpers import REPO, subprocess_env


@pytest.fixture
def run_bench():
    """run_bench(*args, env=None, timeout=120) -> (returncode, json document or None, stderr)."""

    def run(*args: str, env: dict[str, str] | None = None, timeout: float = 120):
        full_env = subprocess_env()
        full_env.update(env or {})
        proc = subprocess.run(
            [sys.executable, "-m", "deployctl", "bench", *args],
            capture_output=True, text=True, env=full_env, timeout=timeout, cwd=REPO,
        )
        doc = json.loads(proc.stdout) if "--json" in args and proc.stdout.strip() else None
        return proc.returncode, doc, proc.stderr

    return run
