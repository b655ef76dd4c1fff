"""The two distributions never import each other, and the CLI starts without torch or fabric.

Checked twice: statically (every import statement in every file) and in fresh interpreters that
import every module of one package and then look at sys.modules.
"""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"deployctl": (ROOT / "deployctl", "deployctl_runtime"),
            "deployctl_runtime": (ROOT / "runtime" / "deployctl_runtime", "deployctl")}


def _imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            roots.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_import_statement_crosses(package):
    src, forbidden = PACKAGES[package]
    offenders = [str(p.relative_to(ROOT)) for p in src.rglob("*.py") if forbidden in _imported_roots(p)]
    assert offenders == [], f"{package} files import {forbidden}: {offenders}"


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "runtime"), env.get("PYTHONPATH", "")])
    return env


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_fresh_interpreter_imports_every_module_without_the_other(package):
    src, forbidden = PACKAGES[package]
    modules = []
    for p in sorted(src.rglob("*.py")):
        rel = p.relative_to(src.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__main__":
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules.append(".".join(parts))
    code = (
        "import importlib, json, sys\n"
        f"mods = {modules!r}\n"
        "failed = {}\n"
        "for m in mods:\n"
        "    try:\n"
        "        importlib.import_module(m)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "    except Exception as e:\n"
        "        failed[m] = repr(e)\n"
        f"print(json.dumps({{'failed': failed, 'leak': sorted(k for k in sys.modules if k == {forbidden!r} or k.startswith({forbidden!r} + '.'))}}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), cwd="/")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["failed"] == {}, result["failed"]
    assert result["leak"] == [], f"importing {package} pulled in {result['leak']}"


@pytest.mark.parametrize("argv", [["--help"], ["plan", "--help"]])
def test_cli_help_imports_neither_torch_nor_fabric(argv):
    code = (
        "import sys\n"
        "from deployctl.cli import app\n"
        "try:\n"
        f"    app({argv!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        "heavy = sorted(m for m in ('torch', 'fabric', 'paramiko', 'transformers') if m in sys.modules)\n"
        "print('HEAVY=' + ','.join(heavy))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), cwd="/")
    assert proc.returncode == 0, proc.stderr
    assert "HEAVY=\n" in proc.stdout or proc.stdout.rstrip().endswith("HEAVY="), proc.stdout[-500:]
    assert "Usage" in proc.stdout
