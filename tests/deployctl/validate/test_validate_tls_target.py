"""`deployctl validate -c deploy.yaml` goes through the router: over https to router.server_name when router.tls is
set (the name the certificate covers), else plain http to the router's address."""
from __future__ import annotations

from deployctl.cli.validate import _targets
from support.render import write_config


def test_validate_targets_the_router_over_https_with_tls(tmp_path, monkeypatch):
    monkeypatch.setenv("LLM_API_KEY", "sk-test-0123456789")  # the key server.api_key_env names
    tls = {"server_name": "llm.example.com", "listen": 8443,
           "tls": {"certificate": "/etc/ssl/llm.pem", "key": "/etc/ssl/llm.key"}}
    base, _, _, _ = _targets(write_config(tmp_path / "tls.yaml", router=tls), None, None)
    assert base == "https://llm.example.com:8443"
    base, _, _, _ = _targets(write_config(tmp_path / "plain.yaml"), None, None)
    assert base == "http://127.0.0.1:8088"
