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
    # the CPU operators' C source, which the runtime compiles on the host it runs on (kernels/cpu_kernels.py)
    assert "deployctl_runtime/kernels/cpu_ops.c" in names


def test_k8s_rollout_render_from_an_installed_wheel_validates_custom_resources(deployctl_wheel, tmp_path):
    """Issue 26: a pip install (no checkout, no .node/) validates the Argo, Prometheus Operator and Gateway API
    resources against the CRD schemas the wheel carries (deployctl/render/crdschemas). The wheel goes into a fresh
    venv with --no-deps; its dependencies come from this venv's site-packages through a .pth line (no .pth of that
    directory runs, so the editable checkout stays out of sys.path)."""
    import sysconfig

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps",
                    "--disable-pip-version-check", str(deployctl_wheel)], check=True, capture_output=True, text=True)
    (site / "zz-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEPLOYCTL_") and k != "PYTHONPATH"}
    work = tmp_path / "work"
    work.mkdir()
    where = subprocess.run([str(py), "-c", "import deployctl.render.crdvalidate as c; print(c.__file__); "
                            "print(c.schemas_dir())"], cwd=work, env=env, check=True, capture_output=True, text=True)
    mod, schemas = where.stdout.split()
    assert mod.startswith(str(site)) and schemas.startswith(str(site)), where.stdout  # not the checkout's
    cfg = work / "deploy.yaml"
    cfg.write_text((ROOT / "tests" / "data" / "engines" / "deploy-vllm.yaml").read_text())
    r = subprocess.run([str(venv / "bin" / "deployctl"), "render", "--target", "k8s-rollout", "--out", "out", "-c",
                        str(cfg)], cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (work / "out" / "k8s" / "rollout.yaml").exists()  # render exits 1 when a validator cannot run
    # the shipped validators judge: a misspelt field of a Rollout is named
    bad = ("from deployctl.render.crdvalidate import check_documents; import json; print(json.dumps(check_documents("
           "[{'apiVersion': 'argoproj.io/v1alpha1', 'kind': 'Rollout', 'metadata': {'name': 'x'}, "
           "'spec': {'replicas': 1, 'strategy': {'canary': {'stepz': []}}}}])))")
    out = subprocess.run([str(py), "-c", bad], cwd=work, env=env, check=True, capture_output=True, text=True)
    assert "/spec/strategy/canary/stepz: field not in the schema" in out.stdout, out.stdout
