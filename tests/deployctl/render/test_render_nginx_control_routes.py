"""The router never proxies the engines' control routes (sleep/wake, vLLM's dev routes, SGLang's weight and cache
routes): a real nginx in front of a backend that would answer 200 to anything answers 404 in OpenAI's shape to
each of them, however the path is spelled, while /v1 and the health routes pass."""
from __future__ import annotations

import http.server
import threading

import httpx
import pytest

from deployctl.engines import router_refused_paths
from deployctl.render import render_nginx
from support.render import make_config


class _AnswersEverything:
    """200 ``reached PATH`` to every GET and POST, counting what reached it."""

    def __init__(self):
        self.paths: list[str] = []
        seen = self.paths

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self):
                n = int(self.headers.get("Content-Length") or 0)
                if n:
                    self.rfile.read(n)
                seen.append(self.path)
                body = f"reached {self.path}".encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

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
def backend():
    b = _AnswersEverything()
    yield b
    b.close()


def test_control_routes_are_404_at_the_router_and_v1_passes(nginx_router, backend):
    cfg = make_config(hosts=[{"name": "h0", "address": "local", "deploy_root": "/opt/d", "server_port": backend.port}],
                      server={"bind": "127.0.0.1", "api_key_env": None}, router=nginx_router.router_config())
    nginx_router.start(cfg, render_nginx(cfg, stable=list(cfg.hosts), canary=[], canary_weight=0))
    url = nginx_router.url
    paths = router_refused_paths()
    assert len(paths) > 20
    spelled = ["/sleep?level=1", "/sleep/", "/SLEEP", "/%73leep", "//wake_up", "/v1/../sleep", "/is_sleeping",
               "/release_memory_occupation", "/resume_memory_occupation", "/reset_prefix_cache", "/collective_rpc",
               "/server_info", "/fault_tolerance/apply"]
    with httpx.Client(timeout=10) as client:
        for path in list(paths) + spelled:
            for method in ("GET", "POST"):
                r = client.request(method, url + path, content=b"{}" if method == "POST" else None)
                assert r.status_code == 404, (method, path, r.status_code, r.text)
                assert r.json()["error"]["code"] == "control_route", (path, r.text)
        assert backend.paths == []  # nothing reached the engine
        for path in ("/v1/models", "/v1/completions", "/health", "/readyz", "/v1/sleep_notes", "/sleepy"):
            method = "POST" if path == "/v1/completions" else "GET"
            r = client.request(method, url + path, content=b"{}" if method == "POST" else None)
            assert r.status_code == 200 and r.text == f"reached {path}", (path, r.status_code, r.text)
