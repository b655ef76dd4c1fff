"""C13: a token stream through a real nginx started from the rendered config arrives spread out, not clumped.

The upstream is a small real SSE server (uvicorn + FastAPI) written here: one `data:` chunk every 20 ms with
the runtime's streaming headers. The runtime-through-nginx variant belongs to the rollout tests.
"""
from __future__ import annotations

import asyncio
import statistics
import threading
import time

import httpx
import pytest
from fastapi import Request  # module level: FastAPI resolves the (string) annotation from globals

from support.render import make_config

CHUNK_INTERVAL_S = 0.02
NUM_CHUNKS = 200


class SSEServer:
    """uvicorn in a thread: POST /v1/completions streams NUM_CHUNKS `data:` lines then `data: [DONE]`.
    ``?plain=1`` leaves out X-Accel-Buffering (the negative control relies on nginx's own settings only)."""

    def __init__(self, port: int, release: str):
        import uvicorn
        from fastapi import FastAPI
        from fastapi.responses import StreamingResponse

        app = FastAPI()

        @app.post("/v1/completions")
        async def completions(request: Request):
            n = int(request.query_params.get("n", NUM_CHUNKS))

            async def events():
                for i in range(n):
                    await asyncio.sleep(CHUNK_INTERVAL_S)
                    yield f'data: {{"choices": [{{"index": 0, "text": "tok{i} "}}]}}\n\n'
                yield "data: [DONE]\n\n"

            headers = {"Cache-Control": "no-cache", "X-Deployctl-Release": release}
            if not request.query_params.get("plain"):
                headers["X-Accel-Buffering"] = "no"
            return StreamingResponse(events(), media_type="text/event-stream", headers=headers)

        self.port = port
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                                    lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> "SSEServer":
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "SSE test server did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def stream(url: str, n: int = NUM_CHUNKS, **params: str) -> dict:
    """POST a streaming completion; arrival time (s after sending) of every `data:` line."""
    arrivals, lines = [], []
    with httpx.Client(timeout=30) as client:
        t0 = time.perf_counter()
        with client.stream("POST", url, params={"n": n, **params}, json={"prompt": "hi", "stream": True}) as response:
            assert response.status_code == 200, response.read()
            headers = response.headers
            for line in response.iter_lines():
                if line.startswith("data:"):
                    arrivals.append(time.perf_counter() - t0)
                    lines.append(line)
    return {"arrivals": arrivals, "lines": lines, "headers": headers}


def spread(arrivals: list[float]) -> dict:
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    return {"ttft": arrivals[0], "span": arrivals[-1] - arrivals[0], "median_gap": statistics.median(gaps),
            "spaced": sum(g > CHUNK_INTERVAL_S / 4 for g in gaps) / len(gaps)}


@pytest.fixture
def sse_router(nginx_router):
    from support.nginx import free_port

    port = free_port()
    cfg = make_config(server={"bind": "127.0.0.1", "port": port, "api_key_env": None},
                      hosts=[{"name": "local-a", "address": "local", "deploy_root": "/tmp/x"}],
                      router=nginx_router.router_config())
    with SSEServer(port, release="rel-c13"):
        nginx_router.start(cfg)
        yield cfg, nginx_router, f"http://127.0.0.1:{port}"


def test_c13_stream_through_rendered_nginx_is_not_buffered(sse_router):
    cfg, router, direct_url = sse_router
    assert router.test_config().returncode == 0
    for base in (direct_url, router.url):  # warm up: first-request costs are not what C13 is about
        stream(base + "/v1/completions", n=2)
    results: dict[str, dict] = {}

    def run(name: str, base: str) -> None:
        results[name] = stream(base + "/v1/completions")

    # Direct and through nginx at the same time, so both see the same machine load.
    threads = [threading.Thread(target=run, args=("direct", direct_url)),
               threading.Thread(target=run, args=("nginx", router.url))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    direct, proxied = results["direct"], results["nginx"]
    assert proxied["lines"] == direct["lines"]
    assert proxied["lines"][-1] == "data: [DONE]"
    assert len(proxied["lines"]) == NUM_CHUNKS + 1
    assert proxied["headers"]["content-type"].startswith("text/event-stream")
    assert "gzip" not in proxied["headers"].get("content-encoding", "")
    d, p = spread(direct["arrivals"]), spread(proxied["arrivals"])
    # TTFT through nginx within ~50 ms of direct (C13).
    assert p["ttft"] - d["ttft"] < 0.05, (d, p)
    # Chunks arrive spread out like the direct stream: no clumps at the end.
    assert p["span"] > 0.8 * d["span"] and p["span"] > NUM_CHUNKS * CHUNK_INTERVAL_S * 0.7, (d, p)
    assert p["spaced"] > 0.8 and p["median_gap"] > CHUNK_INTERVAL_S / 2, (d, p)
    # The JSON access log line carries the upstream and the release header.
    entry = router.wait_entries(0, lambda es: any(e["release"] == "rel-c13" for e in es))[-1]
    assert entry["status"] == 200 and entry["upstream_addr"] == direct_url.removeprefix("http://")
    assert entry["release"] == "rel-c13" and isinstance(entry["request_time"], float)


def test_c13_control_buffering_proxy_clumps_the_stream(sse_router):
    """The measurement above detects the failure: the same stream through the rendered conf with gzip switched
    on for event streams and proxy buffering on (no X-Accel-Buffering from the server) arrives in one clump."""
    cfg, router, direct_url = sse_router
    text = router.upstream_conf.read_text()
    assert "proxy_buffering off;" in text and "gzip off;" in text
    bad = text.replace("proxy_buffering off;", "proxy_buffering on;")
    bad = bad.replace("gzip off;", "gzip on; gzip_types text/event-stream; gzip_min_length 0;")
    router.write_upstream(bad)
    router.reload()
    n = 50
    out = stream(router.url + "/v1/completions", n=n, plain="1")
    s = spread(out["arrivals"])
    assert out["lines"][-1] == "data: [DONE]"
    assert s["span"] < n * CHUNK_INTERVAL_S * 0.3 and s["ttft"] > n * CHUNK_INTERVAL_S * 0.7, s
