"""Suite-wide fixtures and the `gpu` marker's skip rule.

The shared fixtures (real sshd fleet, real nginx, the rollout environment) live in tests/support/ and load as
pytest plugins, so that every test directory can use them; helpers are imported from ``support.*``.
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

# Every runtime the tests start shares 2 cores with the test runner and other runtimes: one
# intra-op thread each avoids OpenMP oversubscription (TPOT 30-60 ms with default threads, ~1.3 ms
# with one, measured here). Subprocesses inherit it.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Rollout journals and detached runners' files (deployctl.rollout.journal) go to a folder of this session, never the
# developer's ~/.local/state/deployctl (rollout_env gives each test its own).
if not os.environ.get("DEPLOYCTL_STATE"):
    import tempfile

    os.environ["DEPLOYCTL_STATE"] = tempfile.mkdtemp(prefix="deployctl-test-state-")

pytest_plugins = [
    "support.sshd",  # ssh_fleet, fleet_client_key: real sshd on loopback
    "support.nginx",  # nginx_router: a real nginx under its own prefix
    "support.rollout",  # rollout_env: sshd fleet + nginx + runtime on CPU, deploy.yaml
    "support.runtime",  # slow_tiny_runtime: one tiny-model runtime for the router and bench tests
]

REPO_ROOT = Path(__file__).resolve().parent.parent


def _has_cuda() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def python_exe() -> str:
    return sys.executable
