"""The rollout CLI on a fresh fleet of local hosts (no runtime started): deploy without --yes and without a
terminal asks for --yes and changes nothing; status/history JSON shapes; rollback with no history."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import yaml


def _cli(cfg_path, *args, env=None):
    return subprocess.run([sys.executable, "-m", "deployctl", *args, "-c", str(cfg_path)], capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})})


def test_cli_on_a_fresh_local_fleet(tmp_path, rollout_model, rollout_cache):
    cfg = {
        "service": {"name": "svc"},
        "model": {"path": str(rollout_model), "served_name": "tiny-chat"},
        "engine": {"device": "cpu"},
        "hosts": [{"name": n, "address": "local", "deploy_root": str(tmp_path / n), "launcher": "process",
                   "server_port": p} for n, p in (("a", 1), ("b", 2))],
    }
    path = tmp_path / "deploy.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {"DEPLOYCTL_CACHE": str(rollout_cache), "DEPLOYCTL_SKIP_PREFLIGHT": "1"}

    r = _cli(path, "deploy", env=env)
    assert r.returncode == 2, r.stderr
    assert "no release serves yet" in r.stderr and "pass --yes" in r.stderr
    assert not (tmp_path / "a" / "current").exists() and not (tmp_path / "a" / "state" / "lock").exists()

    r = _cli(path, "status", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["rollout"] is None and doc["lock"] is None
    assert [(h["host"], h["current_release"], h["healthy"], h["weight"]) for h in doc["hosts"]] == [
        ("a", None, False, None), ("b", None, False, None)]

    r = _cli(path, "history", "--json")
    assert r.returncode == 0 and json.loads(r.stdout) == {"history": []}

    r = _cli(path, "rollback")
    assert r.returncode == 1 and "nothing to roll back to" in r.stderr and "--to" in r.stderr
    r = _cli(path, "abort")
    assert r.returncode == 0 and "no rollout in progress" in r.stdout
