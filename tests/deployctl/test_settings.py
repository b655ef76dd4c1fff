"""deployctl/settings.py: every DEPLOYCTL_* variable parsed in one place; a bad value is one line naming the
variable and exit 2 from any command, never a traceback; nothing else in deployctl reads the environment."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from deployctl import settings
from deployctl.errors import ExitCode, UsageError

from support.paths import REPO


def test_unset_variables_give_the_documented_defaults():
    s = settings.load({})
    assert s.lock_max_age_s == 600 and s.verify_timeout_s is None and s.skip_preflight is False
    assert s.known_hosts == Path("~/.config/deployctl/known_hosts").expanduser()
    assert s.cache_dir == Path("~/.cache/deployctl").expanduser() and s.runbooks_path == ()
    assert s.runtime_fault is None and s.templates is None and s.ssh_config is None


def test_values_are_parsed():
    s = settings.load({"DEPLOYCTL_LOCK_MAX_AGE_S": "90", "DEPLOYCTL_VERIFY_TIMEOUT_S": "2.5",
                       "DEPLOYCTL_SKIP_PREFLIGHT": "1", "DEPLOYCTL_RUNBOOKS_PATH": f"/a{os.pathsep}{os.pathsep}~/b",
                       "DEPLOYCTL_KNOWN_HOSTS": "~/kh", "DEPLOYCTL_RUNTIME_FAULT": "crash_at_start"})
    assert (s.lock_max_age_s, s.verify_timeout_s, s.skip_preflight) == (90.0, 2.5, True)
    assert s.runbooks_path == (Path("/a"), Path("~/b").expanduser()) and s.known_hosts == Path("~/kh").expanduser()
    assert s.runtime_fault == "crash_at_start"


@pytest.mark.parametrize("var, value", [("DEPLOYCTL_LOCK_MAX_AGE_S", "6h"), ("DEPLOYCTL_LOCK_MAX_AGE_S", "0"),
                                        ("DEPLOYCTL_VERIFY_TIMEOUT_S", "-5"), ("DEPLOYCTL_VERIFY_TIMEOUT_S", "nan"),
                                        ("DEPLOYCTL_VERIFY_TIMEOUT_S", "inf"), ("DEPLOYCTL_SKIP_PREFLIGHT", "maybe")])
def test_a_bad_value_is_a_usage_error_naming_the_variable(var, value):
    with pytest.raises(UsageError) as info:
        settings.load({var: value})
    assert f"${var}={value!r}" in str(info.value) and info.value.exit_code == ExitCode.USAGE == 2


def test_current_follows_the_environment(monkeypatch):
    monkeypatch.setenv("DEPLOYCTL_LOCK_MAX_AGE_S", "60")
    assert settings.current().lock_max_age_s == 60
    monkeypatch.setenv("DEPLOYCTL_LOCK_MAX_AGE_S", "120")
    assert settings.current().lock_max_age_s == 120
    monkeypatch.delenv("DEPLOYCTL_LOCK_MAX_AGE_S")
    assert settings.current().lock_max_age_s == 600


@pytest.mark.parametrize("argv", [["status", "-c", "deploy.yaml"], ["runbook", "list"]])
def test_a_bad_value_stops_any_command_with_one_line_and_exit_2(tmp_path, argv):
    """The rollout lock's variable used to be float()-ed at import: every rollout command died with a traceback."""
    env = dict(os.environ, PYTHONPATH=str(REPO), DEPLOYCTL_LOCK_MAX_AGE_S="six hours")
    proc = subprocess.run([sys.executable, "-m", "deployctl", *argv], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "DEPLOYCTL_LOCK_MAX_AGE_S" in lines[0] and "Traceback" not in proc.stderr, lines


def _reads_environment(tree: ast.AST) -> list[int]:
    """Lines that read one variable: os.environ.get(...), os.getenv(...), os.environ[...] (a whole-environment copy
    for a child process is not a read)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            f = node.func
            if f.attr == "getenv" or (f.attr == "get" and isinstance(f.value, ast.Attribute) and f.value.attr == "environ"):
                lines.append(node.lineno)
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and node.value.attr == "environ":
            if isinstance(node.ctx, ast.Load):
                lines.append(node.lineno)
    return lines


def test_only_settings_reads_the_environment():
    """The scripts shipped to hosts (deployctl/hostscripts/) run without deployctl and read their own."""
    offenders = {}
    for path in sorted((REPO / "deployctl").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel == "deployctl/settings.py" or rel.startswith("deployctl/hostscripts/"):
            continue
        found = _reads_environment(ast.parse(path.read_text()))
        if found:
            offenders[rel] = found
    assert offenders == {}, f"read the environment through deployctl.settings: {offenders}"
