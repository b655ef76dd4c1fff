"""The runtime's engine settings (EngineArgs, through serve's config) and byte sizes against
tests/data/engine_vectors.json, the vectors that also pin deployctl's deploy.yaml (tests/deployctl/config/)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from deployctl_runtime.engine_args import EngineArgs, parse_bytes
from deployctl_runtime.server.config import load_config

VECTORS = json.loads((Path(__file__).resolve().parents[1] / "data" / "engine_vectors.json").read_text())


def _bytes_or_refused(value):
    try:
        return parse_bytes(value)
    except ValueError:
        return None


def test_byte_sizes():
    """Every vector at once: the table of what the runtime reads, compared whole (a mismatch lists them all)."""
    got = {repr(v["input"]): _bytes_or_refused(v["input"]) for v in VECTORS["byte_sizes"]}
    assert got == {repr(v["input"]): v["bytes"] for v in VECTORS["byte_sizes"]}


@pytest.mark.parametrize("v", VECTORS["settings"], ids=[f"{v['field']}={v['value']!r}" for v in VECTORS["settings"]])
def test_serve_setting(v):
    if v["ok"]:
        cfg = load_config({"model": "/m", v["field"]: v["value"]}, None)
        EngineArgs(**cfg.engine_args()).validate()
    else:
        with pytest.raises(ValueError) as info:
            load_config({"model": "/m", v["field"]: v["value"]}, None)
        assert f"'{v['field']}'" in str(info.value)


@pytest.mark.parametrize("v", [v for v in VECTORS["settings"] if not isinstance(v["value"], str) or v["field"] in
                               ("device", "dtype")], ids=lambda v: f"{v['field']}={v['value']!r}")
def test_engine_args_alone(v):
    """EngineArgs is the validator: the offline LLM API (no serve config) refuses the same values."""
    args = EngineArgs(model="/m", **{v["field"]: v["value"]})
    if v["ok"]:
        args.validate()
    else:
        with pytest.raises(ValueError, match=f"^{v['field']}: "):
            args.validate()
