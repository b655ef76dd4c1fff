"""deploy.yaml's engine settings and byte sizes against tests/data/engine_vectors.json, the vectors that also pin
the runtime's EngineArgs (tests/runtime/test_engine_args_vectors.py): one set of limits, one byte-size grammar."""
from __future__ import annotations

import json

import pytest
import yaml

from deployctl.config import parse_config
from deployctl.config.units import parse_bytes
from deployctl.errors import ConfigError

from support.paths import DATA

VECTORS = json.loads((DATA / "engine_vectors.json").read_text())


@pytest.mark.parametrize("v", VECTORS["byte_sizes"], ids=[repr(v["input"]) for v in VECTORS["byte_sizes"]])
def test_byte_size(v):
    if v["bytes"] is None:
        with pytest.raises(ValueError):
            parse_bytes(v["input"])
    else:
        assert parse_bytes(v["input"]) == v["bytes"]


def _config(field: str, value) -> str:
    doc = {"service": {"name": "svc"}, "model": {"path": "/m"}, "hosts": [{"name": "a", "address": "local", "deploy_root": "/srv/svc"}]}
    if field == "dtype":
        doc["model"]["dtype"] = value
    else:
        doc["engine"] = {field: value, **({"device": "cpu"} if field != "device" else {})}
    return yaml.safe_dump(doc)


@pytest.mark.parametrize("v", VECTORS["settings"], ids=[f"{v['field']}={v['value']!r}" for v in VECTORS["settings"]])
def test_engine_setting(v):
    text = _config(v["field"], v["value"])
    if v["ok"]:
        parse_config(text)
    else:
        with pytest.raises(ConfigError) as info:
            parse_config(text)
        assert v["field"] in str(info.value)


def test_vectors_cover_both_unit_families_and_refusals():
    inputs = {str(v["input"]) for v in VECTORS["byte_sizes"]}
    assert {"512m", "512MB", "512MiB"} <= inputs
    assert any(not v["ok"] for v in VECTORS["settings"]) and any(v["ok"] for v in VECTORS["settings"])
