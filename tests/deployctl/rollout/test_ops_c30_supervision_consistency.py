"""C30 and fleet consistency on two local hosts running the real runtime under launch.sh.

C30: kill -9 only the supervisor (launch.sh) of a host: `status` shows it unsupervised, not healthy, and
`status --check` exits 1 naming it (no raw URLError, no doubled host prefix); the connection-resets runbook
restarts it under a supervisor. Consistency: the model manifest changes and only one host restarts (it loads
other weights than the rest): `status --check` names that host (exit 1), and a deploy's preflight warns."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

pytestmark = pytest.mark.slow


def _cli(path, *args, env):
    return subprocess.run([sys.executable, "-m", "deployctl", *args, "-c", str(path)], capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL, env={**os.environ, **env})


def _pid(root, name):
    return int((root / "shared" / "run" / name).read_text().split()[0])


def _wait(pred, timeout, what):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def test_c30_unsupervised_host_and_a_host_with_other_weights(tmp_path, rollout_model, rollout_cache, rollout_python):
    import shutil

    from support.ports import free_port

    model = tmp_path / "model"
    shutil.copytree(rollout_model, model)
    cfg = {
        "service": {"name": "ops"},
        "model": {"path": str(model), "served_name": "tiny-chat", "dtype": "float32"},
        "engine": {"device": "cpu", "max_model_len": 256, "max_num_seqs": 4, "max_num_batched_tokens": 256,
                   "kv_cache_memory": "8MiB"},
        "server": {"startup_timeout_s": 90, "drain_timeout_s": 3},
        "hosts": [{"name": n, "address": "local", "deploy_root": str(tmp_path / n), "launcher": "process",
                   "python": rollout_python, "server_port": free_port()} for n in ("a", "b")],
    }
    path = tmp_path / "deploy.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {"DEPLOYCTL_CACHE": str(rollout_cache), "DEPLOYCTL_SKIP_PREFLIGHT": "1", "DEPLOYCTL_VERIFY_TIMEOUT_S": "90",
           "DEPLOYCTL_LAUNCH_BACKOFF_S": "0.5"}
    a, b = tmp_path / "a", tmp_path / "b"
    try:
        r = _cli(path, "deploy", "--yes", env=env)
        assert r.returncode == 0, r.stderr
        r = _cli(path, "status", "--check", env=env)
        assert r.returncode == 0, r.stdout + r.stderr

        # C30: only the supervisor dies; the orphaned runtime keeps serving
        runtime = _pid(a, "runtime.child.pid")
        os.kill(_pid(a, "runtime.pid"), signal.SIGKILL)
        time.sleep(0.5)
        os.kill(runtime, 0)  # still there
        doc = json.loads(_cli(path, "status", "--json", env=env).stdout)
        ha = next(h for h in doc["hosts"] if h["host"] == "a")
        assert ha["runtime_running"] and not ha["supervised"] and not ha["healthy"]
        assert ha["detail"].startswith("unsupervised:") and "connection-resets" in ha["detail"]
        assert next(h for h in doc["hosts"] if h["host"] == "b")["healthy"]
        r = _cli(path, "status", "--check", env=env)
        assert r.returncode == 1, r.stdout + r.stderr
        assert "status --check: a unhealthy (unsupervised:" in r.stderr and "b unhealthy" not in r.stderr
        assert "URLError" not in r.stdout + r.stderr and "a: a:" not in r.stderr

        r = _cli(path, "runbook", "run", "connection-resets", "--host", "a", "--yes", env=env)
        out = r.stdout + r.stderr
        assert "runs unsupervised" in out and "restart" in out, out
        r = _cli(path, "status", "--check", env=env)
        assert r.returncode == 0, r.stdout + r.stderr  # back under a supervisor, serving
        assert _pid(a, "runtime.child.pid") != runtime

        # other weights on one host: the manifest changes (same files, another order: still valid) and only b's
        # runtime restarts (its supervisor brings it back with the new manifest)
        lines = (model / "manifest.sha256").read_text().splitlines()
        (model / "manifest.sha256").write_text("\n".join(reversed(lines)) + "\n")
        old_b = _pid(b, "runtime.child.pid")
        os.kill(old_b, signal.SIGKILL)
        _wait(lambda: (b / "shared/run/runtime.child.pid").exists() and _pid(b, "runtime.child.pid") != old_b
              and _cli(path, "status", "--json", env=env).stdout.count('"healthy": true') == 2, 120, "b restarted")
        r = _cli(path, "status", "--check", env=env)
        assert r.returncode == 1, r.stdout + r.stderr
        assert "b: model manifest " in r.stderr and "differs from the rest" in r.stderr and "on a)" in r.stderr
        assert "inconsistent: b: model manifest" in r.stdout
        doc = json.loads(_cli(path, "status", "--json", env=env).stdout)
        assert [d.split(":")[0] for d in doc["differences"]] == ["b"]

        # a deploy's preflight warns about it; the deploy (no router: all hosts at once) makes the hosts agree
        r = _cli(path, "deploy", "--yes", env={**env, "DEPLOYCTL_SKIP_PREFLIGHT": "0"})
        assert "fleet already inconsistent: b: model manifest" in r.stderr, r.stderr
        assert r.returncode == 0 and "no router: no canary possible" in r.stderr, r.stderr
        r = _cli(path, "status", "--check", env=env)
        assert r.returncode == 0, r.stdout + r.stderr
    finally:
        for root in (a, b):
            for name in ("runtime.pid", "runtime.child.pid"):
                try:
                    os.killpg(_pid(root, name), signal.SIGKILL)
                except (OSError, ValueError):
                    pass
