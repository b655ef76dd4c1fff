"""Runtime fixtures: tiny checkpoints written once per session by the runtime's own tiny-model code."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

RUNTIME_DIR = Path(__file__).resolve().parents[2] / "runtime"
if str(RUNTIME_DIR) not in sys.path:  # CI installs it editable; locally PYTHONPATH may lack it
    sys.path.insert(0, str(RUNTIME_DIR))


@pytest.fixture(scope="session")
def runtime_env() -> dict:
    """Environment for `python -m deployctl_runtime` subprocesses: our runtime/ first on PYTHONPATH."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(RUNTIME_DIR), env.get("PYTHONPATH", "")) if p)
    return env


@pytest.fixture(scope="session")
def tiny_model_factory(tmp_path_factory):
    """tiny_model_factory(arch="llama", seed=0) -> Path of a tiny checkpoint (cached per arch/seed)."""
    from deployctl_runtime.tiny_model import write_tiny_model

    cache: dict = {}

    def make(arch: str = "llama", seed: int = 0) -> Path:
        key = (arch, seed)
        if key not in cache:
            cache[key] = write_tiny_model(tmp_path_factory.mktemp(f"tiny-{arch}-{seed}"), arch=arch, seed=seed)
        return cache[key]

    return make


@pytest.fixture(scope="session")
def tiny_llama(tiny_model_factory) -> Path:
    return tiny_model_factory("llama")
