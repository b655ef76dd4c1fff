"""Traffic split: weights from the rollout step, `down` for weight 0 and drained hosts, checked by nginx itself
(`nginx -t`) and by real requests through a real nginx, counted in its JSON access log."""
from __future__ import annotations

import re

import collections
import http.server
import threading

import httpx
import pytest

from deployctl.errors import ConfigError
from deployctl.render import render_nginx, split_weights
from deployctl.render.validate import check_nginx_conf
from support.render import make_config


@pytest.mark.parametrize("pct,n_stable,n_canary,expected", [
    (5, 2, 1, (19, 2)),     # 95×1 : 5×2 over gcd 5
    (25, 2, 1, (3, 2)),     # 75 : 50
    (50, 3, 1, (1, 3)),     # 50 : 150
    (0, 2, 1, (1, 0)),      # canary off
    (100, 2, 1, (0, 1)),    # stable off
    (30, 0, 1, (0, 1)),     # no live stable: everything to the canary
    (30, 2, 0, (1, 0)),     # no canary
])
def test_split_weights(pct, n_stable, n_canary, expected):
    assert split_weights(pct, n_stable, n_canary) == expected
    ws, wc = expected
    if ws and wc:  # the canary's share of requests is exactly pct
        assert wc * n_canary * 100 == pct * (ws * n_stable + wc * n_canary)


def test_split_weights_rejects_out_of_range():
    with pytest.raises(ConfigError, match="canary weight 120 is outside 0..100"):
        split_weights(120, 1, 1)


def _servers(text: str) -> dict[str, str]:
    """host name -> server line parameters (after the address)."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("server ") and "#" in line:
            params, host = line.split("#", 1)
            value = params.split(None, 2)[2].strip().rstrip(";") if len(params.split()) > 2 else ""
            # the failover parameters are on every server (test_render_failover.py); the split is the rest
            out[host.split()[0]] = re.sub(r"\s*max_fails=\d+ fail_timeout=\d+s", "", value).strip()
    return out


@pytest.mark.parametrize("pct,drained,expected", [
    (0, set(), {"gpu-a": "", "gpu-b": "", "gpu-c": "down"}),
    (5, set(), {"gpu-a": "weight=19", "gpu-b": "weight=19", "gpu-c": "weight=2"}),
    (100, set(), {"gpu-a": "down", "gpu-b": "down", "gpu-c": ""}),
    (50, {"gpu-b"}, {"gpu-a": "", "gpu-b": "down", "gpu-c": ""}),
])
def test_rendered_split_passes_nginx_t(tmp_path, pct, drained, expected):
    cfg = make_config(hosts=[{"name": n, "address": f"10.0.0.{i}", "deploy_root": "/opt/d"}
                             for i, n in enumerate(["gpu-a", "gpu-b", "gpu-c"], 1)])
    stable, canary = cfg.hosts[:2], cfg.hosts[2:]
    text = render_nginx(cfg, stable=stable, canary=canary, canary_weight=pct, drained=drained)
    assert _servers(text) == expected
    assert "weight=0" not in text
    conf = tmp_path / "router.conf"
    conf.write_text(text)
    result = check_nginx_conf(cfg, conf)
    assert result.ok, result.output


def test_sse_settings_and_json_log_format_are_rendered():
    cfg = make_config(server={"request_timeout_s": 300})
    text = render_nginx(cfg, stable=list(cfg.hosts), canary=[], canary_weight=0)
    for directive in ("proxy_http_version 1.1;", 'proxy_set_header Connection "";', "proxy_buffering off;",
                      "proxy_cache off;", "gzip off;", "keepalive 64;"):
        assert directive in text
    read_timeout = int(text.split("proxy_read_timeout ")[1].split("s;")[0])
    assert read_timeout > 300
    for field in ("upstream_addr", "status", "request_time", "upstream_response_time",
                  "$upstream_http_x_deployctl_release"):
        assert field in text
    assert "access_log /var/log/nginx/chat-7b.access.json deployctl_chat_7b_json;" in text


def test_render_nginx_rejects_bad_roles():
    cfg = make_config()
    with pytest.raises(ConfigError, match="both stable and canary"):
        render_nginx(cfg, stable=list(cfg.hosts), canary=cfg.hosts[:1], canary_weight=5)
    with pytest.raises(ConfigError, match="drained host 'nope' is not routed"):
        render_nginx(cfg, stable=list(cfg.hosts), canary=[], canary_weight=0, drained={"nope"})


class _Backend:
    """A tiny HTTP server answering every request with its own release id in X-Deployctl-Release."""

    def __init__(self, release: str):
        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                body = release.encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("X-Deployctl-Release", release)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def backends():
    made = [_Backend(r) for r in ("rel-old", "rel-old", "rel-new")]
    yield made
    for b in made:
        b.close()


def _hit(url: str, n: int) -> collections.Counter:
    with httpx.Client(timeout=10) as client:
        return collections.Counter(client.get(url + "/v1/models").text for _ in range(n))


def test_real_nginx_splits_traffic_by_rendered_weights(nginx_router, backends):
    hosts = [{"name": f"h{i}", "address": "local", "deploy_root": "/opt/d", "server_port": b.port}
             for i, b in enumerate(backends)]
    cfg = make_config(hosts=hosts, server={"bind": "127.0.0.1", "api_key_env": None},
                      router=nginx_router.router_config())
    stable, canary = cfg.hosts[:2], cfg.hosts[2:]
    nginx_router.start(cfg, render_nginx(cfg, stable=stable, canary=canary, canary_weight=25))
    # Smooth weighted round robin (3:3:2 here) is exact over whole cycles of 8 requests.
    assert _hit(nginx_router.url, 80) == {"rel-old": 60, "rel-new": 20}
    entries = nginx_router.wait_entries(0, lambda es: len(es) >= 80)
    assert len(entries) == 80
    by_upstream = collections.Counter(e["upstream_addr"] for e in entries)
    assert by_upstream == {f"127.0.0.1:{b.port}": n for b, n in zip(backends, (30, 30, 20))}
    assert collections.Counter(e["release"] for e in entries) == {"rel-old": 60, "rel-new": 20}
    assert all(e["status"] == 200 for e in entries)

    nginx_router.write_upstream(render_nginx(cfg, stable=stable, canary=canary, canary_weight=100))
    nginx_router.reload()
    assert _hit(nginx_router.url, 10) == {"rel-new": 10}

    nginx_router.write_upstream(render_nginx(cfg, stable=stable, canary=canary, canary_weight=100, drained={"h2"}))
    nginx_router.reload()
    assert _hit(nginx_router.url, 10) == {"rel-old": 10}  # the drained canary takes nothing
