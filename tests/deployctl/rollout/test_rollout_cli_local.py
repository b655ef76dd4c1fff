"""The rollout CLI on a fresh fleet of local hosts (no runtime started): deploy without --yes and without a
terminal asks for --yes and changes nothing; status/history JSON shapes; rollback with no history."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from support.cli import repo_env


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


# -- regressions (from test_rollout_cli_edge_cases.py): status / history / promote / abort / rollback with nothing deployed, with `address: local` hosts and with deploy.yaml values that would put the release tree somewhere else than the operator thinks.

ENV = repo_env()


def cli(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "deployctl", *args], env=ENV, capture_output=True, text=True,
                          timeout=60, cwd=cwd)


def write_cfg(tmp_path: Path, deploy_root: str) -> Path:
    cfg = tmp_path / "deploy.yaml"
    cfg.write_text("service: {name: svc}\nmodel: {path: /nonexistent/model}\nengine: {device: cpu}\n"
                   f"hosts:\n  - {{name: h1, address: local, deploy_root: {json.dumps(deploy_root)}, launcher: process}}\n")
    return cfg


@pytest.mark.parametrize("root,command", [("", "status"), ("", "history"), ("", "promote"), ("", "abort"),
                                          ("", "rollback"), ("relative/dir", "status"), ("/", "status"),
                                          ("/srv/../etc", "status")])
def test_deploy_root_that_is_not_an_absolute_directory_is_a_config_error(tmp_path, root, command):
    # "" made every state path relative ("state/rollout.json" in the cwd); status/history/promote/abort said all is
    # well (exit 0) and a deploy would have written releases/ into the operator's working directory
    cfg = write_cfg(tmp_path, root)
    proc = cli(tmp_path, command, "-c", str(cfg))
    err = proc.stderr.strip()
    assert proc.returncode == 3, (proc.returncode, err)
    assert "Traceback" not in err and len(err.splitlines()) == 1 and "hosts[0].deploy_root" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deploy.yaml"]


@pytest.mark.parametrize("command", ["status --json", "history --json", "promote", "abort"])
def test_nothing_deployed_on_a_local_host_is_reported_and_changes_nothing(tmp_path, command):
    cfg = write_cfg(tmp_path, str(tmp_path / "root"))
    proc = cli(tmp_path, *command.split(), "-c", str(cfg))
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    if "--json" in command:
        json.loads(proc.stdout)
    assert not (tmp_path / "root" / "releases").exists() and not (tmp_path / "root" / "current").exists()


def test_rollback_with_nothing_deployed_says_so(tmp_path):
    cfg = write_cfg(tmp_path, str(tmp_path / "root"))
    proc = cli(tmp_path, "rollback", "-c", str(cfg))
    err = proc.stderr.strip()
    assert proc.returncode == 1 and len(err.splitlines()) == 1 and "--to" in err, err


@pytest.mark.parametrize("command", ["abort", "promote"])
def test_corrupt_rollout_state_is_not_taken_for_no_rollout(tmp_path, command):
    # read_rollout skipped an unparsable rollout.json: abort/promote said "no rollout in progress" (exit 0)
    # while traffic may still be split
    cfg = write_cfg(tmp_path, str(tmp_path / "root"))
    state = tmp_path / "root" / "state"
    state.mkdir(parents=True)
    (state / "rollout.json").write_text('{"generation": 3, "phase": "paused", "canary_wei')  # torn write
    proc = cli(tmp_path, command, "-c", str(cfg))
    err = proc.stderr.strip()
    assert proc.returncode == 4, err
    assert len(err.splitlines()) == 1 and f"h1: {state / 'rollout.json'} is not a valid rollout record" in err, err
    assert "h1: h1:" not in err and "mv " in err


@pytest.mark.parametrize("pct", ["150", "0", "-5", "100"])
def test_deploy_canary_out_of_range_is_a_usage_error_before_any_host_is_touched(tmp_path, pct):
    # --canary was checked only when the plan was made, after preflight had probed every host (minutes on a
    # fleet) and failed or passed on its own; the operator's typo came last or never
    cfg = write_cfg(tmp_path, str(tmp_path / "root"))
    proc = cli(tmp_path, "deploy", "--canary", pct, "--yes", "-c", str(cfg))
    err = proc.stderr.strip()
    assert proc.returncode == 2, err
    assert len(err.splitlines()) == 1 and "--canary" in err and "preflight" not in err, err
    assert not (tmp_path / "root").exists()
