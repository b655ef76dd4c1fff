"""Runbooks whose faults live in the runtime's load and settings, against the real runtime (CPU, tiny model)
on an ``address: local`` host (the sshd path of the same checks and actions is covered by
test_runbook_faults_ssh.py). Each test starts the runtime with its fault, runs the runbook through the CLI,
and checks its diagnosis and, where the runbook has a fixing action, the fix.

p99-concurrency (a full queue: max_num_seqs above the capacity plan → max_num_seqs from the plan),
long-starves-short (chunked prefill off → on), slow-responses (slow decode → named), tail-latency (a long
request among short ones, no alert rules → both named), scale-out-slow (slow load and slow first token → wait
for readiness, then named). canary-went-bad runs against a real canary rollout in test_runbook_canary.py."""
from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from support.runbook_fleet import (audit_records, cli, complete, free_port, http_status, install_release, launch,
                           make_tiny_model, start_runtime, stop_runtime, wait_until, write_deploy_yaml)


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    base = tmp_path_factory.mktemp("rb-local")
    ns = SimpleNamespace(model=make_tiny_model(base / "model"), root=str(base / "deploy"), port=free_port(),
                         base=base)
    yield ns
    stop_runtime(ns.root)


@pytest.fixture
def rt(shared, tmp_path):
    """``rt.start(fault=None, wait=True, **engine / slo=...)``: write deploy.yaml, install the release, (re)start."""
    hosts = [{"name": "local-a", "address": "local", "deploy_root": shared.root, "python": sys.executable,
              "launcher": "process"}]

    def start(*, fault: str | None = None, wait: bool = True, slo: dict | None = None, **engine) -> Path:
        cfg = write_deploy_yaml(tmp_path / "deploy.yaml", hosts, port=shared.port, model_path=str(shared.model),
                                engine=engine, slo=slo, server={"drain_timeout_s": 2})
        stop_runtime(shared.root)
        install_release(cfg, "local-a", fault=fault)
        if wait:
            start_runtime(shared.root, shared.port)
        else:
            assert launch(shared.root, "start").returncode == 0
        return cfg

    yield SimpleNamespace(start=start, root=shared.root, port=shared.port)
    stop_runtime(shared.root)


def _last_run(root: str) -> dict[str, dict]:
    recs = audit_records(root)
    return {r["step"]: r for r in recs if r["run_id"] == recs[-1]["run_id"]}


def _load(port: int, n: int, **kw) -> list[threading.Thread]:
    threads = [threading.Thread(target=complete, args=(port,), kwargs=kw, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    return threads


def test_long_requests_starve_short_ones_chunked_prefill_turned_on(rt):
    cfg = rt.start(enable_chunked_prefill=False)
    r = cli("runbook", "run", "long-starves-short", "-c", str(cfg), "--yes")
    assert r.returncode == 0, r.stdout + r.stderr
    steps = _last_run(rt.root)
    assert (steps["chunked_prefill"]["observed"], steps["chunked_prefill"]["outcome"]) == (False, "fixed")
    assert yaml.safe_load(cfg.read_text())["engine"]["enable_chunked_prefill"] is True
    assert yaml.safe_load((Path(rt.root) / "current" / "runtime.yaml").read_text())["enable_chunked_prefill"] is True
    assert http_status(rt.port, "/readyz") == 200 and complete(rt.port) == 200


def test_p99_with_concurrency_full_queue_max_num_seqs_from_the_plan(rt):
    # 256 KiB of KV = 512 tokens = two requests of max_model_len 256, but max_num_seqs 8
    # each decode step slowed by 40 ms so that the queue is still there when the runbook looks
    cfg = rt.start(kv_cache_memory="256KiB", max_num_seqs=8, fault="token_delay_ms=40")
    prompt = " ".join(["hello"] * 30)  # 90 tokens; + 150 = 240 <= max_model_len 256
    threads = _load(rt.port, 16, prompt=prompt, max_tokens=150, ignore_eos=True)
    assert wait_until(lambda: _metric(rt.port, "deployctl_runtime_num_requests_waiting") > 0, 30)

    r = cli("runbook", "run", "p99-concurrency", "-c", str(cfg), "--yes")
    assert r.returncode == 0, r.stdout + r.stderr
    steps = _last_run(rt.root)
    # the load is seen: the KV cache fills, requests wait or get preempted (which of these at the moment of looking
    # depends on the scheduler's step)
    assert any(steps[s]["outcome"] == "failed" for s in ("kv_usage", "waiting", "preemptions"))
    assert (steps["capacity"]["observed"], steps["capacity"]["outcome"]) == (2, "fixed")
    assert steps["queue_now"]["outcome"] == "ok"  # after the restart with max_num_seqs 2
    assert yaml.safe_load(cfg.read_text())["engine"]["max_num_seqs"] == 2
    assert yaml.safe_load((Path(rt.root) / "current" / "runtime.yaml").read_text())["max_num_seqs"] == 2
    assert http_status(rt.port, "/readyz") == 200
    for t in threads:
        t.join(60)


def _metric(port: int, name: str) -> float:
    import httpx

    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    except httpx.HTTPError:
        return -1
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))


def test_slow_responses_names_decode(rt):
    cfg = rt.start(fault="token_delay_ms=150", slo={"tpot_p99_s": 0.05})
    for _ in range(2):
        assert complete(rt.port, max_tokens=6, ignore_eos=True) == 200
    r = cli("runbook", "run", "slow-responses", "-c", str(cfg))
    assert r.returncode == 1, r.stdout + r.stderr
    steps = _last_run(rt.root)
    assert steps["queue"]["outcome"] == "ok"
    assert steps["decode"]["outcome"] == "escalated" and steps["decode"]["observed"] >= 0.1
    assert "decode:" in steps["decode"]["result"] and "per output token" in steps["decode"]["result"]


def test_tail_latency_behind_a_good_average(rt):
    cfg = rt.start()
    # two long requests among 98 short ones: P99 (rank 99 of 100) lands on a long one (one long request among 100
    # would be above P99, not at it); P99/mean stays over 10 while a long one takes over ~12x a short one
    for _ in range(98):
        assert complete(rt.port, max_tokens=1) == 200
    for _ in range(2):
        assert complete(rt.port, max_tokens=200, ignore_eos=True) == 200
    r = cli("runbook", "run", "tail-latency", "-c", str(cfg))
    assert r.returncode == 1, r.stdout + r.stderr
    steps = _last_run(rt.root)
    assert steps["ttft_histogram"]["outcome"] == "ok" and steps["e2e_histogram"]["outcome"] == "ok"
    assert steps["alert_rules"]["outcome"] == "escalated"  # no rules installed on this host
    assert steps["e2e_tail"]["outcome"] == "escalated" and steps["e2e_tail"]["observed"] >= 10
    assert steps["e2e_tail"]["recorded"]["quantile"] > steps["e2e_tail"]["recorded"]["mean"]
    assert steps["e2e_tail"]["recorded"]["count"] == 100


def test_tail_latency_cannot_judge_a_p99_from_three_requests_and_judges_from_a_hundred(rt):
    cfg = rt.start()
    rules = Path(rt.root) / "shared" / "prometheus" / "alerts.rules.yaml"  # what the alert_rules step looks for
    rules.parent.mkdir(parents=True, exist_ok=True)
    rules.write_text("expr: histogram_quantile(0.99, rate(x[5m])) > 1\n")
    # eight tokens each: the requests land inside the E2E histogram's lowest bucket (50 ms) either way, and the
    # estimate there is interpolated from 0, so a healthy ratio needs requests that are not a few ms each
    for _ in range(3):
        assert complete(rt.port, max_tokens=8, ignore_eos=True) == 200
    r = cli("runbook", "run", "tail-latency", "-c", str(cfg), "--json")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "cannot judge: 3 samples (P99 needs >= 100)" in r.stderr
    steps = _last_run(rt.root)
    for name in ("e2e_tail", "ttft_p99"):  # neither a pass nor an escalation, and no action
        assert (steps[name]["outcome"], steps[name]["ok"], steps[name]["observed"]) == ("cannot judge", False, None)
        assert steps[name]["action"] is None and steps[name]["recorded"].get("mean") is not None
    assert json.loads(r.stdout)["hosts"][0]["outcome"] == "cannot judge"  # not healthy, not a finding


    for _ in range(97):
        assert complete(rt.port, max_tokens=8, ignore_eos=True) == 200
    r = cli("runbook", "run", "tail-latency", "-c", str(cfg), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["hosts"][0]["outcome"] == "healthy", r.stdout + r.stderr
    steps = _last_run(rt.root)
    assert steps["e2e_tail"]["outcome"] == "ok" and steps["e2e_tail"]["recorded"]["count"] == 100
    assert steps["ttft_p99"]["outcome"] == "ok" and steps["ttft_p99"]["observed"] < 2.0  # the default SLO


def test_scale_out_slow_waits_for_readiness_and_names_a_slow_first_request(rt):
    cfg = rt.start(fault="load_delay_s=3,token_delay_ms=1500", slo={"ttft_p99_s": 1.0}, wait=False)
    assert http_status(rt.port, "/readyz") != 200
    r = cli("runbook", "run", "scale-out-slow", "-c", str(cfg))
    assert r.returncode == 1, r.stdout + r.stderr
    steps = _last_run(rt.root)
    assert steps["ready"]["outcome"] == "ok" and steps["ready"]["duration_s"] >= 1
    assert steps["warmup_logged"]["outcome"] == "ok"
    assert steps["first_request"]["outcome"] == "escalated" and steps["first_request"]["observed"] >= 1.0
