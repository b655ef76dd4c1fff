"""Where things are: the repository, tests/data, ../shared (the project's shared notes, beside the checkout)."""
from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"
SHARED = REPO.parent / "shared"
