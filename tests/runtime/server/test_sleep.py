"""Sleep and wake of the bundled runtime (runtime/deployctl_runtime/server/sleep.py), real server processes on CPU
and the real openai client; the GPU's memory is the stand-in ledger (gpu_ledger.py, DEPLOYCTL_FAKE_GPU_MEMORY)."""
from __future__ import annotations

import fcntl
import json
import re
import threading
import time

import httpx
import openai
import pytest

from deployctl_runtime.gpu_ledger import usage

KEY = "sk-sleep-test-0123456789"
ARGS = ["--max-model-len", "256", "--kv-cache-memory", "2MiB", "--served-model-name", "tiny"]
PROMPTS = ["The capital of France is", "1 2 3 4 5", "Once upon a time"]


def _client(srv) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key=KEY, max_retries=0, timeout=60)


def _greedy(client) -> list[str]:
    return [client.completions.create(model="tiny", prompt=p, max_tokens=12, temperature=0).choices[0].text
            for p in PROMPTS]


def _greedy_chat(client) -> list[list[str]]:
    """Each prompt's greedy chat answer, token for token (the tokens of its logprobs)."""
    out = []
    for p in PROMPTS:
        r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": p}], max_tokens=12,
                                           temperature=0, logprobs=True, extra_body={"ignore_eos": True})
        out.append([t.token for t in r.choices[0].logprobs.content])
    return out


def _post(srv, path: str, key: str | None = KEY) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(srv.url + path, headers=headers, timeout=60)


def test_sleep_then_wake_answers_the_same_and_says_so_everywhere(start_server, tiny_model):
    srv = start_server(["--model", str(tiny_model), *ARGS], env={"DEPLOYCTL_RUNTIME_API_KEY": KEY}, key=KEY)
    client = _client(srv)
    before, before_chat = _greedy(client), _greedy_chat(client)
    awake_pool = httpx.get(srv.url + "/readyz").json()["kv_cache"]
    assert awake_pool["released"] is False and awake_pool["num_blocks"] > 0
    m = srv.metrics()
    assert m["deployctl_runtime_num_gpu_blocks"] == awake_pool["num_blocks"]
    assert m["deployctl_runtime_num_free_blocks"] == awake_pool["num_blocks"]
    assert _post(srv, "/sleep?level=1", key=None).status_code == 401  # behind the API key like /v1
    assert _post(srv, "/sleep?level=2").status_code == 400
    r = _post(srv, "/sleep?level=1")
    assert r.status_code == 200 and r.json()["status"] == "sleeping" and r.json()["sleep_s"] >= 0, r.text
    assert r.json()["resident_bytes"] == {} and r.json()["resident_measured_by"] == "cpu"  # no device memory
    assert httpx.get(srv.url + "/is_sleeping", headers=srv.headers).json() == {
        "is_sleeping": True, "resident_bytes": {}, "resident_measured_by": "cpu"}
    ready = httpx.get(srv.url + "/readyz")
    assert ready.status_code == 503 and ready.json()["status"] == "sleeping"
    released = {**awake_pool, "num_blocks": 0, "num_tokens": 0, "num_free_blocks": 0, "usage": 0.0,
                "released": True}
    assert ready.json()["kv_cache"] == released  # the freed pool is not "present and free"
    health = httpx.get(srv.url + "/healthz")
    assert health.status_code == 200  # alive: no supervisor restarts a sleeper
    assert health.json()["kv_cache"] == released
    with pytest.raises(openai.APIStatusError) as err:
        client.completions.create(model="tiny", prompt="hi", max_tokens=2)
    assert err.value.status_code == 503 and err.value.body["code"] == "sleeping"
    with pytest.raises(openai.APIStatusError) as err:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert err.value.status_code == 503
    m = srv.metrics()
    assert m["deployctl_runtime_is_sleeping"] == 1.0
    assert m["deployctl_runtime_num_gpu_blocks"] == 0 and m["deployctl_runtime_num_free_blocks"] == 0
    assert m["deployctl_runtime_kv_cache_usage_ratio"] == 0
    assert m['deployctl_runtime_request_rejected_total{reason="sleeping"}'] >= 2
    assert _post(srv, "/sleep?level=1").status_code == 200  # idempotent
    w = _post(srv, "/wake_up")
    assert w.status_code == 200 and w.json()["status"] == "awake" and w.json()["wake_s"] >= 0, w.text
    assert httpx.get(srv.url + "/is_sleeping", headers=srv.headers).json()["is_sleeping"] is False
    ready = httpx.get(srv.url + "/readyz")
    assert ready.status_code == 200 and ready.json()["kv_cache"]["released"] is False
    assert ready.json()["kv_cache"]["num_blocks"] == awake_pool["num_blocks"]
    m = srv.metrics()
    assert m["deployctl_runtime_num_gpu_blocks"] == awake_pool["num_blocks"] > 0
    assert m["deployctl_runtime_num_free_blocks"] == awake_pool["num_blocks"]
    assert _greedy(client) == before  # same weights, same greedy answers
    assert _greedy_chat(client) == before_chat  # token for token
    assert srv.metrics()["deployctl_runtime_is_sleeping"] == 0.0
    assert re.search(r"sleep \(level 1\): KV cache freed in [0-9.]+ s", srv.log)
    assert re.search(r"wake: weights on cpu, KV cache re-allocated \(\d+ blocks, prefix cache empty\) in [0-9.]+ s",
                     srv.log)


def test_sleep_with_a_request_in_flight_is_refused_409(start_server, tiny_model):
    srv = start_server(["--model", str(tiny_model), *ARGS], key=KEY,
                       env={"DEPLOYCTL_RUNTIME_API_KEY": KEY, "DEPLOYCTL_RUNTIME_FAULT": "token_delay_ms=100"})
    done = threading.Event()

    def slow():
        _client(srv).completions.create(model="tiny", prompt="hello", max_tokens=30, temperature=0,
                                        extra_body={"ignore_eos": True})
        done.set()

    t = threading.Thread(target=slow)
    t.start()
    srv.wait_metrics(lambda m: m.get("deployctl_runtime_num_requests_running", 0) >= 1, timeout=20)
    r = _post(srv, "/sleep?level=1")
    assert r.status_code == 409 and r.json()["error"]["code"] == "requests_in_flight", r.text
    t.join(60)
    assert done.is_set()  # the request was not cut
    assert _post(srv, "/sleep?level=1").status_code == 200


def _write_ledger(path, total: int, residue: int) -> None:
    with open(str(path) + ".lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = json.loads(path.read_text()) if path.exists() else {"allocations": {}}
        data.update(total_bytes=total, residue_bytes=residue)
        path.write_text(json.dumps(data))
        fcntl.flock(lock, fcntl.LOCK_UN)


def test_fake_gpu_second_copy_ooms_a_sleeper_leaves_its_residue_and_a_wake_that_no_longer_fits_fails(
        start_server, tiny_model, tmp_path):
    ledger = tmp_path / "gpu.json"
    residue = 4096
    _write_ledger(ledger, 2**40, residue)
    env = {"DEPLOYCTL_RUNTIME_API_KEY": KEY, "DEPLOYCTL_FAKE_GPU_MEMORY": str(ledger)}
    a = start_server(["--model", str(tiny_model), *ARGS, "--release-id", "old"], env=env, key=KEY)
    held = usage(ledger)["allocations"][str(a.proc.pid)]
    full = held["bytes"]
    assert held["what"] == "weights+kv" and full > 0
    _write_ledger(ledger, full + full // 2, residue)  # one copy fits, two do not

    b = start_server(["--model", str(tiny_model), *ARGS, "--release-id", "new"], env=env, key=KEY, ready=False)
    assert b.proc.wait(120) == 1
    assert "CUDA out of memory (fake GPU" in b.log and f"pid {a.proc.pid} (weights+kv {full} bytes, old)" in b.log

    slept = _post(a, "/sleep?level=1")
    assert slept.status_code == 200
    assert slept.json()["resident_bytes"] == {"0": residue} and slept.json()["resident_measured_by"] == "ledger"
    u = usage(ledger)
    assert u["allocations"][str(a.proc.pid)] == {"bytes": residue, "what": "sleeping residue", "label": "old"}
    assert u["used_bytes"] == residue

    c = start_server(["--model", str(tiny_model), *ARGS, "--release-id", "new"], env=env, key=KEY)
    assert usage(ledger)["used_bytes"] == residue + full  # the sleeper's residue beside a full copy
    w = _post(a, "/wake_up")
    assert w.status_code == 503, w.text
    err = w.json()["error"]
    assert err["code"] == "gpu_memory_exhausted" and f"pid {c.proc.pid} (weights+kv {full} bytes, new)" in err["message"]
    assert httpx.get(a.url + "/is_sleeping", headers=a.headers).json() == {  # still a clean sleeper
        "is_sleeping": True, "resident_bytes": {"0": residue}, "resident_measured_by": "ledger"}
    assert c.stop() == 0
    deadline = time.monotonic() + 10
    while str(c.proc.pid) in usage(ledger)["allocations"] and time.monotonic() < deadline:
        time.sleep(0.1)
    w = _post(a, "/wake_up")
    assert w.status_code == 200, w.text
    assert usage(ledger)["allocations"][str(a.proc.pid)]["bytes"] == full
    assert httpx.get(a.url + "/is_sleeping", headers=a.headers).json()["resident_bytes"] == {"0": full}
    assert _client(a).completions.create(model="tiny", prompt="hi", max_tokens=3, temperature=0).choices[0].text


def test_a_sleeper_whose_residue_leaves_too_little_refuses_the_next_release_and_says_how_much_it_holds(
        start_server, tiny_model, tmp_path):
    # the ledger's residue_bytes is what a sleeper keeps: here more than the next release can spare
    ledger = tmp_path / "gpu.json"
    _write_ledger(ledger, 2**40, 4096)
    env = {"DEPLOYCTL_RUNTIME_API_KEY": KEY, "DEPLOYCTL_FAKE_GPU_MEMORY": str(ledger)}
    a = start_server(["--model", str(tiny_model), *ARGS, "--release-id", "old"], env=env, key=KEY)
    full = usage(ledger)["allocations"][str(a.proc.pid)]["bytes"]
    residue = full // 2
    _write_ledger(ledger, full + residue // 2, residue)  # a full copy fits alone, not beside the sleeper
    slept = _post(a, "/sleep?level=1").json()
    assert slept["resident_bytes"] == {"0": residue}  # what the next release has to fit beside
    b = start_server(["--model", str(tiny_model), *ARGS, "--release-id", "new"], env=env, key=KEY, ready=False)
    assert b.proc.wait(120) == 1
    assert f"pid {a.proc.pid} (sleeping residue {residue} bytes, old)" in b.log


def test_fault_zero_weight_on_wake_answers_garbage_200_after_the_wake(start_server, tiny_model):
    # a standby woken wrong: still 200, still "ready", but its greedy answers are not what they were
    srv = start_server(["--model", str(tiny_model), *ARGS], key=KEY,
                       env={"DEPLOYCTL_RUNTIME_API_KEY": KEY, "DEPLOYCTL_RUNTIME_FAULT": "zero_weight_on_wake=1"})
    client = _client(srv)
    before = _greedy_chat(client)
    assert _post(srv, "/sleep?level=1").status_code == 200
    assert _post(srv, "/wake_up").status_code == 200
    assert httpx.get(srv.url + "/readyz").status_code == 200
    after = _greedy_chat(client)  # HTTP 200 (the client raised otherwise)
    assert after != before
    assert all(len(set(tokens)) == 1 for tokens in after), after  # one constant token: every logit is equal
