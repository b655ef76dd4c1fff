"""Start-up, readiness (C10), failed starts, model verification, config file, faults, request timeout, drain."""
from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from .conftest import RUNTIME_DIR, ServerProcess

ONE_TOKEN = {"prompt": "hi", "max_tokens": 1}


def test_c10_port_answers_at_once_and_ready_only_after_warm_up(tiny_model, start_server):
    srv = start_server(["--model", str(tiny_model), "--max-model-len", "128", "--kv-cache-memory", "8MiB"],
                       env={"DEPLOYCTL_RUNTIME_FAULT": "load_delay_s=3"}, ready=False)
    srv.wait_port()
    seen_loading = 0
    ready_at = None
    after_ready = []
    deadline = time.monotonic() + 90
    with httpx.Client(base_url=srv.url, timeout=10) as c:
        while time.monotonic() < deadline and len(after_ready) < 5:
            health, ready, models = c.get("/healthz"), c.get("/readyz"), c.get("/v1/models")
            comp = c.post("/v1/completions", json=ONE_TOKEN)
            assert health.status_code == 200  # liveness from the first moment the port answers
            if ready.status_code == 503 and ready_at is None:
                seen_loading += 1
                assert ready.json()["status"] == "loading" and ready.headers["retry-after"]
                for r in (models, comp):
                    assert r.status_code in (503, 200) and (r.status_code == 200 or r.headers["retry-after"])
                    if r.status_code == 503:
                        assert r.json()["error"]["code"] == "not_ready"
            else:
                assert ready.status_code == 200 and ready.json()["status"] == "ready"
                if ready_at is None:
                    ready_at = time.monotonic()
                after_ready.append(comp)
            time.sleep(0.2)
    assert seen_loading >= 5, "the port should answer during the (injected) 3 s load"
    assert ready_at is not None, srv.log
    assert [r.status_code for r in after_ready] == [200] * 5  # no inference fails after ready
    assert all(r.json()["usage"]["completion_tokens"] == 1 for r in after_ready)
    log = srv.log  # the engine logs the KV pool and the warm-up before the server declares itself ready
    assert log.index("KV cache") < log.index("warm-up") < log.index("ready: serving model")
    assert "max concurrency" in log


def test_fail_start_exits_non_zero_with_a_clear_line(tiny_model, start_server):
    srv = start_server(["--model", str(tiny_model)], env={"DEPLOYCTL_RUNTIME_FAULT": "fail_start=1"}, ready=False)
    assert srv.proc.wait(60) != 0
    assert "failed to start: fault injection: fail_start" in srv.log and "Traceback" not in srv.log


def _serve_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "deployctl_runtime", "serve", *args]


def _env(**extra):
    import os

    env = {**os.environ, **extra}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(RUNTIME_DIR), env.get("PYTHONPATH", "")) if p)
    env.pop("DEPLOYCTL_RUNTIME_API_KEY", None)
    return env


def test_refuses_non_loopback_address_without_a_key(tiny_model):
    r = subprocess.run(_serve_cmd("--model", str(tiny_model), "--host", "0.0.0.0", "--port", "0"),
                       capture_output=True, text=True, timeout=60, env=_env())
    assert r.returncode != 0
    assert "refusing to bind 0.0.0.0 without an API key" in r.stderr + r.stdout


def test_bad_config_key_is_a_one_line_error(tiny_model, tmp_path):
    cfg = tmp_path / "runtime.yaml"
    cfg.write_text(f"model: {tiny_model}\nmax_model_lenn: 128\n")
    r = subprocess.run(_serve_cmd("--config", str(cfg)), capture_output=True, text=True, timeout=60, env=_env())
    assert r.returncode == 2 and "max_model_lenn" in r.stderr and "Traceback" not in r.stderr


def test_corrupt_weights_refuse_to_start_unless_skip_verify(tiny_model, tmp_path, start_server):
    bad = tmp_path / "bad-model"
    shutil.copytree(tiny_model, bad)
    weights = bad / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) * 3 // 4] ^= 0x01  # same size, one bit flipped deep inside
    weights.write_bytes(bytes(data))
    srv = start_server(["--model", str(bad)], ready=False)
    assert srv.proc.wait(60) == 1
    assert f"model file {weights} fails verification" in srv.log and "expected sha256" in srv.log
    ok = start_server(["--model", str(bad), "--skip-verify", "--kv-cache-memory", "8MiB"])
    assert httpx.post(ok.url + "/v1/completions", json=ONE_TOKEN, timeout=30).status_code == 200


def test_yaml_config_flags_win_faults_and_public_metrics(tiny_model, tmp_path, start_server):
    cfg = tmp_path / "runtime.yaml"
    cfg.write_text(f"model: {tiny_model}\nmax_model_len: 96\nserved_model_name: from-yaml\nrelease_id: r-42\n"
                   "metrics_public: true\nkv_cache_memory: 8MiB\n")
    srv = start_server(["--config", str(cfg), "--served-model-name", "from-flag"],
                       env={"DEPLOYCTL_RUNTIME_API_KEY": "s3cret-key", "DEPLOYCTL_RUNTIME_FAULT": "error_rate=1.0"},
                       key="s3cret-key")
    auth = {"Authorization": "Bearer s3cret-key"}
    models = httpx.get(srv.url + "/v1/models", headers=auth).json()["data"][0]
    assert models["id"] == "from-flag" and models["max_model_len"] == 96
    assert httpx.get(srv.url + "/readyz").json()["release"] == "r-42"
    assert httpx.get(srv.url + "/metrics").status_code == 200  # metrics_public from the YAML file
    r = httpx.post(srv.url + "/v1/completions", json=ONE_TOKEN, headers=auth, timeout=30)
    assert r.status_code == 500 and r.json()["error"]["type"] == "internal_error"
    assert r.headers["x-deployctl-release"] == "r-42"
    assert "s3cret-key" not in srv.log


def _stream_lines(url: str, body: dict, out: list, started: threading.Event) -> None:
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
        out.append(r.status_code)
        for line in r.iter_lines():
            if line:
                out.append(line)
                started.set()
    started.set()


def test_request_timeout_then_sigterm_drain(tiny_model, start_server):
    srv = start_server(["--model", str(tiny_model), "--max-model-len", "2048", "--kv-cache-memory", "8MiB",
                        "--request-timeout-s", "5", "--drain-timeout-s", "20"],
                       env={"DEPLOYCTL_RUNTIME_FAULT": "token_delay_ms=20"})
    long = {"prompt": "hello", "max_tokens": 1000, "ignore_eos": True}
    lines: list = []
    stream = threading.Thread(target=_stream_lines, args=(srv.url, {**long, "stream": True}, lines,
                                                          threading.Event()))
    stream.start()  # streaming and non-streaming time out side by side
    r = httpx.post(srv.url + "/v1/completions", json=long, timeout=30)
    stream.join(30)
    assert r.status_code == 504 and r.json()["error"]["code"] == "request_timeout"
    assert lines[0] == 200 and lines[-1] == "data: [DONE]"
    assert json.loads(lines[-3][6:])["choices"][0]["finish_reason"] == "error"
    assert json.loads(lines[-2][6:])["error"]["code"] == "request_timeout"
    m = srv.wait_metrics(lambda m: m["deployctl_runtime_num_requests_running"] == 0, timeout=1.0)
    assert m["deployctl_runtime_num_requests_running"] == 0
    assert m["deployctl_runtime_num_free_blocks"] == m["deployctl_runtime_num_gpu_blocks"]
    assert m['deployctl_runtime_request_success_total{finish_reason="error"}'] == 2

    # SIGTERM with a request in flight: readyz 503 at once, new requests 503, the in-flight one finishes, exit 0
    inflight: list = []
    started = threading.Event()
    t = threading.Thread(target=_stream_lines, args=(srv.url, {"prompt": "hi", "max_tokens": 60, "stream": True,
                                                               "ignore_eos": True}, inflight, started))
    t.start()
    assert started.wait(30)
    srv.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 2
    ready = httpx.get(srv.url + "/readyz", timeout=5)
    while ready.status_code == 200 and time.monotonic() < deadline:  # until the signal has been handled
        time.sleep(0.02)
        ready = httpx.get(srv.url + "/readyz", timeout=5)
    assert ready.status_code == 503 and ready.json()["status"] == "draining"
    new = httpx.post(srv.url + "/v1/completions", json=ONE_TOKEN, timeout=5)
    assert new.status_code == 503 and new.headers["retry-after"] and new.json()["error"]["code"] == "draining"
    t.join(30)
    assert inflight[-1] == "data: [DONE]", inflight[-3:]
    assert json.loads(inflight[-2][6:])["choices"][0]["finish_reason"] == "length", inflight[-3:]
    assert srv.proc.wait(30) == 0
    assert "drain complete" in srv.log


def test_drain_timeout_cuts_off_long_requests_and_exits_0(tiny_model, start_server):
    srv = start_server(["--model", str(tiny_model), "--max-model-len", "2048", "--kv-cache-memory", "8MiB",
                        "--drain-timeout-s", "1"], env={"DEPLOYCTL_RUNTIME_FAULT": "token_delay_ms=20"})
    lines: list = []
    started = threading.Event()
    t = threading.Thread(target=_stream_lines, args=(srv.url, {"prompt": "hi", "max_tokens": 1900, "stream": True,
                                                               "ignore_eos": True}, lines, started), daemon=True)
    t.start()
    assert started.wait(30)
    t0 = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    assert srv.proc.wait(30) == 0
    assert time.monotonic() - t0 < 1 + 3 + 5  # drain timeout + uvicorn's graceful close + slack
    assert "drain timeout" in srv.log
    t.join(10)
    assert not t.is_alive()  # the client is not left hanging: its stream ends well-formed
    assert lines[-1] == "data: [DONE]"
    assert json.loads(lines[-2][6:])["choices"][0]["finish_reason"] == "abort"


def test_drain_timeout_answers_requests_not_started_503_draining(tiny_model, start_server):
    # one request runs (--max-num-seqs 1), two wait in the queue when the drain ends: those were never generated,
    # so they get a retryable 503 draining (a stream: that error as its last event), not an empty 200 "abort"
    srv = start_server(["--model", str(tiny_model), "--max-model-len", "2048", "--kv-cache-memory", "8MiB",
                        "--max-num-seqs", "1", "--drain-timeout-s", "1"],
                       env={"DEPLOYCTL_RUNTIME_FAULT": "token_delay_ms=20"})
    running_lines: list = []
    started = threading.Event()
    body = {"prompt": "hi", "max_tokens": 1900, "ignore_eos": True}
    threading.Thread(target=_stream_lines, args=(srv.url, {**body, "stream": True}, running_lines, started),
                     daemon=True).start()
    assert started.wait(30)
    queued: dict = {}
    queued_lines: list = []

    def whole():
        queued["r"] = httpx.post(srv.url + "/v1/completions", json=body, timeout=60)

    threads = [threading.Thread(target=whole, daemon=True),
               threading.Thread(target=_stream_lines, args=(srv.url, {**body, "stream": True}, queued_lines,
                                                             threading.Event()), daemon=True)]
    for t in threads:
        t.start()
    assert srv.wait_metrics(lambda m: m.get("deployctl_runtime_num_requests_waiting") == 2, timeout=10)[
        "deployctl_runtime_num_requests_waiting"] == 2
    srv.proc.send_signal(signal.SIGTERM)
    assert srv.proc.wait(30) == 0
    for t in threads:
        t.join(10)
    r = queued["r"]
    assert r.status_code == 503 and r.headers["retry-after"], r.text
    assert r.json()["error"]["code"] == "draining" and r.json()["error"]["type"] == "service_unavailable"
    assert queued_lines[0] == 200 and queued_lines[-1] == "data: [DONE]"
    assert [json.loads(x[6:])["error"]["code"] for x in queued_lines[1:-1]] == ["draining"]  # no empty choice
    assert json.loads(running_lines[-2][6:])["choices"][0]["finish_reason"] == "abort"  # it had started: 200
