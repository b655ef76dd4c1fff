"""The engine adapters' sleep field (deployctl.engines.base.Sleep): the routes, enabling flags and env var exist in
the pinned engines' own source (.venv-engines), the systemd/launch.sh render turns sleep mode on while
rollout.standby_s > 0 and never for container/k8s, and an engine without it (transformers) has none."""
from __future__ import annotations

import re

import pytest
import yaml

from deployctl.config import parse_config
from deployctl.engines import KINDS, adapter, router_refused_paths, standby_enabled
from deployctl.errors import ConfigError
from deployctl.render import render_all
from support import paths

DATA = paths.REPO / "tests" / "data" / "engines"
SITE = next((paths.REPO / ".venv-engines" / "lib").glob("python3*/site-packages"), None)
KEY = {"LLM_API_KEY": "sk-sleep-0123456789abcdef"}


def _source(*parts: str) -> str:
    if SITE is None:
        pytest.fail(".venv-engines is missing: run `bash tests/setup_test_venvs.sh`")
    root = SITE.joinpath(*parts)
    files = [root] if root.is_file() else sorted(root.rglob("*.py"))
    return "\n".join(p.read_text(errors="replace") for p in files)


def _cfg(kind: str, pod: bool = False, **rollout):
    base = yaml.safe_load((DATA / f"deploy-{kind}.yaml").read_text())
    if kind == "vllm" and pod:  # the pod targets keep no standby (no dev mode) and need a pod-reachable bind
        base["rollout"] = {"standby_s": 86400}
    elif kind == "vllm":  # a standby's dev mode on loopback only: one host, bound to 127.0.0.1, the router beside it
        base["rollout"] = {"standby_s": 86400}
        base["server"]["bind"] = "127.0.0.1"
        base["hosts"] = base["hosts"][:1]
        base["router"]["host"] = base["hosts"][0]["name"]
    if rollout:
        base["rollout"] = {**base.get("rollout", {}), **rollout}
    return parse_config(yaml.safe_dump(base), f"deploy-{kind}.yaml")


def test_every_adapter_declares_sleep_or_none():
    assert adapter("transformers").sleep is None
    for kind in ("deployctl-runtime", "vllm", "sglang"):
        s = adapter(kind).sleep
        assert s is not None and s.gpu_residue_bytes > 0 and s.residue_source and s.keeps
    assert adapter("deployctl-runtime").sleep.enable_flags == () and not adapter("deployctl-runtime").sleep.enable_env


def test_vllm_sleep_routes_flag_and_env_exist_in_the_pinned_source():
    dev = _source("vllm", "entrypoints", "serve", "dev")
    s = adapter("vllm").sleep
    for route in (s.sleep_route, s.wake_route, s.state_route):
        method, path = route.split(" ")
        assert f'@router.{method.lower()}("{path.split("?")[0]}")' in dev, route
    assert 'Query(ge=0, le=2)] = 1' in dev  # level defaults to 1, as sleep_route asks explicitly
    assert "enable_sleep_mode: bool" in _source("vllm", "config", "model.py")
    assert '"VLLM_SERVER_DEV_MODE"' in _source("vllm", "envs.py") and s.enable_env == {"VLLM_SERVER_DEV_MODE": "1"}
    for path in s.control_routes + adapter("vllm").control_routes:
        assert f'"{path}"' in _source("vllm", "entrypoints", "serve"), path


def test_sglang_memory_routes_and_flags_exist_in_the_pinned_source():
    http = _source("sglang", "srt", "entrypoints", "http_server.py")
    fields = _source("sglang", "srt", "arg_groups", "fields", "exec_.py")
    s = adapter("sglang").sleep
    for route in (s.sleep_route, s.wake_route):
        assert f'"{route.split(" ")[1]}"' in http, route
    for flag in s.enable_flags:  # ServerArgs field names are the flags with underscores
        assert re.search(rf"^\s+{flag[2:].replace('-', '_')}: A\[", fields, re.M), flag
    for path in adapter("sglang").control_routes:
        assert f'"{path}"' in http, path


def test_router_refuses_every_engines_control_routes():
    refused = router_refused_paths()
    for path in ("/sleep", "/wake_up", "/is_sleeping", "/release_memory_occupation", "/resume_memory_occupation",
                 "/reset_prefix_cache", "/collective_rpc", "/server_info", "/flush_cache"):
        assert path in refused
    assert not any(p.startswith("/v1") or p in ("/health", "/metrics", "/readyz") for p in refused)


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_systemd_render_turns_sleep_mode_on_only_with_a_standby(tmp_path, kind):
    s = adapter(kind).sleep
    on, off = _cfg(kind), _cfg(kind, standby_s=0)
    assert on.rollout.standby_s == 86400 and standby_enabled(on) and not standby_enabled(off)
    for cfg, want in ((on, True), (off, False)):
        out = tmp_path / f"{want}"
        render_all(cfg, out, target="systemd", release_id="r1", env=KEY)
        d = out / "hosts" / cfg.hosts[0].name
        unit = (d / f"{cfg.service.name}.service").read_text()
        exec_start = re.search(r"^ExecStart=(.*)$", unit, re.M).group(1)
        launch = (d / "launch.sh").read_text()
        env = (d / "runtime.env").read_text()
        for flag in s.enable_flags:
            assert (flag in exec_start.split()) is want and (flag in launch) is want
        for k, v in s.enable_env.items():
            assert (f"{k}={v}" in env) is want
    for target in ("container", "k8s-rollout"):  # no standby there: no dev routes in a pod or a compose service
        out = tmp_path / target
        render_all(_cfg(kind, pod=True), out, target=target, release_id="r1", env=KEY)
        text = "\n".join(p.read_text() for p in out.rglob("*") if p.is_file())
        assert not any(flag in text for flag in s.enable_flags)
        assert not any(k in text for k in s.enable_env)


def test_transformers_has_no_standby_and_extra_args_cannot_turn_sleep_on():
    cfg = yaml.safe_load((DATA / "deploy-vllm.yaml").read_text())
    cfg["engine"]["extra_args"] = ["--enable-sleep-mode"]
    with pytest.raises(ConfigError, match="rollout.standby_s"):
        parse_config(yaml.safe_dump(cfg), "deploy.yaml")
    assert set(KINDS) == {"deployctl-runtime", "vllm", "sglang", "transformers", "openai"}
