"""deploy.yaml loading: the example shape loads frozen; every error names file, line, key, value, fix."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from deployctl.config import load_config, parse_config
from deployctl.errors import ConfigError
from support.cli import repo_env
from support.paths import DATA
EXAMPLE = (DATA / "example-deploy.yaml").read_text()


def test_example_loads_frozen():
    cfg = parse_config(EXAMPLE)
    assert cfg.service.name == "chat-7b"
    assert [h.name for h in cfg.hosts] == ["gpu-a", "gpu-b"]
    assert cfg.engine.max_model_len == 8192 and cfg.engine.block_size == 16
    assert cfg.rollout.weights == [5, 25, 50, 100]
    assert cfg.rollout.analysis.max_p99_ttft_ratio == 2.0
    with pytest.raises(Exception):
        cfg.engine.max_model_len = 4096  # frozen


def _error(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "deploy.yaml")
    assert info.value.exit_code == 3
    return str(info.value)


def test_unknown_key_gets_did_you_mean_with_line():
    text = EXAMPLE.replace("  max_num_seqs: 64", "  max_num_seq: 64")
    line = next(i + 1 for i, l in enumerate(text.splitlines()) if l.startswith("  max_num_seq:"))
    msg = _error(text)
    assert f"deploy.yaml:{line}:" in msg
    assert "engine.max_num_seq" in msg and "did you mean 'max_num_seqs'" in msg


def test_bad_value_names_key_value_and_allowed():
    text = EXAMPLE.replace("gpu_memory_utilization: 0.90", "gpu_memory_utilization: 1.5")
    line = next(i + 1 for i, l in enumerate(text.splitlines()) if "gpu_memory_utilization" in l)
    msg = _error(text)
    assert f"deploy.yaml:{line}: engine.gpu_memory_utilization" in msg
    assert "1.5" in msg and "less than or equal to 1" in msg


def test_bad_literal_lists_choices():
    msg = _error(EXAMPLE.replace("device: cuda", "device: tpu"))
    assert "engine.device" in msg and "'cuda'" in msg and "'cpu'" in msg and "tpu" in msg


def test_yaml_syntax_error_gives_line_and_column():
    text = "service:\n  name: x\nmodel: [unclosed\n"
    msg = _error(text)
    assert msg.startswith("deploy.yaml:") and "YAML syntax error" in msg
    line_col = msg.split(":")[1:3]
    assert all(part.isdigit() for part in line_col)


def test_missing_required_key():
    text = EXAMPLE.replace("service:\n  name: chat-7b\n", "")
    assert "service is required" in _error(text)


def test_cross_checks():
    assert "duplicate host name 'gpu-a'" in _error(EXAMPLE.replace("name: gpu-b", "name: gpu-a"))
    open_bind = "\n".join(l for l in EXAMPLE.replace("bind: 127.0.0.1", "bind: 0.0.0.0").splitlines()
                          if "api_key_env" not in l)
    assert "api_key_env" in _error(open_bind)
    assert "steps must be increasing" in _error(EXAMPLE.replace("steps: [5, 25, 50, 100]", "steps: [50, 25, 100]"))
    assert "block_size must be a power of two" in _error(EXAMPLE.replace("block_size: 16", "block_size: 12"))


def test_router_host_resolves():
    cfg = parse_config(EXAMPLE)
    assert cfg.router_host().address == "gw" and cfg.router_host().port == 22
    named = parse_config(EXAMPLE.replace("host: gw", "host: gpu-b"))
    assert named.router_host().address == "gpu-b.internal"


def test_sizes_accept_units():
    text = EXAMPLE.replace("  block_size: 16\n", "  block_size: 16\n  kv_cache_memory: 2GiB\n")
    assert parse_config(text).engine.kv_cache_memory == 2 * 2**30
    assert "expected a size" in _error(text.replace("2GiB", "lots"))


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="no such file.*deployctl init"):
        load_config(tmp_path / "deploy.yaml")


def test_cli_config_error_exit_3_one_line(tmp_path):
    bad = tmp_path / "deploy.yaml"
    bad.write_text(EXAMPLE.replace("max_model_len: 8192", "max_model_len: -5"))
    proc = subprocess.run([sys.executable, "-m", "deployctl", "plan", "-c", str(bad), "--gpu-memory", "80GiB"],
                          capture_output=True, text=True)
    assert proc.returncode == 3
    lines = [l for l in proc.stderr.strip().splitlines() if l.strip()]
    assert len(lines) == 1 and "engine.max_model_len" in lines[0] and "-5" in lines[0]
    assert "Traceback" not in proc.stderr


# -- regressions (from test_config_edge_cases.py): Malformed deploy.yaml files through the real CLI: each is one line on stderr naming the file, exit 3 (config error), never a traceback.

ENV = repo_env()


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
    # counted outside the file's path, which may hold "12" itself (pytest's tmp dirs are numbered)
    assert err.replace(str(bad), "DEPLOY_YAML").count("12") == 1, err  # was "..., got 12 (got 12)"
