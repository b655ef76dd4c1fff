"""TLS at the router: every rendered TLS config passes `nginx -t`; end to end, the official openai client talks
https to the real runtime (tiny model, CPU) through a real nginx started from the rendered conf, streaming
included; HTTP/2 streams stay unbuffered; plain HTTP is redirected (308) or closed; a renewed certificate is served
after `deployctl router reload`."""
from __future__ import annotations

import socket
import ssl
import time

import httpx
import pytest

from deployctl.render import render_nginx
from deployctl.render.validate import check_nginx_conf
from support.certs import TestCA
from support.cli import run_cli
from support.nginx import NginxRouter
from support.ports import free_port
from support.render import make_config, write_config

TLS = {"certificate": "/etc/deployctl/tls/llm.pem", "key": "/etc/deployctl/tls/llm.key"}
VARIANTS = {
    "tls": {"tls": TLS},
    "tls+redirect": {"tls": {**TLS, "redirect_http": True}, "listen": 443},
    "tls+redirect_port": {"tls": {**TLS, "redirect_http": True, "http_listen": 8080}, "listen_address": "::1"},
    "tls+limits": {"tls": TLS, "max_conns_per_host": 8, "limits": {"requests_per_s": 0.5, "burst": 4,
                                                                    "connections": 2, "key": "api_key"}},
    "plain+limits": {"max_conns_per_host": 2, "limits": {"requests_per_s": 20}},
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_rendered_tls_config_passes_nginx_t(tmp_path, variant):
    cfg = make_config(router={"server_name": "llm.example.com", **VARIANTS[variant]})
    conf = tmp_path / "router.conf"
    conf.write_text(render_nginx(cfg, stable=list(cfg.hosts), canary=[], canary_weight=0))
    result = check_nginx_conf(cfg, conf)
    assert result.ok, result.output
    text = conf.read_text()
    if "tls" in VARIANTS[variant]:
        assert "ssl http2;" in text and "ssl_protocols TLSv1.2 TLSv1.3;" in text
        assert any("stand-in" in n for n in result.notes), result.notes  # the real files live on the router host
    assert ("return 308 https://llm.example.com" in text) == ("redirect" in variant)


def test_nginx_t_catches_a_key_that_does_not_match(tmp_path):
    """The negative control: with real files nginx -t itself refuses another pair's key."""
    ca = TestCA(tmp_path / "ca")
    cert, _ = ca.issue("a", ["llm.example.com"])
    _, other = ca.issue("b", ["llm.example.com"])
    cfg = make_config(router={"server_name": "llm.example.com", "tls": {"certificate": str(cert), "key": str(other)}})
    conf = tmp_path / "router.conf"
    conf.write_text(render_nginx(cfg, stable=list(cfg.hosts), canary=[], canary_weight=0))
    result = check_nginx_conf(cfg, conf)
    assert not result.ok and "key values mismatch" in result.output, result.output


def test_tls_needs_a_server_name_and_its_own_http_port():
    from deployctl.errors import ConfigError

    with pytest.raises(ConfigError, match="router.tls needs router.server_name"):
        make_config(router={"tls": TLS})
    with pytest.raises(ConfigError, match="http_listen 8443 is router.listen too"):
        make_config(router={"server_name": "a.example", "listen": 8443,
                            "tls": {**TLS, "redirect_http": True, "http_listen": 8443}})
    with pytest.raises(ConfigError, match=r"router.server_name: server_name must be a DNS name"):
        make_config(router={"server_name": "a b; include /etc/passwd", "tls": TLS})


@pytest.fixture(scope="module")
def stack(tmp_path_factory, slow_tiny_runtime):
    """The tiny runtime (slow_tiny_runtime) behind nginx with TLS for localhost, plain HTTP redirected."""
    base = tmp_path_factory.mktemp("tls-stack")
    ca = TestCA(base / "ca")
    cert, key = ca.issue("router", ["localhost"])
    router = NginxRouter(base / "nginx")
    http_port = free_port()
    path = write_config(base / "deploy.yaml", model={"path": str(slow_tiny_runtime["model"]), "served_name": "model"},
                        engine={"device": "cpu"},
                        server={"bind": "127.0.0.1", "port": slow_tiny_runtime["port"], "api_key_env": None},
                        hosts=[{"name": "local-a", "address": "local", "deploy_root": str(base / "root")}],
                        router={**router.router_config(), "server_name": "localhost",
                                "tls": {"certificate": str(cert), "key": str(key), "redirect_http": True,
                                        "http_listen": http_port}})
    from deployctl.config import load_config

    cfg = load_config(path)
    try:
        router.start(cfg)
        yield {"cfg": cfg, "path": path, "router": router, "ca": ca, "cert": cert, "key": key,
               "base": f"https://localhost:{router.port}", "http_port": http_port}
    finally:
        router.stop()


def _trust(stack) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(stack["ca"].path))


def _arrivals(chunks_iter) -> list[float]:
    t0, out = time.perf_counter(), []
    for _ in chunks_iter:
        out.append(time.perf_counter() - t0)
    return out


def _spread(arrivals: list[float]) -> float:
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    return sum(g > 0.005 for g in gaps) / max(1, len(gaps))


def test_openai_client_over_https_through_nginx_streaming_included(stack):
    import openai

    client = openai.OpenAI(base_url=stack["base"] + "/v1", api_key="unused",
                           http_client=httpx.Client(verify=_trust(stack)))
    done = client.completions.create(model="model", prompt="Hello", max_tokens=8)
    assert done.choices[0].text and done.usage.completion_tokens >= 1
    stream = client.chat.completions.create(model="model", messages=[{"role": "user", "content": "Hi"}],
                                            max_tokens=16, stream=True, extra_body={"ignore_eos": True})
    chunks = []
    arrivals = _arrivals(chunks.append(c) for c in stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and chunks[-1].choices[0].finish_reason == "length"
    assert _spread(arrivals) > 0.5 and arrivals[-1] - arrivals[0] > 0.15, arrivals  # tokens as they come
    entry = stack["router"].wait_entries(0, lambda es: any(e["uri"].endswith("/chat/completions") for e in es))[-1]
    assert entry["status"] == 200 and entry["upstream_addr"].startswith("127.0.0.1:")
    with pytest.raises(openai.APIConnectionError):  # a client that does not trust the test CA refuses the router
        openai.OpenAI(base_url=stack["base"] + "/v1", api_key="x", max_retries=0).models.list()


def test_http2_streams_stay_unbuffered(stack):
    body = {"model": "model", "prompt": "Hello", "max_tokens": 16, "stream": True, "ignore_eos": True}
    with httpx.Client(http2=True, verify=_trust(stack), timeout=30) as client:
        with client.stream("POST", stack["base"] + "/v1/completions", json=body) as r:
            assert r.http_version == "HTTP/2" and r.status_code == 200
            lines: list[str] = []
            arrivals = _arrivals(lines.append(ln) for ln in r.iter_lines() if ln.startswith("data:"))
    assert lines[-1] == "data: [DONE]" and len(lines) > 8, lines  # a partial UTF-8 character waits for its rest
    assert _spread(arrivals) > 0.5 and arrivals[-1] - arrivals[0] > 0.15, arrivals


def _handshake(port: int, ca_path, **ctx_kw) -> tuple[str, str, str]:
    ctx = ssl.create_default_context(cafile=str(ca_path))
    ctx.set_alpn_protocols(["h2", "http/1.1"])
    for k, v in ctx_kw.items():
        setattr(ctx, k, v)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname="localhost") as s:
            return s.version(), s.cipher()[0], s.selected_alpn_protocol()


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1:DeprecationWarning")  # the client asks for TLS 1.0/1.1 on purpose
def test_protocols_ciphers_and_plain_http_redirect(stack):
    port, ca = stack["router"].port, stack["ca"].path
    version, _, alpn = _handshake(port, ca)
    assert version == "TLSv1.3" and alpn == "h2"
    version, cipher, _ = _handshake(port, ca, maximum_version=ssl.TLSVersion.TLSv1_2)
    assert version == "TLSv1.2" and cipher.startswith("ECDHE-") and ("GCM" in cipher or "CHACHA20" in cipher), cipher
    with pytest.raises(ssl.SSLError):  # TLS 1.1 and older are not offered
        _handshake(port, ca, minimum_version=ssl.TLSVersion.TLSv1, maximum_version=ssl.TLSVersion.TLSv1_1)
    r = httpx.post(f"http://127.0.0.1:{stack['http_port']}/v1/completions?x=1", json={"prompt": "hi"})
    assert r.status_code == 308 and r.headers["location"] == f"{stack['base']}/v1/completions?x=1"
    hsts = httpx.get(stack["base"] + "/v1/models", verify=_trust(stack)).headers["strict-transport-security"]
    assert hsts.startswith("max-age=")


def test_plain_http_closed_without_redirect(stack):
    router, cfg = stack["router"], stack["cfg"]
    closed = cfg.model_copy(update={"router": cfg.router.model_copy(
        update={"tls": cfg.router.tls.model_copy(update={"redirect_http": False})})})
    before = router.upstream_conf.read_text()
    try:
        router.write_upstream(render_nginx(closed, stable=list(cfg.hosts), canary=[], canary_weight=0))
        router.reload()
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{stack['http_port']}/v1/models", timeout=5)
        assert httpx.get(stack["base"] + "/v1/models", verify=_trust(stack)).status_code == 200
    finally:
        router.write_upstream(before)
        router.reload()


def _served_serial(port: int) -> int:
    return x509_serial(ssl.get_server_certificate(("127.0.0.1", port)).encode())


def test_renewed_certificate_is_served_after_router_reload(stack):
    port = stack["router"].port
    old = _served_serial(port)
    renewed, _ = stack["ca"].issue("renewed", ["localhost"], days=120, key=stack["key"])
    stack["cert"].write_bytes(renewed.read_bytes())  # what certbot's deploy hook does: new file, same path
    new = x509_serial(renewed.read_bytes())
    assert _served_serial(port) == old  # nginx reads certificates only at (re)load
    result = run_cli("router", "reload", "-c", str(stack["path"]))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "nginx reloaded on router" in result.stdout and "pass tls_certificate" in result.stdout
    assert _served_serial(port) == new


def test_router_reload_refuses_a_renewal_gone_wrong(stack, tmp_path):
    """Another pair's certificate: nginx -t fails, the conf and the served certificate stay (exit 1). An expired one
    (nginx -t accepts it): refused before the reload, so nginx keeps serving the valid one (exit 1)."""
    port, cert = stack["router"].port, stack["cert"]
    kept = cert.read_bytes()
    served = _served_serial(port)
    try:
        other, _ = stack["ca"].issue("other-pair", ["localhost"])
        cert.write_bytes(other.read_bytes())
        result = run_cli("router", "reload", "-c", str(stack["path"]))
        assert result.returncode == 1 and "nginx -t rejected" in result.stderr, result.stderr
        assert "previous conf was restored" in result.stderr and _served_serial(port) == served
        expired, _ = stack["ca"].issue("expired", ["localhost"], days=-1, not_before_days=30, key=stack["key"])
        cert.write_bytes(expired.read_bytes())
        result = run_cli("router", "reload", "-c", str(stack["path"]))
        assert result.returncode == 1 and "refusing to reload nginx" in result.stderr, result.stderr
        assert f"{cert} expired on" in result.stderr and "certbot renew" in result.stderr
        assert _served_serial(port) == served
    finally:
        cert.write_bytes(kept)
        assert run_cli("router", "reload", "-c", str(stack["path"])).returncode == 0
    assert _served_serial(port) == x509_serial(kept)
    no_router = write_config(tmp_path / "deploy.yaml", router=None)
    result = run_cli("router", "reload", "-c", str(no_router))
    assert result.returncode == 3 and "no router: section" in result.stderr


def x509_serial(pem: bytes) -> int:
    from cryptography import x509

    return x509.load_pem_x509_certificates(pem)[0].serial_number
