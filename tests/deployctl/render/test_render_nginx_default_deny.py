"""The router is default-deny: a real nginx rendered by deployctl passes only the service's inference routes (each
sent to the engine as exactly that path), answers the health paths with a status and no body, and answers 404 to
every other path however it is spelled (encoded, dotted, doubled slashes, other case): metrics, tokenizer, docs,
dev and control routes never leave the host.

Behind it: a backend that answers 200 to anything (what reaches it is recorded), the stand-in engine whose key
guards /v1 only (as vLLM's --api-key) and which answers 200 to every other path, and the bundled runtime with a key.
Requests go out with http.client, which sends the path byte for byte (httpx would resolve the dots itself)."""
from __future__ import annotations

import http.client
import http.server
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from deployctl.config import layout
from deployctl.engines import KINDS, adapter, router_passed_paths, router_refused_paths
from deployctl.render import keys, render_nginx
from support.paths import REPO
from support.ports import free_port
from support.render import make_config
from support.runtime import serve_runtime, subprocess_env

SERVICE = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/responses")
# The engines' documented routes besides the service's (vLLM's, SGLang's, the bundled runtime's), health and
# metrics, then spellings that decode or resolve to them: 30+ paths, none of which may answer 200 without a key.
DOCUMENTED = ["/invocations", "/tokenize", "/detokenize", "/pooling", "/classify", "/score", "/rerank", "/v1/rerank",
              "/v2/rerank", "/v1/score", "/v1/embeddings", "/v1/audio/transcriptions", "/generate",
              "/version", "/metrics", "/docs", "/redoc", "/openapi.json", "/ping", "/load", "/get_model_info",
              "/get_server_info", "/server_info", "/collective_rpc", "/sleep?level=1", "/wake_up", "/is_sleeping",
              "/reset_prefix_cache", "/identity", "/flush_cache", "/update_weights_from_disk", "/start_profile",
              "/v1/models/model", "/v1/load_lora_adapter"]
ODD = ["/METRICS", "/Metrics", "/V1/models", "/v1/Models", "/V1/CHAT/COMPLETIONS", "/v1/models/", "/v1/models.json",
       "/%6detrics", "/%2e/metrics", "/v1/%2e%2e/metrics", "/v1/%2E%2E/tokenize", "//v1/../metrics",
       "/v1/../metrics", "/v1/models/../../metrics", "/v1/models%2f..%2f..%2fmetrics", "/v1/./../docs",
       "/v1/chat/completions/../../tokenize", "/metrics/", "/metrics?x=1", "/metrics;x", "/tokenize%20",
       "/v1/models%00", "/./metrics", "/v1//../detokenize", "/static/../metrics"]
HEALTH = ["/health", "/healthz", "/readyz"]
PATHS = DOCUMENTED + ODD
# spellings that nginx resolves to a service route: they are that route (the key decides), and reach it as it
PASSED_SPELLINGS = {"//v1/models": "/v1/models", "/v1//models": "/v1/models", "/%76%31/models": "/v1/models",
                    "/v1/./models": "/v1/models", "/v1/chat/../models": "/v1/models"}


def _ask(url: str, method: str, path: str, headers: dict | None = None) -> tuple[int, str]:
    """(status, body) of one request with ``path`` sent exactly as written."""
    host, port = url.rsplit("/", 1)[-1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=15)
    try:
        body = b"{}" if method == "POST" else None
        conn.request(method, path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
        r = conn.getresponse()
        return r.status, r.read().decode(errors="replace")
    finally:
        conn.close()


class _AnswersEverything:
    """200 ``reached PATH`` to every GET and POST, recording each path it got."""

    def __init__(self):
        self.paths: list[str] = []
        self.ready_code = 200  # what /readyz answers
        seen, me = self.paths, self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self):
                n = int(self.headers.get("Content-Length") or 0)
                if n:
                    self.rfile.read(n)
                seen.append(self.path)
                code = me.ready_code if self.path == "/readyz" else 200
                body = f"reached {self.path}: model tiny, device cpu, dtype float32".encode()
                self.send_response(code)
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


def _router(nginx_router, port: int, *, client_keys: tuple[str, ...] = (), engine_key: str | None = None):
    """The rendered router in front of ``port``; with ``client_keys`` it checks them (the keys file written as a
    deploy does, deployctl.render.keys) and sends ``engine_key`` upstream."""
    server = {"bind": "127.0.0.1", "api_key_env": "LLM_API_KEY" if client_keys else None}
    cfg = make_config(hosts=[{"name": "h0", "address": "local", "deploy_root": "/opt/d", "server_port": port}],
                      server=server, router=nginx_router.router_config())
    if client_keys:
        file = keys.KeysFile(tuple(keys.Key(k, "keys", "t0") for k in client_keys), engine_key)
        path = Path(layout.router_keys_path(cfg))
        path.write_text(keys.render("chat_7b", file))
        path.chmod(0o600)
    nginx_router.start(cfg, render_nginx(cfg, stable=list(cfg.hosts), canary=[], canary_weight=0))
    return cfg


def test_the_allowlist_is_the_adapters_and_refuses_every_control_route():
    assert len(PATHS) >= 30
    assert router_passed_paths(KINDS) == tuple(sorted(SERVICE))
    assert set(router_passed_paths(KINDS)).isdisjoint(router_refused_paths())
    for kind in KINDS:
        assert adapter(kind).ready_route not in adapter(kind).public_routes


def test_only_the_service_routes_reach_the_backend(nginx_router, backend):
    _router(nginx_router, backend.port)
    url = nginx_router.url
    refused = [p for p in router_refused_paths()]
    for path in PATHS + refused:
        for method in ("GET", "POST"):
            code, body = _ask(url, method, path)
            assert code in (400, 404), (method, path, code, body)  # 400: nginx refuses a NUL byte itself
            if code == 404:
                assert json.loads(body)["error"]["code"] == "route_not_served", (path, body)
    assert backend.paths == []  # nothing reached the engine
    for path in SERVICE + ("/v1/models?limit=2",):
        code, body = _ask(url, "GET" if "models" in path else "POST", path)
        assert (code, body.split(":")[0]) == (200, f"reached {path}"), (path, code, body)
    for path, reached in PASSED_SPELLINGS.items():
        backend.paths.clear()
        code, body = _ask(url, "GET", path)
        assert code == 200 and backend.paths == [reached], (path, code, backend.paths)  # the exact path, not the raw


def test_health_at_the_edge_is_a_status_without_detail(nginx_router, backend):
    _router(nginx_router, backend.port)
    for path in HEALTH:
        for method in ("GET", "HEAD"):
            code, body = _ask(nginx_router.url, method, path)
            assert (code, body) == (200, "ok\n" if method == "GET" else ""), (method, path, code, body)
    backend.ready_code = 503
    for path in HEALTH:
        assert _ask(nginx_router.url, "GET", path) == (503, "unavailable\n"), path
    assert set(backend.paths) == {"/readyz"}  # the runtime's ready route, asked by the edge itself


def test_edge_health_on_a_mixed_fleet_asks_the_next_runtime(nginx_router, backend):
    """Mid-switch, a runtime of another engine has no such ready route (404): the edge asks the next one."""
    other = _AnswersEverything()
    try:
        other.ready_code = 404
        hosts = [{"name": f"h{i}", "address": "local", "deploy_root": f"/opt/d{i}", "server_port": b.port}
                 for i, b in enumerate((other, backend))]
        cfg = make_config(hosts=hosts, server={"bind": "127.0.0.1", "api_key_env": None},
                          router=nginx_router.router_config())
        nginx_router.start(cfg, render_nginx(cfg, stable=list(cfg.hosts), canary=[], canary_weight=0))
        assert [_ask(nginx_router.url, "GET", "/readyz")[0] for _ in range(6)] == [200] * 6
        assert "/readyz" in other.paths  # it was asked, and passed the question on
    finally:
        other.close()


@pytest.fixture
def standin_v1_key(tmp_path):
    """The stand-in engine on a free port, its key guarding /v1 only and every other path open (200)."""
    model = tmp_path / "model"
    model.mkdir()
    port = free_port()
    conf = tmp_path / "runtime.yaml"
    conf.write_text(f"model: {model}\nserved_model_name: standin\nport: {port}\nhost: 127.0.0.1\n")
    env = {**subprocess_env(), "PYTHONPATH": str(REPO / "tests" / "support" / "standin_engine"),
           "DEPLOYCTL_RUNTIME_API_KEY": "sk-standin-engine-key", "DEPLOYCTL_STANDIN_KEY_SCOPE": "v1"}
    log = open(tmp_path / "standin.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "deployctl_runtime", "serve", "--config", str(conf)], env=env,
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, (tmp_path / "standin.log").read_text()
            try:
                if _ask(f"http://127.0.0.1:{port}", "GET", "/readyz")[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "the stand-in did not answer /readyz within 30 s"
            time.sleep(0.05)
        yield {"port": port, "key": "sk-standin-engine-key"}
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


def _through_router(url: str, key: str) -> dict[str, list]:
    """Every path of PATHS, the service's own and their spellings through the router, without and with the key:
    {"open": [(method, path, code)] answered 200 without a key, "codes": set of codes without a key}."""
    out = {"open": [], "codes": set()}
    for path in PATHS + list(SERVICE) + list(PASSED_SPELLINGS):
        for method in ("GET", "POST"):
            code, _ = _ask(url, method, path)
            out["codes"].add(code)
            if code == 200:
                out["open"].append((method, path))
            _ask(url, method, path, {"Authorization": f"Bearer {key}"})
    return out


def _reached(nginx_router) -> set[str]:
    """The normalized paths nginx sent upstream (its access log: an upstream address)."""
    entries = nginx_router.wait_entries(0, lambda e: False, timeout_s=0.5)
    return {e["uri"] for e in entries if e["upstream_addr"] and not e["uri"].startswith("/_deployctl")}


def test_a_v1_only_key_engine_behind_the_router_answers_nothing_without_a_key(nginx_router, standin_v1_key):
    # the engine alone is open on everything but /v1: what the router must not pass on
    direct = f"http://127.0.0.1:{standin_v1_key['port']}"
    assert _ask(direct, "GET", "/metrics")[0] == 200 and _ask(direct, "POST", "/tokenize")[0] == 200
    _router(nginx_router, standin_v1_key["port"])
    seen = _through_router(nginx_router.url, standin_v1_key["key"])
    assert seen["open"] == [] and seen["codes"] <= {400, 401, 404}, seen
    assert _reached(nginx_router) <= set(SERVICE)


def test_the_bundled_runtime_behind_the_router_answers_nothing_without_a_key(nginx_router, tmp_path,
                                                                            slow_tiny_runtime):
    with serve_runtime(slow_tiny_runtime["model"], tmp_path / "serve.log",
                       env={"DEPLOYCTL_RUNTIME_API_KEY": "sk-runtime"}) as url:
        _router(nginx_router, int(url.rsplit(":", 1)[1]))
        seen = _through_router(nginx_router.url, "sk-runtime")
        assert seen["open"] == [] and seen["codes"] <= {400, 401, 404}, seen
        assert _reached(nginx_router) <= set(SERVICE)
        assert _ask(nginx_router.url, "GET", "/v1/models", {"Authorization": "Bearer sk-runtime"})[0] == 200


CLIENT = "sk-client-0001.+abc~XYZ"  # regex characters in a key are matched literally
ENGINE = "sk-standin-engine-key"


def test_the_router_checks_the_key_for_an_engine_that_guards_v1_only(nginx_router, standin_v1_key):
    """The engine's key is not the clients': the router accepts the client's key and sends the engine's own, so the
    stand-in answers; without an accepted key every path is 401 or 404 at the router and nothing reaches it."""
    port = standin_v1_key["port"]
    _router(nginx_router, port, client_keys=(CLIENT,), engine_key=standin_v1_key["key"])
    url = nginx_router.url
    for path in PATHS + list(SERVICE) + list(PASSED_SPELLINGS):
        for method in ("GET", "POST"):
            for headers in ({}, {"Authorization": f"Bearer {standin_v1_key['key']}"},  # the engine's key: not a client's
                            {"Authorization": f"Bearer {CLIENT.upper()}"}, {"Authorization": f"Bearer {CLIENT}x"},
                            {"Authorization": f"Basic {CLIENT}"}):
                code, body = _ask(url, method, path, headers)
                assert code in (400, 401, 404), (method, path, headers, code, body)
    assert _reached(nginx_router) == set(), "a request without an accepted key reached the engine"
    code, body = _ask(url, "POST", "/v1/tokenize", {"Authorization": f"Bearer {CLIENT}"})
    assert code == 404 and json.loads(body)["error"]["code"] == "route_not_served"
    for scheme in ("Bearer", "bearer"):
        code, body = _ask(url, "GET", "/v1/models", {"Authorization": f"{scheme} {CLIENT}"})
        assert code == 200 and json.loads(body)["data"][0]["id"] == "standin", (code, body)
    code, body = _ask(url, "GET", "/v1/models")
    assert code == 401 and json.loads(body)["error"]["code"] == "invalid_api_key", body
    assert _ask(url, "GET", "/readyz") == (200, "ok\n")  # health needs no key
    ids = {e["key_id"] for e in nginx_router.access_entries() if e["upstream_addr"] and e["uri"] == "/v1/models"}
    assert ids == {keys.key_id(CLIENT)}  # the access log names the key by its id, never the key
    assert CLIENT not in nginx_router.access_log.read_text() and CLIENT not in nginx_router.upstream_conf.read_text()
    assert oct(Path(layout.router_keys_path(_router_cfg(nginx_router))).stat().st_mode & 0o777) == "0o600"


def _router_cfg(nginx_router):
    return make_config(router=nginx_router.router_config())


def test_the_router_key_in_front_of_the_bundled_runtime(nginx_router, tmp_path, slow_tiny_runtime):
    with serve_runtime(slow_tiny_runtime["model"], tmp_path / "serve.log",
                       env={"DEPLOYCTL_RUNTIME_API_KEY": ENGINE}) as url:
        _router(nginx_router, int(url.rsplit(":", 1)[1]), client_keys=(CLIENT,), engine_key=ENGINE)
        seen = _through_router(nginx_router.url, ENGINE)  # the engine's key is not a client's at the router
        assert seen["open"] == [] and seen["codes"] <= {400, 401, 404}, seen
        assert _reached(nginx_router) == set()
        code, body = _ask(nginx_router.url, "GET", "/v1/models", {"Authorization": f"Bearer {CLIENT}"})
        assert code == 200 and json.loads(body)["data"], (code, body)
