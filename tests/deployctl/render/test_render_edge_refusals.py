"""Render refuses what would be open to anyone beyond loopback, naming the setting and the fix (exit 3, nothing
written): vLLM's dev mode (its sleep routes, with /collective_rpc and /server_info beside them, check no key) on
a public engine bind, and a router on a public address without an API key. The same configs on loopback render."""
from __future__ import annotations

import yaml

from support.cli import deployctl
from support.paths import DATA

ENV = {"LLM_API_KEY": "sk-edge-refusals-0123456789"}


def _vllm(**changes) -> dict:
    doc = yaml.safe_load((DATA / "engines" / "deploy-vllm.yaml").read_text())
    doc["rollout"] = {"standby_s": 600}  # a sleeping standby: vLLM's sleep mode needs VLLM_SERVER_DEV_MODE=1
    for key, value in changes.items():
        doc[key] = value
    return doc


def _render(tmp_path, doc: dict, name: str = "d"):
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    out = tmp_path / f"out-{name}"
    return deployctl("render", "--no-validate", "--out", str(out), "-c", str(path), env=ENV), out


def test_vllm_dev_mode_on_a_public_bind_is_refused_naming_the_setting(tmp_path):
    # hosts on other machines than the router: binding 127.0.0.1 would cut them off, so the fix is no standby
    r, out = _render(tmp_path, _vllm(), "remote")
    assert r.returncode == 3 and not out.exists(), r.stderr
    said = " ".join(r.stderr.split())
    assert "server.bind 0.0.0.0 with rollout.standby_s 600" in said and "VLLM_SERVER_DEV_MODE=1" in said, said
    assert "/collective_rpc" in said and "set rollout.standby_s: 0" in said and "out of reach of the router" in said
    # the engine on the router's machine: the fix is the loopback bind
    doc = _vllm()
    doc["hosts"] = doc["hosts"][:1]
    doc["router"]["host"] = doc["hosts"][0]["name"]
    r, out = _render(tmp_path, doc, "beside")
    said = " ".join(r.stderr.split())
    assert r.returncode == 3 and "set server.bind: 127.0.0.1" in said, said
    doc["server"]["bind"] = "127.0.0.1"
    r, out = _render(tmp_path, doc, "loopback")
    assert r.returncode == 0, r.stderr
    env = (out / "hosts" / "gpu-a" / "runtime.env").read_text()
    unit = (out / "hosts" / "gpu-a" / "llama-8b.service").read_text()
    assert "VLLM_SERVER_DEV_MODE=1" in env and "--host 127.0.0.1" in unit and "--enable-sleep-mode" in unit


def test_a_public_router_without_a_key_is_refused_at_render(tmp_path):
    doc = _vllm(rollout={"standby_s": 0})
    doc["server"] = {"bind": "127.0.0.1", "port": 8000}  # no api_key_env: the engines on loopback need none
    r, out = _render(tmp_path, doc, "public")
    said = " ".join(r.stderr.split())
    assert r.returncode == 3 and not out.exists(), said
    assert "the router publishes the service on *:8088" in said and "server.api_key_env is not set" in said, said
    assert "router.listen_address: 127.0.0.1" in said
    doc["router"]["listen_address"] = "10.0.0.1"
    r, _ = _render(tmp_path, doc, "address")
    assert r.returncode == 3 and "on 10.0.0.1:8088" in r.stderr, r.stderr
    doc["router"]["listen_address"] = "127.0.0.1"
    r, out = _render(tmp_path, doc, "loopback")
    assert r.returncode == 0 and (out / "router" / "llama-8b.conf").exists(), r.stderr
