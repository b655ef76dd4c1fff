"""Preflight of the router's certificate (deployctl.preflight.certs), with certificates made here by a test CA:
valid, expiring (warn under 30 days), nearly expired (fail under 7), expired, another key pair, another name; the
files read on the router host, locally and over SSH (a 0600 root key read by a sudo user)."""
from __future__ import annotations

import json

import pytest

from deployctl.preflight.certs import _name_covers, router_certificate
from support.certs import TestCA
from support.render import make_config


@pytest.fixture(scope="module")
def ca(tmp_path_factory):
    return TestCA(tmp_path_factory.mktemp("ca"))


def _cfg(cert, key, server_name="llm.example.com", **router):
    return make_config(router={"server_name": server_name, "listen": 8443,
                               "tls": {"certificate": str(cert), "key": str(key)}, **router})


def _by_name(checks) -> dict:
    return {c.name: c for c in checks}


CASES = {  # name: (issue kwargs, server_name, {check: status}, words in the failing/warning message)
    "valid": (dict(names=["llm.example.com"], days=90), "llm.example.com",
              {"tls_certificate": "pass", "tls_key": "pass", "tls_name": "pass"}, ""),
    "expiring": (dict(names=["llm.example.com"], days=20), "llm.example.com",
                 {"tls_certificate": "warn", "tls_key": "pass", "tls_name": "pass"}, "expires in 20 days"),
    "nearly_expired": (dict(names=["llm.example.com"], days=3), "llm.example.com",
                       {"tls_certificate": "fail", "tls_key": "pass", "tls_name": "pass"}, "expires in 3.0 days"),
    "expired": (dict(names=["llm.example.com"], days=-2, not_before_days=90), "llm.example.com",
                {"tls_certificate": "fail", "tls_key": "pass", "tls_name": "pass"}, "expired on"),
    "wrong_name": (dict(names=["other.example.com", "*.example.org"]), "llm.example.com",
                   {"tls_certificate": "pass", "tls_key": "pass", "tls_name": "fail"},
                   "does not cover router.server_name llm.example.com (other.example.com, *.example.org)"),
    "wildcard": (dict(names=["*.example.com"]), "llm.example.com",
                 {"tls_certificate": "pass", "tls_key": "pass", "tls_name": "pass"}, ""),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_certificate_checks_on_the_router_host(ca, case):
    issue, server_name, want, words = CASES[case]
    cert, key = ca.issue(case, **issue)
    host, checks, facts = router_certificate(_cfg(cert, key, server_name), served=False)
    got = _by_name(checks)
    assert host == "router" and {n: c.status for n, c in got.items()} == want, checks
    bad = [c for c in checks if c.status != "pass"]
    for c in bad:  # one line naming the file and the fix
        assert str(cert) in c.message and "\n" not in c.message and c.fix, c
    if words:
        assert words in bad[0].message, bad[0].message
    if case in ("expiring", "nearly_expired", "expired"):
        assert "deployctl router reload" in bad[0].fix
    assert facts["tls"]["not_after"] and facts["tls"]["subject_alt_names"]


def test_a_key_of_another_pair_fails_naming_both_files(ca):
    cert, _ = ca.issue("mine", names=["llm.example.com"])
    _, other_key = ca.issue("theirs", names=["llm.example.com"])
    _, checks, _ = router_certificate(_cfg(cert, other_key), served=False)
    key = _by_name(checks)["tls_key"]
    assert key.status == "fail" and str(other_key) in key.message and str(cert) in key.message, key
    assert "does not match" in key.message and key.fix


def test_missing_and_unparsable_files_are_one_failed_check_each(ca, tmp_path):
    cert, key = ca.issue("ok", names=["llm.example.com"])
    missing = tmp_path / "nope.pem"
    _, checks, _ = router_certificate(_cfg(missing, key), served=False)
    assert [(c.name, c.status) for c in checks] == [("tls_certificate", "fail")]
    assert str(missing) in checks[0].message and "No such file" in checks[0].message
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    _, checks, _ = router_certificate(_cfg(garbage, key), served=False)
    assert checks[0].status == "fail" and "holds no PEM certificate" in checks[0].message
    _, checks, _ = router_certificate(_cfg(cert, garbage), served=False)
    assert _by_name(checks)["tls_key"].status == "fail" and "not a PEM private key" in _by_name(checks)["tls_key"].message


def test_san_matching_follows_rfc_6125():
    assert _name_covers("*.example.com", "llm.example.com")
    assert not _name_covers("*.example.com", "a.llm.example.com")  # one label only
    assert not _name_covers("*.example.com", "example.com")
    assert _name_covers("LLM.Example.com", "llm.example.com.")
    assert not _name_covers("llm.example.com", "*.example.com")


def test_router_certificate_over_ssh_reads_a_root_only_key_with_sudo(ssh_fleet, ca):
    fleet = ssh_fleet(1, users="deploy", nopasswd_sudo=True)
    cert, key = ca.issue("remote", names=["llm.example.com"], days=20)
    assert oct(key.stat().st_mode & 0o777) == "0o600" and key.stat().st_uid == 0  # the login user cannot read it
    for p in (cert.parent.parent, cert.parent):
        p.chmod(0o755)
    cert.chmod(0o644)
    h = fleet.hosts[0]
    cfg = _cfg(cert, key, host="10.0.0.99")  # replaced below by the fleet host
    doc = cfg.model_dump()
    doc["hosts"] = fleet.host_yaml()
    doc["router"]["host"] = h.name
    from deployctl.config import DeployConfig

    cfg = DeployConfig.model_validate(doc)
    name, checks, facts = router_certificate(cfg, served=False)
    assert name == h.name
    assert {c.name: c.status for c in checks} == {"tls_certificate": "warn", "tls_key": "pass", "tls_name": "pass"}
    assert json.dumps(facts)  # JSON-ready for preflight --json


@pytest.mark.parametrize("router_host, host_filter, where", [
    ("local", None, "router"),  # a report of its own
    ("gpu-b", None, "gpu-b"),  # nginx on a GPU host: its checks join that host's
    ("gpu-b", ["gpu-a"], None),  # --host naming another host: not checked
])
def test_run_preflight_reports_the_router_certificate(ca, monkeypatch, tmp_path, router_host, host_filter, where):
    import deployctl.preflight as preflight

    cert, key = ca.issue(f"pf-{router_host}", names=["llm.example.com"], days=3)
    cfg = _cfg(cert, key, host=router_host)
    local = [{"name": n, "address": "local", "deploy_root": str(tmp_path / n)} for n in ("gpu-a", "gpu-b")]
    cfg = cfg.model_validate({**cfg.model_dump(), "hosts": local})  # no SSH: the files are read on this machine
    monkeypatch.setattr(preflight, "gather", lambda cfg, names, **kw: [
        (h, {"error": "probe not run in this test"}) for h in cfg.hosts if not names or h.name in names])
    report = preflight.run_preflight(cfg, host_filter)
    hosts = {h.host: h for h in report.hosts}
    with_tls = [h for h in report.hosts if any(c.name == "tls_certificate" for c in h.checks)]
    if where is None:
        assert with_tls == []
        return
    assert [h.host for h in with_tls] == [where] and not hosts[where].ok
    doc = report.to_json()
    entry = next(h for h in doc["hosts"] if h["host"] == where)
    assert entry["facts"]["tls"]["subject_alt_names"] == ["llm.example.com"]
    assert any(c["name"] == "tls_certificate" and c["status"] == "fail" for c in entry["checks"])
