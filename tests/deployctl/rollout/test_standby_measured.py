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
