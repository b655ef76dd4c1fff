"""Malformed deploy.yaml files through the real CLI: each is one line on stderr naming the file, exit 3 (config
error), never a traceback."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


def plan(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "deployctl", "plan", "-c", str(path), "--gpu-memory", "80GiB"],
                          env=ENV, capture_output=True, text=True, timeout=60)


def assert_config_error(proc: subprocess.CompletedProcess, *needles: str) -> str:
    err = proc.stderr.strip()
    assert proc.returncode == 3, (proc.returncode, err)
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert err.startswith("error: ")
    for needle in needles:
        assert needle in err, err
    return err


def test_non_utf8_file_is_a_config_error(tmp_path):
    bad = tmp_path / "deploy.yaml"
    bad.write_bytes(b"service: {name: x}\n\xff\xfe garbage\n")
    assert_config_error(plan(bad), str(bad), "UTF-8")


def test_self_referencing_alias_is_a_config_error(tmp_path):
    # `&a [*a]` makes PyYAML build a list that contains itself; indexing lines recursed until RecursionError
    bad = tmp_path / "deploy.yaml"
    bad.write_text("service: {name: x}\nloop: &a [*a, *a]\n")
    assert_config_error(plan(bad), str(bad))


def test_anchors_and_merge_keys_still_work(tmp_path):
    ok = tmp_path / "deploy.yaml"
    ok.write_text("service: {name: x}\nmodel: {path: /nonexistent/m}\n"
                  "hosts:\n  - &h {name: a, address: local, deploy_root: /tmp/x, python: /usr/bin/python3}\n"
                  "  - {<<: *h, name: b}\n")
    proc = plan(ok)  # the config loads (both hosts); the plan then stops at the missing model directory
    assert proc.returncode == 3 and "Traceback" not in proc.stderr, proc.stderr
    assert "/nonexistent/m" in proc.stderr and str(ok) not in proc.stderr, proc.stderr


def test_duplicate_key_is_a_config_error_naming_both_lines(tmp_path):
    # YAML forbids duplicate keys; PyYAML silently kept the last one, so a second `engine:` block quietly
    # replaced the first (here: max_model_len 8192 would have been dropped without a word)
    bad = tmp_path / "deploy.yaml"
    bad.write_text("service: {name: x}\nmodel: {path: /nonexistent/m}\nengine:\n  max_model_len: 8192\n"
                   "engine:\n  max_num_seqs: 8\n"
                   "hosts: [{name: a, address: local, deploy_root: /tmp/x, python: /usr/bin/python3}]\n")
    err = assert_config_error(plan(bad), str(bad), "duplicate key", "engine")
    assert "3" in err and "5" in err


def test_error_text_in_square_brackets_is_printed_verbatim(tmp_path):
    # the one-line error went through rich markup: "[a-z0-9]" in a pattern, or "[bold]" in a user's path,
    # vanished from the message
    bad = tmp_path / "deploy.yaml"
    bad.write_text("service: {name: Bad_Name}\nmodel: {path: /nonexistent/m}\n"
                   "hosts: [{name: a, address: local, deploy_root: /tmp/x, python: /usr/bin/python3}]\n")
    assert_config_error(plan(bad), "^[a-z0-9][a-z0-9-]{0,62}$", "Bad_Name")
    path = tmp_path / "[bold]models"
    bad.write_text(f"service: {{name: x}}\nmodel: {{path: '{path}'}}\n"
                   "hosts: [{name: a, address: local, deploy_root: /tmp/x, python: /usr/bin/python3}]\n")
    assert_config_error(plan(bad), str(path))


def test_preflight_table_shows_bracketed_paths_verbatim(tmp_path):
    model = tmp_path / "[red]weights"
    model.mkdir()
    cfg = tmp_path / "deploy.yaml"
    cfg.write_text(f"service: {{name: x}}\nmodel: {{path: '{model}'}}\nengine: {{device: cpu}}\n"
                   f"hosts: [{{name: a, address: local, deploy_root: '{tmp_path / 'root'}', python: '{sys.executable}'}}]\n")
    proc = subprocess.run([sys.executable, "-m", "deployctl", "preflight", "-c", str(cfg)], env={**ENV, "COLUMNS": "400"},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "[red]weights" in proc.stdout, proc.stdout


def test_value_is_shown_once(tmp_path):
    bad = tmp_path / "deploy.yaml"
    bad.write_text("service: {name: x}\nmodel: {path: /nonexistent/m}\nengine: {block_size: 12}\n"
                   "hosts: [{name: a, address: local, deploy_root: /tmp/x, python: /usr/bin/python3}]\n")
    err = assert_config_error(plan(bad), "power of two")
    assert err.count("12") == 1, err  # was "..., got 12 (got 12)"
