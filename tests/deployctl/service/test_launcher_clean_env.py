"""A runtime started on an ``address: local`` host gets its release's runtime.env and launch.sh's exports over a
short allow-list (service.launcher.START_ENV_ALLOW), not deployctl's environment: a variable set for deployctl
is absent from /proc/PID/environ of the runtime it started, and of its supervisor."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
import yaml

from support.rollout import local_tiny_config

pytestmark = pytest.mark.slow


def _environ(pid: int) -> dict[str, str]:
    raw = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
    return dict(item.decode().partition("=")[::2] for item in raw if item)


def test_local_runtime_does_not_inherit_deployctls_environment(tmp_path, rollout_model, rollout_cache, rollout_python):
    cfg = local_tiny_config(tmp_path, "envs", rollout_model, rollout_python, ["a"], api_key_env="ENVS_API_KEY",
                            max_num_seqs=2)
    path = tmp_path / "deploy.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "DEPLOYCTL_CACHE": str(rollout_cache), "DEPLOYCTL_SKIP_PREFLIGHT": "1",
           "DEPLOYCTL_VERIFY_TIMEOUT_S": "90", "ENVS_API_KEY": "k-envs-123",
           "OPERATOR_TOKEN": "do-not-leak", "https_proxy": "http://proxy.invalid:3128",
           "DEPLOYCTL_LAUNCH_BACKOFF_S": "0.5"}
    run = tmp_path / "a" / "shared" / "run"
    try:
        r = subprocess.run([sys.executable, "-m", "deployctl", "deploy", "--yes", "-c", str(path)], env=env,
                           capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
        assert r.returncode == 0, r.stderr
        for name in ("runtime.child.pid", "runtime.pid"):
            seen = _environ(int((run / name).read_text().split()[0]))
            assert "OPERATOR_TOKEN" not in seen and "https_proxy" not in seen, (name, sorted(seen))
            assert "PYTHONPATH" not in seen and "DEPLOYCTL_CACHE" not in seen, (name, sorted(seen))
            assert seen.get("PATH") == os.environ["PATH"] and seen.get("DEPLOYCTL_LAUNCH_BACKOFF_S") == "0.5"
        child = _environ(int((run / "runtime.child.pid").read_text().split()[0]))
        # what the release's env file gives: the key under the runtime's own variable
        assert child.get("DEPLOYCTL_RUNTIME_API_KEY") == "k-envs-123" and "ENVS_API_KEY" not in child
    finally:
        for name in ("runtime.pid", "runtime.child.pid"):
            try:
                os.killpg(int((run / name).read_text().split()[0]), signal.SIGKILL)
            except (OSError, ValueError):
                pass
