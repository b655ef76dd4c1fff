"""engine.kv_cache_dtype and engine.enforce_eager: rendered in each engine's own flag only when set (older renders
stay as they were), refused for an engine without them, and refused in extra_args (the plan would not see them)."""
from __future__ import annotations

import pytest

from deployctl.config import parse_config
from deployctl.engines.command import settings_argv
from deployctl.errors import ConfigError


def _cfg(kind: str, engine: str = "") -> object:
    version = "version: 0.33.0, " if kind in ("vllm", "sglang") else ""
    return parse_config(f"service: {{name: x}}\nmodel: {{path: /models/m}}\n"
                        f"engine: {{kind: {kind}, {version}{engine}}}\n"
                        "hosts: [{name: a, address: local, deploy_root: /tmp/x}]\n", "deploy.yaml")


@pytest.mark.parametrize("kind,want", [("vllm", ["--kv-cache-dtype", "fp8", "--enforce-eager"]),
                                       ("sglang", ["--kv-cache-dtype", "fp8_e4m3", "--disable-cuda-graph"])])
def test_rendered_in_the_engines_flags(kind, want):
    cfg = _cfg(kind, "kv_cache_dtype: fp8, enforce_eager: true")
    argv = settings_argv(cfg, cfg.hosts[0], 8000)
    i = argv.index("--kv-cache-dtype")
    assert argv[i:i + 3] == want
    plain = settings_argv(_cfg(kind), cfg.hosts[0], 8000)
    assert "--kv-cache-dtype" not in plain and want[2] not in plain


def test_refused_where_the_engine_has_no_such_setting():
    with pytest.raises(ConfigError, match="engine.kv_cache_dtype 'fp8': deployctl-runtime has no such setting"):
        _cfg("deployctl-runtime", "kv_cache_dtype: fp8")


def test_refused_in_extra_args():
    with pytest.raises(ConfigError, match="--kv-cache-dtype duplicates a setting deployctl models"):
        _cfg("vllm", "extra_args: [--kv-cache-dtype, fp8]")
