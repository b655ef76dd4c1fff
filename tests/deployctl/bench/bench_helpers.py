"""Shared by the bench tests: the repository root, the environment for subprocesses and the runtime on CPU (from
support.runtime, which the router tests use too)."""
from __future__ import annotations

from support.paths import REPO
from support.runtime import make_tiny_model, serve_runtime, subprocess_env

__all__ = ["REPO", "make_tiny_model", "serve_runtime", "subprocess_env"]
