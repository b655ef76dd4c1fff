"""A local stand-in for a GPU host's python environment, for the demo and the test fleet.

``overlay_venv(path, base_python)`` creates a venv (no pip of its own) whose site-packages sees the base
environment's packages (torch, fastapi, pip …) through a .pth file, so that installing the runtime wheel into it
(``pip install --no-deps``) never touches the base environment: the venv's own site-packages comes first on
sys.path, so the installed wheel wins over anything the base has. ``tiny_model(dir)`` runs the runtime's
``tiny-model`` command (deployctl never imports the runtime).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from deployctl.errors import CheckFailed


def overlay_venv(path: Path, base_python: str = sys.executable, *, threads: int | None = 1) -> Path:
    """Create (or reuse) the overlay venv at ``path``; returns its python. ``threads``: default for
    OMP_NUM_THREADS in every process of the env (several CPU runtimes on one small machine oversubscribe
    otherwise; an explicit OMP_NUM_THREADS wins). Raises CheckFailed."""
    path = Path(path)
    py = path / "bin" / "python"
    if py.exists():
        return py
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([base_python, "-m", "venv", "--without-pip", str(path)], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise CheckFailed(f"creating a venv at {path} failed: {r.stderr.strip()[-300:]}")
    sites = json.loads(subprocess.check_output(
        [base_python, "-c", "import json, site; print(json.dumps(site.getsitepackages()))"], env=env, text=True))
    own = subprocess.check_output([str(py), "-c", "import site; print(site.getsitepackages()[0])"], env=env,
                                  text=True).strip()
    lines = "".join(f"import site; site.addsitedir({s!r})\n" for s in sites)
    if threads:
        lines += f"import os; os.environ.setdefault('OMP_NUM_THREADS', '{int(threads)}')\n"
    Path(own, "_deployctl_base_env.pth").write_text(lines)
    return py


def tiny_model(out: Path, python: str = sys.executable) -> Path:
    """Write the runtime's tiny checkpoint (with manifest.sha256) to ``out`` unless it is there."""
    out = Path(out)
    if (out / "manifest.sha256").exists():
        return out
    r = subprocess.run([python, "-m", "deployctl_runtime", "tiny-model", str(out)], capture_output=True, text=True)
    if r.returncode != 0:
        raise CheckFailed(f"`deployctl_runtime tiny-model {out}` failed: {(r.stderr or r.stdout).strip()[-300:]}")
    return out
