"""Fault isolation through real HTTP (a real `serve` process, the test-only DEPLOYCTL_RUNTIME_FAULT forward faults):
one request whose forward raises fails alone with a 500 naming the error while three requests batched with it get
their solo answers; a sticky CUDA error fails the open requests and ends the process with exit 3, /readyz's status
code agreeing with its body all along."""
from __future__ import annotations

import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

POISON = 7  # the forward raises whenever its batch holds this token id
CLEAN = [list(range(100, 120)), list(range(200, 205)), list(range(300, 340))]
BAD = [50, 51, POISON, 52]
ARGS = ["--max-model-len", "256", "--num-gpu-blocks-override", "64", "--max-num-seqs", "8"]


def _complete(srv, prompt, max_tokens=12, **extra):
    return httpx.post(srv.url + "/v1/completions", timeout=60,
                      json={"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
                            "return_token_ids": True, **extra})


def _answer(r) -> tuple[str, list[int]]:
    assert r.status_code == 200, r.text
    ch = r.json()["choices"][0]
    return ch["text"], ch["token_ids"]


def test_a_poisoned_request_among_three_fails_alone_and_the_server_goes_on(start_server, tiny_model):
    # 40 ms per step: the four requests overlap, so the poisoned prefill shares its forward with the others
    srv = start_server(["--model", str(tiny_model), *ARGS],
                       env={"DEPLOYCTL_RUNTIME_FAULT": f"raise_on_token={POISON},token_delay_ms=40"})
    solo = [_answer(_complete(srv, p)) for p in CLEAN]
    assert all(POISON not in ids for _, ids in solo)
    barrier = threading.Barrier(4)

    def send(prompt):
        barrier.wait()
        return _complete(srv, prompt)

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(send, [CLEAN[0], BAD, CLEAN[1], CLEAN[2]]))
    bad = results.pop(1)
    assert [_answer(r) for r in results] == solo
    assert bad.status_code == 500, bad.text
    err = bad.json()["error"]
    assert err["type"] == "internal_error" and err["code"] == "engine_error"
    assert "RuntimeError" in err["message"] and f"raise_on_token={POISON}" in err["message"]
    # still serving, still ready, and the isolated error is counted
    assert _answer(_complete(srv, CLEAN[0])) == solo[0]
    ready = httpx.get(srv.url + "/readyz", timeout=10)
    assert ready.status_code == 200 and ready.json()["status"] == "ready"
    m = srv.metrics()
    assert m['deployctl_runtime_engine_errors_total{kind="isolated"}'] == 1
    assert m['deployctl_runtime_engine_errors_total{kind="fatal"}'] == 0
    assert srv.proc.poll() is None


def test_step_retries_are_bounded_per_step_and_counted(start_server, tiny_model):
    # a list of n prompts is added in one command, so its n engine requests share one prefill step: the poisoned one
    # (last: the halving's longest path) costs at most ceil(log2 n) + 1 extra forwards, counted in the metric
    srv = start_server(["--model", str(tiny_model), "--max-model-len", "256", "--num-gpu-blocks-override", "128",
                        "--max-num-seqs", "16"], env={"DEPLOYCTL_RUNTIME_FAULT": f"raise_on_token={POISON}"})
    name = "deployctl_runtime_step_retries_total"
    assert srv.metrics()[name] == 0
    total = 0
    for n, pos in ((2, 0), (5, 2), (9, 8), (16, 15), (16, 3)):
        prompts = [[100 + i, 101 + i, 102 + i] for i in range(n)]
        prompts[pos] = BAD
        r = _complete(srv, prompts, max_tokens=2)
        assert r.status_code == 500 and f"raise_on_token={POISON}" in r.json()["error"]["message"], r.text
        retries = srv.metrics()[name] - total
        assert 1 <= retries <= math.ceil(math.log2(n)) + 1, (n, pos, retries)
        total += retries
    assert total == srv.metrics()[name]
    assert _answer(_complete(srv, CLEAN[0]))  # still serving


def test_a_sticky_cuda_error_fails_open_requests_and_exits_3(start_server, tiny_model):
    srv = start_server(["--model", str(tiny_model), *ARGS],
                       env={"DEPLOYCTL_RUNTIME_FAULT": f"cuda_error_on_token={POISON},token_delay_ms=40"})
    assert _answer(_complete(srv, CLEAN[0], max_tokens=2))
    seen: list[tuple[int, str]] = []
    stop = threading.Event()

    def watch_readyz():
        while not stop.is_set():
            try:
                r = httpx.get(srv.url + "/readyz", timeout=5)
                seen.append((r.status_code, r.json()["status"]))
            except httpx.TransportError:
                return  # the process is gone
            time.sleep(0.01)

    watcher = threading.Thread(target=watch_readyz)
    watcher.start()
    with ThreadPoolExecutor(2) as pool:
        long_one = pool.submit(_complete, srv, CLEAN[2], 200)  # open while the device is poisoned
        time.sleep(0.5)
        bad = pool.submit(_complete, srv, BAD).result()
        long_r = long_one.result()
    t0 = time.monotonic()
    code = srv.proc.wait(20)
    elapsed = time.monotonic() - t0
    stop.set()
    watcher.join(10)
    assert code == 3, srv.log
    assert elapsed < 10, elapsed
    for r in (bad, long_r):
        assert r.status_code == 500, r.text
        assert "CUDA error: an illegal memory access" in r.json()["error"]["message"]
    assert "the engine died" in srv.log and "exiting 3" in srv.log
    assert seen and seen[0] == (200, "ready")
    assert all((status == 200) == (body == "ready") for status, body in seen), seen


def test_repeated_isolated_errors_in_the_window_end_the_process(start_server, tiny_model):
    # one bad request is isolated; the second within the window (--fatal-after-errors 2) means more than one
    # request is wrong: the engine is declared dead and the process exits 3 to be restarted
    srv = start_server(["--model", str(tiny_model), *ARGS, "--fatal-after-errors", "2", "--fatal-error-window-s",
                        "600"], env={"DEPLOYCTL_RUNTIME_FAULT": f"raise_on_token={POISON}"})
    first = _complete(srv, BAD)
    assert first.status_code == 500 and srv.proc.poll() is None
    assert httpx.get(srv.url + "/readyz", timeout=10).status_code == 200
    second = _complete(srv, BAD)
    assert second.status_code == 500, second.text
    assert srv.proc.wait(20) == 3, srv.log
    assert "2 requests failed alone within 600 s" in srv.log


def test_non_finite_logits_count_as_isolated_errors_and_k_of_them_end_the_process(start_server,
                                                                                  overflow_token_model):
    # every kind of error that fails a request alone goes through one count: the metric and the K-in-a-window
    # rule. Non-finite logits used to fail the request without either, so a model overflowing on most prompts
    # stayed in rotation answering 500s.
    from .conftest import OVERFLOW_TOKEN

    srv = start_server(["--model", str(overflow_token_model), *ARGS, "--fatal-after-errors", "2",
                        "--fatal-error-window-s", "600"])
    first = _complete(srv, [5, OVERFLOW_TOKEN, 7])
    assert first.status_code == 500 and first.json()["error"]["code"] == "non_finite_logits", first.text
    m = srv.wait_metrics(lambda m: m['deployctl_runtime_engine_errors_total{kind="isolated"}'] == 1)
    assert m['deployctl_runtime_engine_errors_total{kind="isolated"}'] == 1
    assert m['deployctl_runtime_engine_errors_total{kind="fatal"}'] == 0
    assert httpx.get(srv.url + "/readyz", timeout=10).status_code == 200
    assert _answer(_complete(srv, CLEAN[0]))  # a clean request is served between them
    second = _complete(srv, [OVERFLOW_TOKEN])
    assert second.status_code == 500, second.text
    assert srv.proc.wait(20) == 3, srv.log
    assert "2 requests failed alone within 600 s" in srv.log and "non-finite logits" in srv.log


def test_a_request_the_server_fails_alone_counts_as_the_engines_own(tiny_model):
    # the detokenizer runs in the server, not the engine: its failures are reported to the one count
    # (AsyncEngine._count_isolated) and end the engine at K within the window, as the engine's own do
    from deployctl_runtime.engine import LLMEngine
    from deployctl_runtime.engine_args import EngineArgs
    from deployctl_runtime.server.async_engine import AsyncEngine

    engine = LLMEngine.from_engine_args(EngineArgs(model=str(tiny_model), max_model_len=128,
                                                   num_gpu_blocks_override=16))
    kinds, messages, died = [], [], threading.Event()
    aeng = AsyncEngine(engine, on_error=kinds.append, on_fatal=lambda m: (messages.append(m), died.set()),
                       max_isolated_errors=2, isolated_error_window_s=600)
    aeng.start()
    try:
        aeng.report_isolated("detokenizing the output raised: ValueError: first")
        deadline = time.monotonic() + 5
        while kinds != ["isolated"] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert kinds == ["isolated"] and aeng.is_alive
        aeng.report_isolated("detokenizing the output raised: ValueError: second")
        assert died.wait(5)
        assert kinds == ["isolated", "isolated", "fatal"] and not aeng.is_alive
        assert "2 requests failed alone within 600 s" in messages[0] and "ValueError: second" in messages[0]
    finally:
        aeng.shutdown()
