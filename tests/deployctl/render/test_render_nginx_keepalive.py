"""SSE and keep-alive through the router (issue 21): the runtime on CPU with the tiny model, configured by the
runtime.yaml deployctl renders, behind a real nginx running the rendered upstream config.

- A stream queued behind a long request for longer than nginx's proxy_read_timeout (lowered to 2 s in this test's
  nginx; rendered, it is request_timeout_s + 30 s) still completes: the runtime sends ``: keep-alive`` comments
  every server.sse_keepalive_s (0.5 s here) while it waits; the official openai client ignores them.
- 200 requests through nginx with idle gaps around both idle timeouts (nginx's upstream keepalive_timeout 0.4 s
  from router.keepalive_timeout_s, the runtime's keep_alive_timeout_s rendered from it as 0.65 s): no 502, since
  nginx drops an idle connection before the runtime closes it (deployctl.engines.keepalive). Timeouts are scaled
  from 60 s / 75 s to keep the test short; 8 clients each send their requests one after another.
"""
from __future__ import annotations

import re
import threading
import time
from collections import Counter

import httpx
import openai
import pytest
import yaml

from deployctl.engines.keepalive import engine_timeout_for, keepalive
from deployctl.render.release import render_nginx, runtime_args
from support.nginx import NginxRouter
from support.render import make_config
from support.runtime import serve_runtime

READ_TIMEOUT_S = 2
GAPS_S = (0.3, 0.45, 0.55, 0.62, 0.66, 0.7, 0.8)  # around nginx's 0.4 s and the runtime's 0.65 s


def _cfg(model, router: dict, port: int = 8000):
    return make_config(
        model={"path": str(model), "served_name": "tiny", "dtype": "float32"},
        engine={"device": "cpu", "max_model_len": 256, "max_num_seqs": 1, "max_num_batched_tokens": 256,
                "kv_cache_memory": "8MiB"},
        server={"bind": "127.0.0.1", "api_key_env": None, "request_timeout_s": 30, "sse_keepalive_s": 0.5},
        hosts=[{"name": "h", "address": "local", "deploy_root": "/tmp/unused", "server_port": port}],
        router={**router, "keepalive_timeout_s": 0.4})


@pytest.fixture(scope="module")
def routed(tmp_path_factory, rollout_model):
    """(NginxRouter, runtime.yaml values, rendered upstream conf) for one runtime behind one nginx."""
    root = tmp_path_factory.mktemp("keepalive")
    nginx = NginxRouter(root / "nginx")
    cfg = _cfg(rollout_model, nginx.router_config())
    args = runtime_args(cfg, cfg.hosts[0], "r1")
    (root / "runtime.yaml").write_text(yaml.safe_dump(args))
    fault = {"DEPLOYCTL_RUNTIME_FAULT": "token_delay_ms=60"}  # 60 ms per engine step: a long request takes seconds
    with serve_runtime(rollout_model, root / "runtime.log", "--config", str(root / "runtime.yaml"), env=fault) as url:
        cfg = _cfg(rollout_model, nginx.router_config(), port=int(url.rsplit(":", 1)[1]))
        conf = render_nginx(cfg, stable=list(cfg.hosts), canary=[], canary_weight=0)
        low = re.sub(r"proxy_read_timeout \d+s;", f"proxy_read_timeout {READ_TIMEOUT_S}s;", conf)
        assert low != conf
        nginx.start(cfg, upstream_text=low)
        try:
            yield nginx, args, conf
        finally:
            nginx.stop()


def test_rendered_timeouts_keep_the_runtime_longer_than_nginx(routed):
    _, args, conf = routed
    assert "keepalive_timeout 400ms;" in conf
    assert args["keep_alive_timeout_s"] == pytest.approx(0.65) and args["sse_keepalive_s"] == 0.5
    # the runtime's own default is what deployctl renders behind nginx's default 60 s
    from deployctl_runtime.server.config import ServeConfig

    assert ServeConfig.model_fields["keep_alive_timeout_s"].default == engine_timeout_for(60) == 75
    assert keepalive(make_config()).engine_s == 75


def test_stream_queued_past_proxy_read_timeout_still_completes(routed):
    url = routed[0].url
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "temperature": 0}
    out: dict = {}

    def long_one():  # a stream of 60 engine steps of 60 ms: holds the only seat (max_num_seqs 1) for > 3 s
        with httpx.stream("POST", url + "/v1/chat/completions", timeout=60,
                          json={**chat, "max_tokens": 60, "ignore_eos": True, "stream": True}) as r:
            out["long"] = (r.status_code, [x for x in r.iter_lines() if x][-1])

    def raw():
        t0 = time.monotonic()
        lines = []
        with httpx.stream("POST", url + "/v1/chat/completions", timeout=60,
                          json={**chat, "max_tokens": 3, "stream": True}) as r:
            out["raw_status"] = r.status_code
            lines = [x for x in r.iter_lines() if x]
        out["raw"] = (time.monotonic() - t0, lines)

    def official():
        t0 = time.monotonic()
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
        chunks = list(client.chat.completions.create(**chat, max_tokens=3, stream=True))
        out["openai"] = (time.monotonic() - t0, chunks)

    first = threading.Thread(target=long_one)
    first.start()
    time.sleep(0.5)  # the long request is running; the next two wait in the queue
    waiting = [threading.Thread(target=raw), threading.Thread(target=official)]
    for t in waiting:
        t.start()
    for t in (first, *waiting):
        t.join(90)
    assert out.get("long") == (200, "data: [DONE]")
    waited, lines = out["raw"]
    assert out["raw_status"] == 200 and waited > READ_TIMEOUT_S, (waited, lines)
    assert ": keep-alive" in lines  # what kept nginx reading
    assert lines[-1] == "data: [DONE]" and sum(line.startswith("data: {") for line in lines) >= 2, lines
    waited, chunks = out["openai"]
    assert waited > READ_TIMEOUT_S and chunks and chunks[-1].choices[0].finish_reason == "length"


def test_requests_after_idle_gaps_around_both_keepalive_timeouts_get_no_502(routed):
    nginx = routed[0]
    url, seen = nginx.url, len(nginx.access_entries())
    statuses: Counter = Counter()
    lock = threading.Lock()

    def client(i: int):
        with httpx.Client(base_url=url, timeout=30) as c:
            for n in range(25):
                r = c.get("/v1/models")
                with lock:
                    statuses[r.status_code] += 1
                time.sleep(GAPS_S[(i + n) % len(GAPS_S)])

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert statuses == Counter({200: 200}), statuses
    # and none needed nginx's silent second try after a cached connection failed (nginx retries one: an
    # upstream_status of "502, 200"): every request went out once, on a connection the runtime kept open
    tries = Counter(e["upstream_status"] for e in nginx.wait_entries(seen, lambda es: len(es) >= 200) if e["uri"] == "/v1/models")
    assert tries == Counter({"200": 200}), tries


def test_sse_keepalive_at_or_above_the_request_timeout_is_refused(tmp_path):
    import subprocess
    import sys

    from support.render import write_config

    cfg = write_config(tmp_path / "deploy.yaml", server={"request_timeout_s": 10, "sse_keepalive_s": 10})
    r = subprocess.run([sys.executable, "-m", "deployctl", "render", "--out", str(tmp_path / "out"), "-c", str(cfg)],
                       capture_output=True, text=True, timeout=60)
    err = r.stderr.strip()
    assert r.returncode == 3 and len(err.splitlines()) == 1, err
    assert "server.sse_keepalive_s 10 is not below server.request_timeout_s 10" in err and "or 0 to turn it off" in err


def test_a_mixed_fleet_gets_the_keepalive_every_engine_behind_the_router_needs():
    """Stable on transformers serve (uvicorn's fixed 5 s) while the canary runs the bundled runtime: one upstream
    block serves both, so nginx's keepalive_timeout is transformers' 4 s, not the runtime's 60 s; the runtime's own
    timeout is unchanged (still longer than nginx's)."""
    cfg = make_config(hosts=[{"name": "a", "address": "local", "deploy_root": "/tmp/unused", "server_port": 8001},
                             {"name": "b", "address": "local", "deploy_root": "/tmp/unused", "server_port": 8002}],
                      router={"host": "local", "listen": 8080, "upstream_conf": "/tmp/unused/llm.conf"})
    a, b = cfg.hosts
    alone = render_nginx(cfg, stable=[a], canary=[b], canary_weight=5)
    mixed = render_nginx(cfg, stable=[a], canary=[b], canary_weight=5, engines=frozenset({"transformers"}))
    assert "keepalive_timeout 60s;" in alone and "keepalive_timeout 4s;" in mixed
    assert keepalive(cfg, also={"transformers"}).engine_s == keepalive(cfg).engine_s == 75
    assert keepalive(cfg, also={"vllm"}).nginx_s == 60  # an engine whose timeout deployctl sets lowers nothing
