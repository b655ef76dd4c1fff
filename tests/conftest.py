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
# The suite judges deployctl's output as an operator's pipe gets it (rich's default width; deployctl's tables at 200
# columns): a test that wants a terminal width sets COLUMNS itself. pytest-xdist's workers inherit COLUMNS=80 and
# LINES=24 from the controller (GNU readline exports them there), which would cut tables and paths at 80 columns.
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)
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


def pytest_configure(config):
    if config.pluginmanager.hasplugin("xdist"):
        return  # it registers the marker
    config.addinivalue_line("markers", "xdist_group(name): run with the other tests of group `name` on one xdist "
                                       "worker, one after another (tests/run.sh's --dist loadgroup); every other "
                                       "test runs on the worker of its file")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """The `gpu` marker's skip rule. On an xdist worker (tests/run.sh: -n N --dist loadgroup), also the files with
    fleet tests first: the scheduler hands out files in this order, so that the longest waits start early instead of
    making a tail at the end."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        _heavy_files_first(items)
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _heavy_files_first(items) -> None:
    weight: dict[str, int] = {}
    for item in items:
        heavy = item.get_closest_marker("slow") is not None or "rollout_env" in getattr(item, "fixturenames", ())
        weight[item.nodeid.split("::")[0]] = weight.get(item.nodeid.split("::")[0], 0) + heavy
    items.sort(key=lambda item: -weight[item.nodeid.split("::")[0]])  # stable: file order kept within a weight


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """--dist loadgroup as tests/run.sh uses it: one work unit per test file (its module fixtures built once, as with
    loadfile), except tests marked ``xdist_group(name)``: one unit per group, across files. Units go out in the
    workers' collection order (heavy files first, see above), not re-sorted by their number of tests."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class FileOrGroupScheduling(LoadGroupScheduling):
        def __init__(self, config, log=None):
            super().__init__(config, log)
            config.option.loadscopereorder = False

        def _split_scope(self, nodeid: str) -> str:
            if nodeid.rfind("@") > nodeid.rfind("]"):
                return nodeid.split("@")[-1]
            return nodeid.split("::", 1)[0]

    return FileOrGroupScheduling(config, log)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def python_exe() -> str:
    return sys.executable
