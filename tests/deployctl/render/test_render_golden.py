"""Golden files: `render` output for tests/data/golden/deploy.yaml, every target, byte for byte.

A template change shows here as a unified diff per file. When the change is intended, regenerate with
DEPLOYCTL_UPDATE_GOLDEN=1 and review the diff in git. runtime.env is left out (it holds the key).
"""
from __future__ import annotations

import difflib
import os
import shutil
from pathlib import Path

import pytest

from deployctl.config import load_config
from deployctl.render import render_all

from support.paths import DATA

GOLDEN = DATA / "golden"
ENV = {"LLM_API_KEY": "golden-not-a-secret"}


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != "runtime.env"}


@pytest.mark.parametrize("target", ["systemd", "container", "k8s", "k8s-rollout"])
def test_render_matches_golden_files(tmp_path, target):
    out = tmp_path / target
    render_all(load_config(GOLDEN / "deploy.yaml"), out, target=target, release_id="20261130T000000Z-golden1", env=ENV)
    got, golden_dir = _tree(out), GOLDEN / target
    if os.environ.get("DEPLOYCTL_UPDATE_GOLDEN") == "1":
        shutil.rmtree(golden_dir, ignore_errors=True)
        for rel, text in got.items():
            (golden_dir / rel).parent.mkdir(parents=True, exist_ok=True)
            (golden_dir / rel).write_text(text)
    want = _tree(golden_dir) if golden_dir.exists() else {}
    problems = [f"missing from the render: {p}" for p in sorted(set(want) - set(got))]
    problems += [f"not in the golden files: {p}" for p in sorted(set(got) - set(want))]
    for rel in sorted(set(got) & set(want)):
        if got[rel] != want[rel]:
            problems.append("".join(difflib.unified_diff(want[rel].splitlines(True), got[rel].splitlines(True),
                                                         f"golden/{target}/{rel}", f"rendered/{rel}")))
    assert not problems, ("rendered files differ from tests/data/golden (rerun with DEPLOYCTL_UPDATE_GOLDEN=1 "
                          "if the change is intended):\n" + "\n".join(problems))
