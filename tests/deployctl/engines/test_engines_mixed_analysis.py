"""Canary analysis on a mixed fleet (stable on one engine, canary on another): each side's metrics are read with its
own engine adapter, and latency falls back to the active probes when one side's engine exports no metrics.

Real HTTP: each host is a small server on loopback standing in for an engine (its /metrics in that engine's metric
names, a streaming chat route); scrapes go through the host layer's HTTP probe as in a deploy; the router's
access log is given as nginx writes it (JSON lines)."""
from __future__ import annotations

import http.server
import json
import threading
import time

import pytest

from deployctl.config import parse_config
from deployctl.engines import metric
from deployctl.hosts import Host
from deployctl.rollout.analysis import Analyzer

CHUNKS = (b'data: {"choices":[{"delta":{"content":"one"},"index":0}]}\n\n'
          b'data: {"choices":[{"delta":{"content":" two"},"index":0}]}\n\n'
          b'data: {"choices":[{"delta":{},"index":0,"finish_reason":"length"}],'
          b'"usage":{"completion_tokens":2,"prompt_tokens":3}}\n\ndata: [DONE]\n\n')


def _ttft_histogram(name: str, count: int, slow: bool) -> str:
    """A TTFT histogram with ``count`` observations, all under 50 ms (fast) or between 1 and 2.5 s (slow)."""
    fast_n = 0 if slow else count
    return (f"# TYPE {name} histogram\n{name}_bucket{{le=\"0.05\"}} {fast_n}\n{name}_bucket{{le=\"1.0\"}} {fast_n}\n"
            f"{name}_bucket{{le=\"2.5\"}} {count}\n{name}_bucket{{le=\"+Inf\"}} {count}\n"
            f"{name}_sum {count * (1.5 if slow else 0.02)}\n{name}_count {count}\n")


class Engine:
    """A stand-in engine on loopback: GET /metrics answers ``self.metrics`` (404 when None), POST streams two tokens
    after ``self.delay_s``. ``self.hits`` counts requests per path."""

    def __init__(self):
        self.metrics, self.delay_s, self.hits = None, 0.0, {}
        eng = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                eng.hits[self.path] = eng.hits.get(self.path, 0) + 1
                body = (eng.metrics or "").encode()
                self.send_response(200 if eng.metrics is not None else 404)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                eng.hits[self.path] = eng.hits.get(self.path, 0) + 1
                self.rfile.read(int(self.headers.get("content-length") or 0))
                time.sleep(eng.delay_s)
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("content-length", str(len(CHUNKS)))
                self.end_headers()
                self.wfile.write(CHUNKS)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


class AccessLog:
    """The router as analysis reads it: nginx's JSON access log lines for ``n`` requests per port."""

    def __init__(self, ports: list[int], n: int):
        self.text = "".join(json.dumps({"upstream_addr": f"127.0.0.1:{p}", "upstream_status": "200", "status": 200})
                            + "\n" for p in ports for _ in range(n))

    def access_log_size(self) -> int:
        return 0

    def access_log_since(self, offset: int):
        return self.text, len(self.text)


@pytest.fixture
def fleet(tmp_path):
    engines = {"canary": Engine(), "stable": Engine()}

    def make(probes: dict):
        hosts = [{"name": n, "address": "local", "deploy_root": str(tmp_path / n), "launcher": "process",
                  "server_port": e.port} for n, e in engines.items()]
        doc = {"service": {"name": "svc"}, "model": {"path": str(tmp_path / "m"), "served_name": "m"},
               "engine": {"device": "cpu"}, "server": {"bind": "127.0.0.1"}, "hosts": hosts,
               "rollout": {"analysis": {"interval_s": 0.5, "min_requests": 5, "min_p99_delta_s": 0.1,
                                        "probes": probes}}}
        cfg = parse_config(json.dumps(doc))
        return cfg, {h.name: Host.from_config(h) for h in cfg.hosts}

    yield engines, make
    for e in engines.values():
        e.server.shutdown()


def test_each_side_is_read_with_its_own_engines_metric_names(fleet):
    engines, make = fleet
    cfg, hosts = make({"enabled": False})  # the verdict rests on the metrics alone
    canary_ttft, stable_ttft = metric("deployctl-runtime", "ttft"), metric("vllm", "ttft")
    assert canary_ttft != stable_ttft
    engines["canary"].metrics = _ttft_histogram(canary_ttft, 0, slow=True)
    engines["stable"].metrics = _ttft_histogram(stable_ttft, 0, slow=False)
    an = Analyzer(cfg, AccessLog([e.port for e in engines.values()], 20), hosts, ["canary"], ["stable"],
                  stable_kind="vllm")
    w = an.open_window()
    engines["canary"].metrics = _ttft_histogram(canary_ttft, 20, slow=True)
    engines["stable"].metrics = _ttft_histogram(stable_ttft, 20, slow=False)
    v = an.evaluate(w)
    an.close()
    # stable's P99 came from vllm:time_to_first_token_seconds (read with the runtime's name it would be absent and
    # the slow canary would pass unopposed)
    assert v.stable.ttft_count == 20 and v.stable.p99_ttft_s < 0.05, v.stable
    assert v.result == "fail" and "canary P99 TTFT" in v.reason and v.source == "metrics", v.reason


def test_latency_falls_back_to_probes_when_stables_engine_exports_no_metrics(fleet):
    engines, make = fleet
    cfg, hosts = make({"enabled": True, "requests": 4, "max_tokens": 2, "min_samples": 3, "timeout_s": 10})
    name = metric("deployctl-runtime", "ttft")
    engines["canary"].metrics = _ttft_histogram(name, 0, slow=False)
    engines["canary"].delay_s = 0.4  # the canary answers its first token 0.4 s late; stable (transformers) at once
    an = Analyzer(cfg, AccessLog([e.port for e in engines.values()], 20), hosts, ["canary"], ["stable"],
                  stable_kind="transformers")
    assert not an.metrics and an.canary_metrics
    w = an.open_window()
    engines["canary"].metrics = _ttft_histogram(name, 20, slow=False)
    end = time.monotonic() + 20
    while time.monotonic() < end and min(len(r) for r in w.probes.snapshot().values() or [[]]) < 4:
        time.sleep(0.1)
    v = an.evaluate(w)
    an.close()
    assert engines["stable"].hits.get("/metrics") is None  # transformers has no metrics route: never scraped
    assert engines["canary"].hits.get("/metrics", 0) >= 2  # the canary's own adapter: liveness from its /metrics
    # the router saw 20 error-free requests per side, which alone would pass: the probes judged latency
    assert v.result == "fail" and v.source == "probes" and "canary probe median TTFT" in v.reason, v.reason
