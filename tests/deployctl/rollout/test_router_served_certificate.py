"""The certificate nginx serves, checked through a real nginx (TLS handshake with SNI, from the router host): a
renewed file not yet reloaded is named (served vs file: notAfter, fingerprint, SAN) and `router reload` makes them
agree; an expired certificate file is refused before the reload, so nginx never serves it, and one inside the
warning window unless `--force`. No runtime behind nginx: the handshake is the point."""
from __future__ import annotations

import ssl

import pytest

from deployctl.config import load_config
from deployctl.preflight.certs import router_certificate
from support.certs import TestCA
from support.cli import run_cli
from support.nginx import NginxRouter
from support.ports import free_port
from support.render import write_config


@pytest.fixture
def edge(tmp_path):
    ca = TestCA(tmp_path / "ca")
    cert, key = ca.issue("router", ["localhost"], days=60)
    router = NginxRouter(tmp_path / "nginx")
    path = write_config(tmp_path / "deploy.yaml", engine={"device": "cpu"},
                        server={"bind": "127.0.0.1", "port": free_port(), "api_key_env": None},
                        hosts=[{"name": "local-a", "address": "local", "deploy_root": str(tmp_path / "root")}],
                        router={**router.router_config(), "server_name": "localhost",
                                "tls": {"certificate": str(cert), "key": str(key)}})
    cfg = load_config(path)
    router.start(cfg)
    try:
        yield {"cfg": cfg, "path": path, "router": router, "ca": ca, "cert": cert, "key": key}
    finally:
        router.stop()


def _served_serial(port: int) -> int:
    from cryptography import x509

    return x509.load_pem_x509_certificate(ssl.get_server_certificate(("127.0.0.1", port)).encode()).serial_number


def _served(cfg):
    return next(c for c in router_certificate(cfg)[1] if c.name == "tls_served")


def test_served_leaf_matches_the_file_then_a_renewal_not_yet_reloaded_is_named(edge):
    cfg, cert = edge["cfg"], edge["cert"]
    check = _served(cfg)
    assert check.status == "pass" and f"serves {cert}" in check.message, check
    renewed, _ = edge["ca"].issue("renewed", ["localhost", "llm.localhost"], days=120, key=edge["key"])
    cert.write_bytes(renewed.read_bytes())  # certbot's deploy hook not run: the file changed, nginx did not reload
    check = _served(cfg)
    assert check.status == "warn" and "a renewed file not yet loaded" in check.message, check
    assert "deployctl router reload" in check.fix
    # both leaves named: the served one (60 days, SAN localhost) and the file's (120 days, two SANs)
    served_part, file_part = check.message.split(", but ")
    assert "SAN localhost" in served_part and "SAN localhost, llm.localhost" in file_part, check.message
    assert served_part.count("notAfter") == 1 and file_part.count("notAfter") == 1
    assert served_part.split("sha256 ")[1][:23] != file_part.split("sha256 ")[1][:23]

    result = run_cli("router", "reload", "-c", str(edge["path"]))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "pass tls_served" in result.stdout, result.stdout
    assert _served(cfg).status == "pass"


def test_an_expired_certificate_file_is_refused_before_nginx_serves_it(edge):
    port, cert = edge["router"].port, edge["cert"]
    served = _served_serial(port)
    expired, _ = edge["ca"].issue("expired", ["localhost"], days=-1, not_before_days=30, key=edge["key"])
    cert.write_bytes(expired.read_bytes())
    result = run_cli("router", "reload", "-c", str(edge["path"]))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "refusing to reload nginx on router" in result.stderr and f"{cert} expired on" in result.stderr
    assert "certbot renew" in result.stderr
    assert _served_serial(port) == served  # never served: the reload did not happen
    # preflight says so too: the file fails, the served leaf (still the valid one) differs from it
    checks = {c.name: c for c in router_certificate(edge["cfg"])[1]}
    assert checks["tls_certificate"].status == "fail" and checks["tls_served"].status == "warn"


@pytest.mark.parametrize("days", [3, 20])  # under CERT_FAIL_DAYS (7), then only under CERT_WARN_DAYS (30)
def test_a_certificate_inside_the_warning_window_is_refused_before_the_reload_unless_forced(edge, days):
    from cryptography import x509

    port, cert = edge["router"].port, edge["cert"]
    served = _served_serial(port)
    soon, _ = edge["ca"].issue("soon", ["localhost"], days=days, key=edge["key"])
    cert.write_bytes(soon.read_bytes())
    new = x509.load_pem_x509_certificates(soon.read_bytes())[0].serial_number

    result = run_cli("router", "reload", "-c", str(edge["path"]))
    assert result.returncode == 1, result.stdout + result.stderr
    err = " ".join(result.stderr.split())
    assert "refusing to reload nginx on router" in err and f"{cert} expires in" in err, err
    assert "deployctl router reload --force" in err and "certbot renew" in err
    assert _served_serial(port) == served  # refused before nginx read it

    result = run_cli("router", "reload", "-c", str(edge["path"]), "--force")
    assert result.returncode == 0, result.stdout + result.stderr
    assert _served_serial(port) == new  # served now, and its expiry still reported
    out = " ".join(result.stdout.split())
    assert f"{'fail' if days < 7 else 'warn'} tls_certificate: {cert} expires in" in out, out
    assert "pass tls_served" in out
