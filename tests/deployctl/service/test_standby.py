"""deployctl.service.standby: sleep, wake and is_sleeping of a real bundled runtime, sent from its host over a real
sshd (the router never carries these routes); a wake that no longer fits on the (stand-in) GPU comes back as a clean
refusal naming who holds the memory; the host probe reports the stand-in GPU's memory."""
from __future__ import annotations

import json
import os

import pytest

from deployctl.config import parse_config
from deployctl.errors import ConfigError
from deployctl.hostscripts import probe
from deployctl.hosts.host import Host
from deployctl.service.engine import Engine
from support.runtime import make_tiny_model, serve_runtime

KEY = "sk-standby-0123456789abcdef"


def _cfg(fleet, model, port: int):
    hosts = fleet.host_yaml(server_port=port)
    text = json.dumps({"service": {"name": "svc"}, "model": {"path": str(model)}, "engine": {"device": "cpu"},
                       "server": {"bind": "127.0.0.1", "api_key_env": "STANDBY_TEST_KEY"}, "hosts": hosts})
    return parse_config(text, "deploy.yaml")


def test_sleep_wake_over_ssh_and_a_wake_that_no_longer_fits(ssh_fleet, tmp_path, monkeypatch):
    monkeypatch.setenv("STANDBY_TEST_KEY", KEY)
    ledger = tmp_path / "gpu.json"
    ledger.write_text(json.dumps({"total_bytes": 2**40, "residue_bytes": 1000, "allocations": {}}))
    os.chmod(tmp_path, 0o755)
    model = make_tiny_model(tmp_path)
    fleet = ssh_fleet(1)
    env = {"DEPLOYCTL_RUNTIME_API_KEY": KEY, "DEPLOYCTL_FAKE_GPU_MEMORY": str(ledger)}
    with serve_runtime(model, tmp_path / "rt.log", "--max-model-len", "128", "--kv-cache-memory", "1MiB",
                       env=env) as url:
        port = int(url.rsplit(":", 1)[1])
        cfg = _cfg(fleet, model, port)
        host = Host.from_config(cfg.hosts[0])
        e = Engine(host, cfg, port)
        assert e.is_sleeping() is False
        s = e.sleep()
        assert s.ok and s.status == 200 and s.action == "sleep" and s.seconds >= 0 and s.body["level"] == 1, s
        assert Engine(host, cfg).is_sleeping() is True  # the host's active port by default
        gpu = probe.probe_nvidia(str(ledger))["gpus"][0]
        assert gpu["memory_used"] == 1000 and gpu["memory_free"] == 2**40 - 1000  # the sleeper's residue
        assert [p["what"] for p in gpu["processes"]] == ["sleeping residue"]

        data = json.loads(ledger.read_text())  # another process takes the memory
        data["allocations"][str(os.getpid())] = {"bytes": 2**40 - 2000, "what": "weights+kv", "label": "intruder"}
        ledger.write_text(json.dumps(data))
        w = e.wake()
        assert not w.ok and w.status == 503 and w.code == "gpu_memory_exhausted", w
        assert f"pid {os.getpid()} (weights+kv {2**40 - 2000} bytes, intruder)" in w.reason
        monkeypatch.setenv(probe.FAKE_GPU_ENV, str(ledger))  # or from the probe's environment
        assert probe.probe_nvidia()["gpus"][0]["memory_free"] == 1000
        assert e.is_sleeping() is True

        data = json.loads(ledger.read_text())
        del data["allocations"][str(os.getpid())]
        ledger.write_text(json.dumps(data))
        w = e.wake()
        assert w.ok and w.body["status"] == "awake" and w.seconds >= 0, w
        assert e.is_sleeping() is False


def test_an_engine_without_sleep_mode_is_a_config_error(tmp_path):
    cfg = parse_config(json.dumps({
        "service": {"name": "svc"}, "model": {"path": str(tmp_path), "served_name": str(tmp_path)},
        "engine": {"kind": "transformers", "version": "5.0.0", "device": "cpu"},
        "hosts": [{"name": "h", "address": "local", "deploy_root": str(tmp_path / "root"), "launcher": "process"}]}))
    host = Host.from_config(cfg.hosts[0])
    e = Engine(host, cfg)
    for call in (e.sleep, e.wake, e.is_sleeping):
        with pytest.raises(ConfigError, match="engine transformers has no sleep mode"):
            call()
