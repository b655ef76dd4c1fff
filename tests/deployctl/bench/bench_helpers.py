"""Shared by the bench tests: the repository root and the runtime subprocess helpers (tests/support/runtime.py)."""
from __future__ import annotations

from support.paths import REPO  # noqa: F401
from support.runtime import make_tiny_model, serve_runtime, subprocess_env  # noqa: F401
