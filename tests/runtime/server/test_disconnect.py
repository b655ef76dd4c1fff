"""C07: a client that goes away stops its generation; its blocks are free within about a second."""
from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest

from .conftest import ServerProcess

RUNNING = "deployctl_runtime_num_requests_running"
WAITING = "deployctl_runtime_num_requests_waiting"
FREE = "deployctl_runtime_num_free_blocks"
TOTAL = "deployctl_runtime_num_gpu_blocks"
GEN = "deployctl_runtime_generation_tokens_total"


@pytest.fixture(scope="module")
def one_seq(tiny_model):
    # one running request at a time, so a second one waits behind the long one; slow steps make "long" long
    srv = ServerProcess(["--model", str(tiny_model), "--max-model-len", "2048", "--kv-cache-memory", "8MiB",
                         "--max-num-seqs", "1"], env={"DEPLOYCTL_RUNTIME_FAULT": "token_delay_ms=10"})
    try:
        yield srv.wait_ready()
    finally:
        srv.stop()


def _raw_request(srv: ServerProcess, body: dict, request_id: str) -> socket.socket:
    payload = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", srv.port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"X-Request-Id: " + request_id.encode() + b"\r\nContent-Length: " + str(len(payload)).encode() +
              b"\r\n\r\n" + payload)
    return s


@pytest.mark.parametrize("stream", [False, True], ids=["non-streaming", "streaming"])
def test_c07_disconnect_aborts_and_frees_blocks_within_a_second(one_seq, stream):
    srv = one_seq
    base = srv.metrics()
    rid = f"c07-{'s' if stream else 'n'}-{time.monotonic_ns()}"
    sock = _raw_request(srv, {"prompt": "tell me a long story", "max_tokens": 1900, "ignore_eos": True,
                              "stream": stream}, rid)
    if stream:
        sock.settimeout(10)
        got = b""
        while got.count(b"data: ") < 3:  # a few chunks arrive, then the client goes away
            got += sock.recv(4096)
    queued: dict = {}

    def small() -> None:
        t0 = time.monotonic()
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 3}, timeout=60)
        queued.update(status=r.status_code, done=time.monotonic(), took=time.monotonic() - t0)

    t = threading.Thread(target=small)
    t.start()
    m = srv.wait_metrics(lambda m: m[RUNNING] == 1 and m[WAITING] == 1, timeout=5)
    assert (m[RUNNING], m[WAITING]) == (1, 1)  # the long one runs, the small one waits behind it
    time.sleep(1.0 if not stream else 0.2)
    assert srv.metrics()[FREE] < base[FREE]
    closed_at = time.monotonic()
    sock.close()
    t.join(30)
    assert queued["status"] == 200
    assert queued["done"] - closed_at < 2.0  # the queued request was admitted and served right after the abort
    m = srv.wait_metrics(lambda m: m[RUNNING] == 0 and m[FREE] == m[TOTAL], timeout=1.0)
    assert m[RUNNING] == 0 and m[WAITING] == 0 and m[FREE] == m[TOTAL]
    gen = m[GEN]
    time.sleep(0.5)
    assert srv.metrics()[GEN] == gen  # the token counter stopped
    line = next(ln for ln in srv.lines if rid in ln and "client disconnected" in ln)
    assert " INFO " in line and "Traceback" not in srv.log
