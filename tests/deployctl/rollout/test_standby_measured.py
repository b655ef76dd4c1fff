"""Issue 39: the standby is measured, never lost quietly, and every path is recorded. Real sshd fleet, real nginx,
the bundled runtime on CPU; only the GPU is a stand-in (the ledger of runtime/deployctl_runtime/gpu_ledger.py, one
per host, read by the runtime and by the host probe).

- The sleeper's residue is measured on the host after the sleep (not the adapter's estimate): where the next
  release does not fit beside it, ``rollout.standby_misfit: drop`` stops the standby and starts cold, said in the
  output, status and history; ``fail`` stops the deploy with the previous release serving, not restarted.
- The old release sleeps only once its in-flight streams ended (409 ``requests_in_flight`` retried within
  ``rollout.standby_drain_s``); past the bound, no standby, and the output, status and history say why.
"""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import pytest

from support.nginx import free_port
from support.rollout import served

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _fake_gpu(tmp_path, h: dict, fault: str = "") -> Path:
    """Host ``h`` gets a stand-in GPU ledger with room for many copies (its python wrapped to name it)."""
    ledger = tmp_path / f"gpu-{h['name']}.json"
    ledger.write_text(json.dumps({"total_bytes": 64 * 2**30, "residue_bytes": 2**20, "allocations": {}}))
    wrapper = tmp_path / f"python-{h['name']}"
    extra = f"DEPLOYCTL_RUNTIME_FAULT={fault} " if fault else ""
    wrapper.write_text(f"#!/bin/sh\nDEPLOYCTL_FAKE_GPU_MEMORY={ledger} {extra}exec {h['python']} \"$@\"\n")
    wrapper.chmod(0o755)
    h["python"] = str(wrapper)
    return ledger


def _run(env, name: str) -> Path:
    return Path(env.host(name)["deploy_root"]) / "shared" / "run"


def _json(p: Path):
    return json.loads(p.read_text()) if p.exists() else None


def _serving_pid(env, name: str) -> int:
    return int((_run(env, name) / "runtime.pid").read_text().strip())


def _last(env, action: str = "deploy") -> dict:
    return [r for r in env.history() if r["action"] == action][-1]


def test_a_release_that_does_not_fit_beside_the_measured_residue_drops_the_standby_or_fails(rollout_env, tmp_path):
    from deployctl_runtime.gpu_ledger import usage

    env = rollout_env(2, steps=[100], pause_s=0)
    a, b = env.names
    hosts = {h["name"]: h for h in env.cfg["hosts"]}
    ledgers = {n: _fake_gpu(tmp_path, hosts[n]) for n in env.names}
    for h in hosts.values():
        h["spare_port"] = free_port()
    env.write()
    r = env.cli("deploy", "--yes")
    assert r.returncode == 0, r.stderr
    one = next(iter(json.loads(ledgers[a].read_text())["allocations"].values()))["bytes"]  # weights + KV
    for n in env.names:
        # room for one awake copy and half of another; a sleeping runtime keeps three quarters of a copy: the
        # adapter's estimate (512 MiB) would fit, the real residue does not
        d = json.loads(ledgers[n].read_text())
        d.update(total_bytes=one + one // 2, residue_bytes=3 * one // 4)
        ledgers[n].write_text(json.dumps(d))

    # drop (the default): each host's v1 sleeps, its residue is measured, v2 would not fit beside it: v1 stops,
    # v2 starts cold — never into an out-of-memory
    r = env.cli("deploy", "--yes", timeout=480)
    print("deploy, drop:", r.stderr)
    assert r.returncode == 0, r.stderr
    v2 = env.current(a)
    assert r.stderr.count("no standby:") >= 2 and "measured residue" in r.stderr, r.stderr
    assert "stand-in GPU ledger" in r.stderr and "starts cold" in r.stderr, r.stderr
    for n in env.names:
        assert _json(_run(env, n) / "standby.json") is None
        note = _json(_run(env, n) / "no-standby.json")
        assert note["residue_bytes"] == {"0": 3 * one // 4} and note["measured"]["how"] == "stand-in GPU ledger"
        assert note["measured"]["stable"] is True
        assert served(hosts[n]["spare_port"]) == v2 and served(hosts[n]["server_port"]) is None
        u = usage(ledgers[n])
        assert u["used_bytes"] == one, u
    rec = _last(env)
    assert rec["result"] == "ok" and set(rec["standby"]) == {a, b}, rec
    assert all(not s["standby"] and "measured residue" in s["why"] for s in rec["standby"].values()), rec
    assert "no standby on" in rec["reason"]
    st = env.status()
    assert all(h["standby"] is None and "measured residue" in h["no_standby"]["why"] for h in st["hosts"])
    assert "no standby:" in env.cli("status").stdout

    # fail, nothing known before the sleep: the canary's v2 sleeps, is measured, does not leave room: it is woken
    # again and serves on, not restarted (same pid); the deploy exits non-zero, the abort's path recorded
    for n in env.names:
        (_run(env, n) / "no-standby.json").unlink()
    env.cfg["rollout"]["standby_misfit"] = "fail"
    env.write()
    pids = {n: _serving_pid(env, n) for n in env.names}
    r = env.cli("deploy", "--yes", timeout=480)
    print("deploy, fail after the sleep:", r.stderr)
    assert r.returncode == 6, r.stderr
    assert "standby_misfit is fail" in r.stderr and "measured residue" in r.stderr, r.stderr
    for n in env.names:
        assert env.current(n) == v2 and served(hosts[n]["spare_port"]) == v2
        assert _serving_pid(env, n) == pids[n], n  # woken, verified, not cold-restarted by the abort
        assert usage(ledgers[n])["used_bytes"] == one
    rec = _last(env)
    assert rec["result"] == "aborted" and rec["paths"][a]["path"] == "serving", rec
    assert (_json(_run(env, a) / "no-standby.json") or {}).get("residue_bytes") == {"0": 3 * one // 4}

    # fail, the residue known from the last sleep: refused before the old release is touched (no sleep at all)
    r = env.cli("deploy", "--yes", timeout=480)
    print("deploy, fail before the sleep:", r.stderr)
    assert r.returncode == 6, r.stderr
    assert "measured at this host's last sleep" in r.stderr and "standby_misfit is fail" in r.stderr, r.stderr
    assert "sleeps before" not in r.stderr, r.stderr
    for n in env.names:
        assert env.current(n) == v2 and _serving_pid(env, n) == pids[n] and served(hosts[n]["spare_port"]) == v2
    # and a stand-alone preflight says so before any deploy: standby_fit fails with both numbers
    r = env.cli("preflight", "--json", "--host", a, "--skip-weights")
    fit = next(c for c in json.loads(r.stdout)["hosts"][0]["checks"] if c["name"] == "standby_fit")
    assert r.returncode != 0 and fit["status"] == "fail" and "measured at the last sleep" in fit["message"], fit


def _sleeping(port: int):
    """The runtime on ``port``: True asleep, False awake, None nothing listens."""
    try:
        return httpx.get(f"http://127.0.0.1:{port}/is_sleeping", timeout=10).json()["is_sleeping"]
    except httpx.TransportError:
        return None


def _stream(port: int, out: dict, max_tokens: int = 230) -> None:
    """One long streamed completion straight to the runtime on ``port`` (as a client whose request started before
    the host left nginx): ``out`` gets status, chunks, finish (the last finish_reason), end (Unix s) or error."""
    body = {"model": "tiny-chat", "prompt": "Once upon a time", "max_tokens": max_tokens, "stream": True,
            "ignore_eos": True}
    try:
        with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=180) as r:
            out["status"] = r.status_code
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    out["chunks"] = out.get("chunks", 0) + 1
                    choice = (json.loads(line[6:]).get("choices") or [{}])[0]
                    out["finish"] = choice.get("finish_reason") or out.get("finish")
    except httpx.HTTPError as e:
        out["error"] = repr(e)
    out["end"] = time.time()


def _stream_when_switched(env, deploy, name: str, release_before: str, port: int) -> tuple[threading.Thread, dict]:
    """Once the deploy switched ``current`` on ``name`` (the host is out of nginx, the new release starting beside
    the old one), open a long stream to the old release on ``port``."""
    end = time.monotonic() + 240
    while env.current(name) == release_before:
        assert deploy.poll() is None and time.monotonic() < end, deploy.communicate()
        time.sleep(0.05)
    out: dict = {}
    t = threading.Thread(target=_stream, args=(port, out), daemon=True)
    t.start()
    return t, out


def test_the_old_release_sleeps_once_its_streams_end_or_says_why_there_is_no_standby(rollout_env, tmp_path):
    env = rollout_env(2, steps=[100], pause_s=0,
                      analysis={"interval_s": 2, "min_requests": 20, "outputs": {"enabled": False}})
    a, b = env.names
    hosts = {h["name"]: h for h in env.cfg["hosts"]}
    for h in hosts.values():  # every engine step takes 80 ms: a 230-token stream runs for about 20 s
        _fake_gpu(tmp_path, h, "token_delay_ms=80")
        h["spare_port"] = free_port()
    env.cfg["rollout"]["standby_drain_s"] = 120
    env.write()
    r = env.cli("deploy", "--yes")
    assert r.returncode == 0, r.stderr
    v1 = env.current(a)

    # a stream on the canary's v1 when it leaves nginx: v1 sleeps once it ended (409s retried), the stream whole
    deploy = env.popen("deploy", "--yes")
    t, out = _stream_when_switched(env, deploy, a, v1, hosts[a]["server_port"])
    _, err = deploy.communicate(timeout=480)
    t.join(timeout=120)
    print("deploy, drain 120 s:", err, out)
    assert deploy.returncode == 0, err
    v2 = env.current(a)
    assert out.get("status") == 200 and "error" not in out and out.get("finish") == "length", out
    rec = _json(_run(env, a) / "standby.json")
    assert rec["release"] == v1 and rec["since"] >= out["end"] - 1, (rec, out)
    assert rec["residue_bytes"] and rec["measured"]["how"] == "stand-in GPU ledger"
    assert "no standby" not in err
    st = {h["host"]: h for h in env.status()["hosts"]}
    assert st[a]["standby"]["asleep"] and st[a]["standby"]["residue_bytes"] == rec["residue_bytes"]
    assert "GPU residue 0:" in env.cli("status").stdout
    assert _last(env)["standby"][a] == {"standby": True, "residue_bytes": rec["residue_bytes"]}
    # a stand-alone preflight: server_port is held by the host's own sleeping v1 (v2 serves on spare_port): ours
    r = env.cli("preflight", "--json", "--host", a, "--skip-weights")
    port = next(c for c in json.loads(r.stdout)["hosts"][0]["checks"] if c["name"] == "port")
    assert port["status"] == "pass" and f"sleeping standby of {v1}" in port["message"], port

    # a bound shorter than the stream: no standby, said in the output, status and history
    env.cfg["rollout"]["standby_drain_s"] = 2
    env.write()
    deploy = env.popen("deploy", "--yes")
    t, out = _stream_when_switched(env, deploy, a, v2, hosts[a]["spare_port"])
    _, err = deploy.communicate(timeout=480)
    t.join(timeout=120)
    print("deploy, drain 2 s:", err, out)
    assert deploy.returncode == 0, err
    assert f"{a}: no standby: requests were still in flight" in err and "2 s after it left the router" in err, err
    assert _json(_run(env, a) / "standby.json") is None
    st = {h["host"]: h for h in env.status()["hosts"]}
    assert st[a]["standby"] is None and "still in flight" in st[a]["no_standby"]["why"]
    assert st[b]["standby"]["release"] == v2  # b had no stream: its v2 sleeps
    rec = _last(env)
    assert rec["standby"][a]["standby"] is False and "still in flight" in rec["standby"][a]["why"], rec
    assert "no standby on " + a in rec["reason"]

    # a rollback whose nginx switch fails (nginx -t refuses the main conf): b's woken standby sleeps again, the
    # bad release serves on
    sb = _json(_run(env, b) / "standby.json")
    good = env.nginx.conf_path.read_text()
    env.nginx.conf_path.write_text(good + "\nnot_a_directive on;\n")
    r = env.cli("rollback", "--json")
    env.nginx.conf_path.write_text(good)
    print("rollback, nginx broken:", r.stderr)
    assert r.returncode != 0 and "sleeps again" in r.stderr, r.stderr
    assert _sleeping(sb["port"]) is True and _json(_run(env, b) / "standby.json")["release"] == v2
    assert env.current(b) != v2

    # the rollback's paths reach its history record: b wakes its standby, a (none kept) starts cold
    r = env.cli("rollback", "--json")
    assert r.returncode == 0, r.stderr
    paths = json.loads(r.stdout)["phases"]["paths"]
    rec = _last(env, "rollback")
    assert rec["paths"] == paths and rec["paths"][b]["path"] == "wake", rec
    assert rec["paths"][a] == {"path": "start", "why": "no standby on the host"}, rec


def test_one_host_under_traffic_moves_nginx_to_the_new_release_before_the_old_one_sleeps(rollout_env):
    """In place (one host, no canary): the new release starts beside the old one, nginx moves to it (the old
    one's weight 0), then the old one sleeps once idle: no request reaches a sleeping runtime."""
    from deployctl.demo.run import Traffic

    env = rollout_env(1, steps=[100], pause_s=0)
    [a] = env.names
    env.cfg["hosts"][0]["spare_port"] = free_port()
    env.write()
    assert env.cli("deploy", "--yes").returncode == 0
    v1 = env.current(a)
    traffic = Traffic(env.url, "tiny-chat", workers=2, completion_workers=1).start()
    try:
        time.sleep(2)
        r = env.cli("deploy", "--yes", timeout=480)
    finally:
        traffic.stop()
    print("deploy in place:", r.stderr)
    assert r.returncode == 0, r.stderr
    v2 = env.current(a)
    assert "no standby" not in r.stderr, r.stderr
    assert _json(_run(env, a) / "standby.json")["release"] == v1
    assert served(env.host(a)["spare_port"]) == v2 and _sleeping(env.host(a)["server_port"]) is True
    ok, failed = traffic.snapshot()
    print(f"traffic through nginx: {dict(ok)}, failed {dict(failed)}, retried {traffic.retried}")
    assert not failed and ok[v1] > 0 and ok[v2] > 0
