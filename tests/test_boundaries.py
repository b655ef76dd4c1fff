"""The two distributions never import each other, the CLI starts without torch or fabric, deployctl's imports
follow its layer order (LAYERS) and neither package has an import cycle.

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


# -- layers and cycles ---------------------------------------------------------------------------------------------
# deployctl's packages from the bottom up. A module may import modules of its own package and of packages in lower
# layers only: never upwards, never sideways into another package of its own layer.
LAYERS = (
    ("deployctl", "deployctl.errors", "deployctl.hostscripts"),
    ("deployctl.settings", "deployctl.resources", "deployctl.promhist"),
    ("deployctl.engines",),  # engine adapters: plain data the config validation and everything above read
    ("deployctl.config",),
    ("deployctl.capacity", "deployctl.hosts", "deployctl.render"),
    ("deployctl.service", "deployctl.preflight", "deployctl.bench", "deployctl.weights"),
    ("deployctl.rollout",),
    ("deployctl.validate",),  # go-live validation: bench's ladder, rollout's output rules; the demo ends with it
    ("deployctl.runbook", "deployctl.demo"),
    ("deployctl.cli",),
    ("deployctl.__main__",),
)
RANK = {unit: rank for rank, units in enumerate(LAYERS) for unit in units}


def _modules(src: Path) -> dict[str, Path]:
    out = {}
    for p in sorted(src.rglob("*.py")):
        parts = list(p.relative_to(src.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def import_graph(src: Path) -> dict[str, set[str]]:
    """{module: the project modules it imports} for the package at ``src``, every import statement counted
    (inside functions and TYPE_CHECKING blocks too). ``from pkg import name`` is an edge to ``pkg.name`` when that
    is a module, else to ``pkg``; the implicit import of a parent package is not an edge."""
    mods = _modules(src)
    root = src.name
    graph = {}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in mods else mod for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in mods and "." in t:
                    t = t.rpartition(".")[0]
                if t in mods and (t == root or t.startswith(root + ".")) and t != name:
                    deps.add(t)
        graph[name] = deps
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` as [a, b, ..., a], or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def layer_unit(module: str) -> str | None:
    """The LAYERS entry ``module`` belongs to (its longest listed prefix), or None."""
    best = None
    for unit in RANK:
        if (module == unit or (unit != "deployctl" and module.startswith(unit + "."))) and (
                best is None or len(unit) > len(best)):
            best = unit
    return best


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    out = []
    for mod, deps in sorted(graph.items()):
        unit = layer_unit(mod)
        for dep in sorted(deps):
            dep_unit = layer_unit(dep)
            if unit is None or dep_unit is None or unit == dep_unit:
                continue
            if RANK[dep_unit] >= RANK[unit]:
                how = "sideways" if RANK[dep_unit] == RANK[unit] else "upwards"
                out.append(f"{mod} imports {dep} ({how}: {unit} is layer {RANK[unit]}, {dep_unit} layer {RANK[dep_unit]})")
    return out


def test_every_deployctl_module_has_a_layer():
    unplaced = sorted(m for m in _modules(ROOT / "deployctl") if layer_unit(m) is None)
    assert unplaced == [], f"add these to LAYERS in tests/test_boundaries.py: {unplaced}"


def test_no_import_goes_against_the_layer_order():
    assert layer_violations(import_graph(ROOT / "deployctl")) == []


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_import_cycle(package):
    cycle = find_cycle(import_graph(PACKAGES[package][0]))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_layer_checks_catch_what_they_are_for(tmp_path):
    """The checks themselves: an upward import, a sideways one and a cycle in a scratch package are all found."""
    pkg = tmp_path / "deployctl"
    for rel, text in {"__init__.py": "", "errors.py": "from deployctl.config import models\n",
                      "config/__init__.py": "", "config/models.py": "from deployctl.errors import X\n",
                      "hosts/__init__.py": "from deployctl.render import release\n",
                      "render/__init__.py": "", "render/release.py": "from . import targets\n",
                      "render/targets.py": "from deployctl.render.release import y\n"}.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    graph = import_graph(pkg)
    found = "\n".join(layer_violations(graph))
    assert "deployctl.errors imports deployctl.config.models (upwards" in found
    assert "deployctl.hosts imports deployctl.render.release (sideways" in found
    assert find_cycle(graph) in (["deployctl.config.models", "deployctl.errors", "deployctl.config.models"],
                                 ["deployctl.errors", "deployctl.config.models", "deployctl.errors"])
    assert find_cycle({k: v for k, v in graph.items() if k != "deployctl.errors"}) == [
        "deployctl.render.release", "deployctl.render.targets", "deployctl.render.release"]
