"""Limits at the router through a real nginx in front of the real runtime (support.runtime's slow_tiny_runtime):
at ``router.max_conns_per_host`` the extra concurrent requests get 429 with Retry-After in OpenAI's error shape
(the official openai client reads it as a RateLimitError) and every request that reached the runtime completes;
per-client ``limit_req`` and ``limit_conn`` answer the same way."""
from __future__ import annotations

import threading

import httpx
import pytest

from deployctl.config.router import LimitsConfig
from deployctl.render import render_nginx
from support.nginx import NginxRouter
from support.render import write_config

MAX_CONNS = 2
EXTRA = 3


@pytest.fixture(scope="module")
def stack(tmp_path_factory, slow_tiny_runtime):
    base = tmp_path_factory.mktemp("limits")
    router = NginxRouter(base / "nginx")
    path = write_config(base / "deploy.yaml", model={"path": str(slow_tiny_runtime["model"]), "served_name": "model"},
                        engine={"device": "cpu"},
                        server={"bind": "127.0.0.1", "port": slow_tiny_runtime["port"], "api_key_env": None},
                        hosts=[{"name": "local-a", "address": "local", "deploy_root": str(base / "root")}],
                        router={**router.router_config(), "max_conns_per_host": MAX_CONNS, "retry_after_s": 2})
    from deployctl.config import load_config

    cfg = load_config(path)
    try:
        router.start(cfg)
        yield {"cfg": cfg, "router": router, "runtime": slow_tiny_runtime["url"]}
    finally:
        router.stop()


def _successes(runtime_url: str) -> float:
    text = httpx.get(runtime_url + "/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("deployctl_runtime_request_success_total{"))


def _concurrently(n: int, fn) -> list:
    """``fn(client)`` in n threads released together; each thread's openai client is built before the release (under
    load, building it after would let the first streams finish before the last ones start)."""
    import openai

    barrier, out, lock = threading.Barrier(n), [], threading.Lock()

    def run() -> None:
        client = openai.OpenAI(base_url="http://unused/v1", api_key="unused", max_retries=0)
        barrier.wait()
        result = fn(client)
        with lock:
            out.append(result)

    threads = [threading.Thread(target=run) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return out


def _openai_stream(base: str, client=None):
    """("ok", finish_reason, number of chunks) or ("429", the RateLimitError)."""
    import openai

    client = (client or openai.OpenAI(api_key="unused", max_retries=0)).with_options(base_url=base + "/v1")
    try:
        stream = client.completions.create(model="model", prompt="Hello there", max_tokens=32, stream=True,
                                           extra_body={"ignore_eos": True})
        chunks = list(stream)
        return ("ok", chunks[-1].choices[0].finish_reason, len(chunks))
    except openai.RateLimitError as err:
        return ("429", err)


def _openai_models(base: str):
    import openai

    try:
        return ("ok", len(openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0).models.list().data))
    except openai.RateLimitError as err:
        return ("429", err)


def test_max_conns_extra_requests_get_429_and_admitted_ones_complete(stack):
    router, runtime = stack["router"], stack["runtime"]
    before_ok, log_before = _successes(runtime), len(router.access_entries())
    results = _concurrently(MAX_CONNS + EXTRA, lambda c: _openai_stream(router.url, c))
    ok = [r for r in results if r[0] == "ok"]
    limited = [r[1] for r in results if r[0] == "429"]
    assert len(ok) + len(limited) == MAX_CONNS + EXTRA, results
    assert 1 <= len(ok) <= MAX_CONNS and len(limited) >= EXTRA, results
    for _, finish, n_chunks in ok:  # every admitted stream ran to its end
        assert finish == "length" and n_chunks >= 8
    for err in limited:
        assert err.status_code == 429 and err.response.headers["retry-after"] == "2"
        assert err.code == "router_over_capacity" and err.type == "rate_limit_error"
        assert "router.max_conns_per_host" in err.message and err.body["param"] is None
        assert err.response.headers["content-type"].startswith("application/json")
    # Nothing that reached the runtime was dropped: the runtime finished exactly the admitted requests, and
    # every access-log line naming a runtime address is a 200.
    assert _successes(runtime) - before_ok == len(ok)
    def limited_lines(entries: list[dict]) -> int:
        return sum(e["status"] == 429 and e["upstream_addr"].startswith("deployctl_") for e in entries)

    entries = router.wait_entries(log_before, lambda es: len(es) >= len(results) and limited_lines(es) >= len(limited))
    reached = [e for e in entries if e["upstream_addr"].startswith("127.0.0.1:")]
    assert len(reached) == len(ok) and all(e["status"] == 200 for e in reached), entries
    assert limited_lines(entries) == len(limited), entries


def test_a_runtime_that_is_down_is_a_json_502_not_429(stack, tmp_path):
    """Only "every server at max_conns" is 429: an unreachable runtime stays a 502, in OpenAI's shape too."""
    router, cfg = stack["router"], stack["cfg"]
    from support.ports import free_port

    dead = cfg.model_copy(update={"server": cfg.server.model_copy(update={"port": free_port()})})
    before = router.upstream_conf.read_text()
    try:
        router.write_upstream(render_nginx(dead, stable=list(dead.hosts), canary=[], canary_weight=0))
        router.reload()
        r = httpx.post(router.url + "/v1/completions", json={"model": "model", "prompt": "hi"}, timeout=10)
        assert r.status_code == 502 and r.json()["error"]["code"] == "bad_gateway" and "retry-after" not in r.headers
    finally:
        router.write_upstream(before)
        router.reload()


@pytest.mark.parametrize("limits, concurrent, code", [
    ({"requests_per_s": 1}, False, "rate_limit_exceeded"),
    ({"connections": 1}, True, "rate_limit_exceeded"),
])
def test_per_client_limits_answer_429_in_openai_shape(stack, limits, concurrent, code):
    router, cfg = stack["router"], stack["cfg"]
    limited = cfg.model_copy(update={"router": cfg.router.model_copy(update={
        "max_conns_per_host": None, "limits": LimitsConfig(**limits)})})
    before = router.upstream_conf.read_text()
    try:
        text = render_nginx(limited, stable=list(limited.hosts), canary=[], canary_weight=0)
        assert ("limit_conn " in text) == concurrent and ("limit_req " in text) != concurrent
        router.write_upstream(text)
        router.reload()
        if concurrent:
            results = _concurrently(3, lambda c: _openai_stream(router.url, c))
        else:
            results = [_openai_models(router.url) for _ in range(3)]  # quick ones: 3 well inside a second
        ok = [r for r in results if r[0] == "ok"]
        errs = [r[1] for r in results if r[0] == "429"]
        assert len(ok) >= 1 and len(errs) >= 1 and len(ok) + len(errs) == 3, results
        for err in errs:
            assert err.code == code and err.response.headers["retry-after"] == "2", err
            assert "router.limits" in err.message
    finally:
        router.write_upstream(before)
        router.reload()


class _Busy:
    """A stand-in runtime that answers every request 429 queue_full with its own Retry-After (stdlib server)."""

    BODY = b'{"error": {"message": "queue full", "type": "rate_limit_error", "param": null, "code": "queue_full"}}'

    def __enter__(self):
        import http.server

        body = self.BODY

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                self.rfile.read(int(self.headers.get("content-length", 0)))
                self.send_response(429)
                for k, v in (("Content-Type", "application/json"), ("Retry-After", "7"),
                             ("Content-Length", str(len(body)))):
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def test_the_runtimes_own_429_passes_through_unchanged(stack):
    router, cfg = stack["router"], stack["cfg"]
    before = router.upstream_conf.read_text()
    with _Busy() as busy:
        moved = cfg.model_copy(update={
            "server": cfg.server.model_copy(update={"port": busy.port}),
            "router": cfg.router.model_copy(update={"limits": LimitsConfig(requests_per_s=100, burst=10)})})
        try:
            router.write_upstream(render_nginx(moved, stable=list(moved.hosts), canary=[], canary_weight=0))
            router.reload()
            r = httpx.post(router.url + "/v1/completions", json={"prompt": "hi"}, timeout=10)
            assert r.status_code == 429 and r.content == _Busy.BODY and r.headers["retry-after"] == "7"
        finally:
            router.write_upstream(before)
            router.reload()
