"""Both wheels build and carry what they need: every subpackage, templates/ and runbooks/ as data."""
from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _build(src: Path, out: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(src)],
                   check=True, capture_output=True, text=True)
    return next(out.glob("*.whl"))


def _package_dirs(base: Path, prefix: str) -> set[str]:
    return {str(p.parent.relative_to(base.parent)) for p in base.rglob("__init__.py") if "__pycache__" not in p.parts}


@pytest.fixture(scope="module")
def deployctl_wheel(tmp_path_factory) -> Path:
    return _build(ROOT, tmp_path_factory.mktemp("whl"))


def test_deployctl_wheel_has_every_subpackage_and_the_data(deployctl_wheel):
    names = set(zipfile.ZipFile(deployctl_wheel).namelist())
    for pkg in _package_dirs(ROOT / "deployctl", "deployctl"):
        assert f"{pkg}/__init__.py" in names, f"{pkg} missing from the wheel: add it to pyproject's packages list"
    for folder, pkg in (("templates", "deployctl/templates"), ("runbooks", "deployctl/runbooks")):
        for f in (ROOT / folder).rglob("*"):
            if f.is_file() and "__pycache__" not in f.parts:
                assert f"{pkg}/{f.relative_to(ROOT / folder)}" in names, f"{f} is not shipped in the wheel"
    for f in (ROOT / "deployctl").rglob("*.mjs"):  # node scripts beside the modules that run them (crdcheck.mjs)
        assert str(f.relative_to(ROOT)) in names, f"{f} is not shipped in the wheel"


def test_installed_wheel_finds_its_templates(deployctl_wheel, tmp_path):
    site = tmp_path / "site"
    zipfile.ZipFile(deployctl_wheel).extractall(site)
    code = ("from deployctl.resources import templates_dir, runbooks_dir; "
            "print(templates_dir()); print(runbooks_dir())")
    env = dict(os.environ, PYTHONPATH=str(site))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=str(tmp_path), check=True)
    t, r = out.stdout.split()
    assert Path(t) == site / "deployctl" / "templates" and Path(r) == site / "deployctl" / "runbooks"


def test_runtime_wheel_builds_alone(tmp_path):
    wheel = _build(ROOT / "runtime", tmp_path)
    names = set(zipfile.ZipFile(wheel).namelist())
    for pkg in _package_dirs(ROOT / "runtime" / "deployctl_runtime", "deployctl_runtime"):
        assert f"{pkg}/__init__.py" in names, f"{pkg} missing from the runtime wheel"
    assert not any(n.startswith("deployctl/") for n in names)
