"""docs/gen.py (the generator of docs/deploy-yaml.md and docs/commands.md) loaded as a module for the docs tests:
it lives beside the pages, outside both packages."""
from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("docs_gen", Path(__file__).resolve().parents[2] / "docs" / "gen.py")
gen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen)
