"""Back-pressure under overload, and a soak with early disconnects (marked slow)."""
from __future__ import annotations

import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from .conftest import ServerProcess

FREE = "deployctl_runtime_num_free_blocks"
TOTAL = "deployctl_runtime_num_gpu_blocks"


def test_overload_gets_429_never_5xx_or_hangs(tiny_model, start_server):
    max_seqs, max_queued = 2, 2
    srv = start_server(["--model", str(tiny_model), "--max-model-len", "256", "--kv-cache-memory", "8MiB",
                        "--max-num-seqs", str(max_seqs), "--max-queued-requests", str(max_queued)],
                       env={"DEPLOYCTL_RUNTIME_FAULT": "token_delay_ms=10"})
    clients = 4 * (max_seqs + max_queued)

    def one(i: int) -> httpx.Response:
        return httpx.post(srv.url + "/v1/completions", json={"prompt": f"client {i}", "max_tokens": 24,
                                                             "ignore_eos": True}, timeout=60)

    with ThreadPoolExecutor(clients) as pool:
        results = list(pool.map(one, range(clients)))
    codes = [r.status_code for r in results]
    assert set(codes) <= {200, 429}, codes
    rejected = [r for r in results if r.status_code == 429]
    assert rejected and codes.count(200) >= max_seqs + max_queued
    for r in rejected:
        assert int(r.headers["retry-after"]) >= 1 and r.json()["error"]["code"] == "queue_full"
    assert all(r.json()["usage"]["completion_tokens"] == 24 for r in results if r.status_code == 200)
    m = srv.wait_metrics(lambda m: m[FREE] == m[TOTAL])
    assert m[FREE] == m[TOTAL]
    assert m['deployctl_runtime_request_rejected_total{reason="queue_full"}'] == len(rejected)


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("VmRSS:"))


@pytest.mark.slow
def test_soak_concurrency_16_with_early_disconnects(tiny_model):
    total, concurrency, warm_up = int(os.environ.get("SOAK_N", 500)), 16, 60
    srv = ServerProcess(["--model", str(tiny_model), "--max-model-len", "512", "--kv-cache-memory", "16MiB",
                         "--max-num-seqs", "16", "--max-queued-requests", "64"]).wait_ready()
    try:
        rng = random.Random(1234)
        words = "the quick brown fox jumps over the lazy dog 聪明 😊 ďábel".split()
        jobs = [(" ".join(rng.choice(words) for _ in range(rng.randint(1, 120))), rng.randint(1, 48),
                 rng.random() < 0.5, rng.random() < 0.10) for _ in range(total)]
        statuses: list[int] = []
        clients: list[httpx.Client] = []
        rss: dict[str, int] = {}

        local = threading.local()

        def run(job) -> int:
            prompt, max_tokens, stream, disconnect = job
            body = {"prompt": prompt, "max_tokens": max_tokens, "stream": stream or disconnect,
                    "temperature": 0.8}
            if not hasattr(local, "client"):
                local.client = httpx.Client(timeout=60)
                clients.append(local.client)
            with local.client.stream("POST", srv.url + "/v1/completions", json=body) as r:
                if disconnect:  # go away after the first chunk: the connection is closed, not reused
                    next(r.iter_raw(), None)
                    return r.status_code
                r.read()
                return r.status_code

        with ThreadPoolExecutor(concurrency) as pool:
            for i, code in enumerate(pool.map(run, jobs)):
                statuses.append(code)
                if i == warm_up:
                    rss["after_warm_up"] = _rss_bytes(srv.proc.pid)
        for c in clients:
            c.close()
        assert all(code < 500 for code in statuses), sorted(set(statuses))
        assert statuses.count(200) == total
        m = srv.wait_metrics(lambda m: m[FREE] == m[TOTAL] and m["deployctl_runtime_num_requests_running"] == 0)
        assert m["deployctl_runtime_kv_cache_usage_ratio"] == 0
        assert m[FREE] == m[TOTAL] and m["deployctl_runtime_num_requests_running"] == 0
        assert m["deployctl_runtime_num_requests_waiting"] == 0
        end_rss = _rss_bytes(srv.proc.pid)
        with open(f"/proc/{srv.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        print(f"soak: {total} requests; server cpu {(int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK'):.1f} s,"
              f" test cpu {sum(os.times()[:2]):.1f} s, rss {rss['after_warm_up'] >> 20} -> {end_rss >> 20} MiB")
        assert end_rss < 1.10 * rss["after_warm_up"], (end_rss, rss)
        assert m['deployctl_runtime_request_success_total{finish_reason="abort"}'] > 0
        assert "Traceback" not in srv.log
    finally:
        assert srv.stop() == 0
