"""Runbook standby-expired (issue 25): an expired standby (the previous release asleep on the other port) is
stopped and forgotten; one inside its window is left asleep. The standby here is a real process group whose
supervisor pidfile is ``shared/run/runtime.<port>.pid``, as launch.sh leaves it; the host is ``address: local``."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from support.runbook_fleet import cli, free_port, make_tiny_model, write_deploy_yaml


def _standby(root: Path, port: int, expires_at: float) -> subprocess.Popen:
    run = root / "shared" / "run"
    run.mkdir(parents=True, exist_ok=True)
    rdir = root / "releases" / "20260101T000000Z-00000000"
    rdir.mkdir(parents=True, exist_ok=True)
    # a process group leader running in its release dir, like launch.sh's supervisor (a pid is the deploy root's
    # only when it runs there or names it: snippets.SH_OURS)
    proc = subprocess.Popen(["sleep", "300"], start_new_session=True, cwd=rdir)
    (run / f"runtime.{port}.pid").write_text(f"{proc.pid}\n")
    (run / "standby.json").write_text(json.dumps({"release": "20260101T000000Z-00000000", "port": port,
                                                  "since": expires_at - 86400, "expires_at": expires_at}))
    return proc


def test_standby_expired_stops_an_expired_standby_and_leaves_a_valid_one(tmp_path):
    root = tmp_path / "deploy"
    hosts = [{"name": "local-a", "address": "local", "deploy_root": str(root), "python": sys.executable,
              "launcher": "process", "spare_port": free_port()}]
    cfg = write_deploy_yaml(tmp_path / "deploy.yaml", hosts, port=free_port(),
                            model_path=str(make_tiny_model(tmp_path / "model")), server={"drain_timeout_s": 2})
    port = free_port()
    valid = _standby(root, port, time.time() + 3600)
    try:
        r = cli("runbook", "run", "standby-expired", "-c", str(cfg), "--yes")
        assert r.returncode == 0, r.stderr
        assert valid.poll() is None and (root / "shared" / "run" / "standby.json").exists()
    finally:
        valid.kill()
        valid.wait()
    expired = _standby(root, port, time.time() - 1)
    try:
        r = cli("runbook", "run", "standby-expired", "-c", str(cfg), "--yes")
        assert r.returncode == 0, r.stdout + r.stderr
        assert "stopped the expired standby of 20260101T000000Z-00000000" in r.stdout + r.stderr
        assert expired.wait(timeout=30) is not None
        assert not (root / "shared" / "run" / "standby.json").exists()
    finally:
        if expired.poll() is None:
            expired.kill()
