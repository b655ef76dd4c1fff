"""Golden files: `render` output for tests/data/golden/deploy.yaml, every target, byte for byte.

A template change shows here as a unified diff per file. When the change is intended, regenerate with
DEPLOYCTL_UPDATE_GOLDEN=1 and review the diff in git. runtime.env and the router's keys file are left out (they
hold the key).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from deployctl.config import load_config
from deployctl.render import render_all
from support.render import golden_problems

from support.paths import DATA

GOLDEN = DATA / "golden"
ENV = {"LLM_API_KEY": "golden-not-a-secret"}


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != "runtime.env" and not p.name.endswith(".conf.keys")}


@pytest.mark.parametrize("target", ["systemd", "container", "k8s", "k8s-rollout"])
def test_render_matches_golden_files(tmp_path, target):
    out = tmp_path / target
    render_all(load_config(GOLDEN / "deploy.yaml"), out, target=target, release_id="20261130T000000Z-golden1", env=ENV)
    problems = golden_problems(_tree(out), GOLDEN / target, f"{target}")
    assert not problems, ("rendered files differ from tests/data/golden (rerun with DEPLOYCTL_UPDATE_GOLDEN=1 "
                          "if the change is intended):\n" + "\n".join(problems))
