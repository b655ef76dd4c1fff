"""Where the shipped data lives: templates/ and runbooks/.

In a source checkout they are the repo's top-level folders; in an installed wheel they are the
packages ``deployctl.templates`` and ``deployctl.runbooks`` (pyproject.toml maps them).
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

_REPO_ROOT = Path(__file__).resolve().parent.parent


def _data_dir(name: str) -> Path:
    in_tree = _REPO_ROOT / name
    if in_tree.is_dir() and (_REPO_ROOT / "pyproject.toml").is_file():
        return in_tree
    spec = importlib.util.find_spec(f"deployctl.{name}")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"deployctl data folder {name!r} is missing from this installation")
    return Path(list(spec.submodule_search_locations)[0])


def templates_dir() -> Path:
    """The folder holding the jinja2 templates."""
    return _data_dir("templates")


def runbooks_dir() -> Path:
    """The folder holding the shipped runbook YAML files."""
    return _data_dir("runbooks")
