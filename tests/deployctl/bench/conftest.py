"""Fixtures for the bench tests: running `deployctl bench` as a real subprocess."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(REPO), str(REPO / "runtime")]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    for name in ("DEPLOYCTL_API_KEY", "OPENAI_API_KEY", "HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        env.pop(name, None)
    return env


@pytest.fixture
def run_bench():
    """run_bench(*args, env=None, timeout=120) -> (returncode, json document or None, stderr)."""

    def run(*args: str, env: dict[str, str] | None = None, timeout: float = 120):
        full_env = _env()
        full_env.update(env or {})
        proc = subprocess.run(
            [sys.executable, "-m", "deployctl", "bench", *args],
            capture_output=True, text=True, env=full_env, timeout=timeout, cwd=REPO,
        )
        doc = json.loads(proc.stdout) if "--json" in args and proc.stdout.strip() else None
        return proc.returncode, doc, proc.stderr

    return run
