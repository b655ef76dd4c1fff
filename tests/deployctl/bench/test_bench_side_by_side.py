"""`deployctl bench --url A --url B` (and -c deploy.yaml --hosts): the same seeded requests against both, level by
level; one table with both and the B/A ratios, each side's knee, a verdict; --plot overlays both."""
from __future__ import annotations

import json

import pytest
import yaml
from bench_fake_server import FakeConfig, FakeServer

TPOT_A, TPOT_B, OUT = 0.04, 0.12, 6  # large against scheduling noise on a busy machine


def _prompts(cfg: FakeConfig) -> list[str]:
    return [b["messages"][0]["content"] for b in cfg.bodies]


def test_side_by_side_same_requests_ratios_knees_and_verdict(run_bench, tmp_path):
    a, b = FakeConfig(ttft_s=0.1, tpot_s=TPOT_A), FakeConfig(ttft_s=0.1, tpot_s=TPOT_B)  # 2x rule: margins for load
    plot = tmp_path / "ab.png"
    with FakeServer(a) as sa, FakeServer(b) as sb:
        rc, doc, err = run_bench("--url", sa.url, "--url", sb.url, "--concurrency", "1,2", "--requests", "4",
                                 "--input-len", "2-40", "--output-len", str(OUT), "--seed", "7", "--no-loadgen-check",
                                 "--json", "--plot", str(plot))
    assert rc == 0, err
    # one warm-up request each, the same one, counted in no level; then the same requests in the same order on both
    # sides: exactly at concurrency 1, as a set at 2
    assert doc["sides"]["A"]["warmup"]["requests"] == doc["sides"]["B"]["warmup"]["requests"] == 1
    assert len(a.bodies) == len(b.bodies) == 9 and _prompts(a)[0] == _prompts(b)[0]
    assert sum(level["num_ok"] for level in doc["sides"]["A"]["levels"]) == 8
    pa, pb = _prompts(a)[1:], _prompts(b)[1:]
    assert len(set(pa)) > 2 and pa[:4] == pb[:4] and sorted(pa[4:]) == sorted(pb[4:])
    # warm-ups first, then interleaved level by level: A's level 1 ended before B's began, B's level 1 before A's
    # level 2
    aa, ba = a.arrivals[1:], b.arrivals[1:]
    assert a.arrivals[0] < aa[0] and b.arrivals[0] < aa[0]
    assert aa[3] < ba[0] and ba[3] < aa[4]
    cmp = doc["comparison"]
    for ratio in cmp["levels"]:
        assert ratio["tpot_p50"] == pytest.approx(TPOT_B / TPOT_A, rel=0.2)
        assert ratio["output_tokens_per_s"] < 1 and ratio["e2e_p50"] > 1
    assert doc["sides"]["A"]["knee"]["concurrency"] == 2 and cmp["knees"] == {"A": 2, "B": None}
    assert doc["verdict"] == cmp["verdict"]
    assert cmp["verdict"].startswith("A holds P99 TTFT <= ") and ", B at no level;" in cmp["verdict"]
    assert " up to 2 concurrent (A's limits" in cmp["verdict"]
    assert "side by side" in err and "B/A" in err and "verdict: A holds" in err
    assert plot.stat().st_size > 10_000


def test_hosts_from_deploy_yaml_resolve_urls_and_the_api_key(run_bench, tmp_path):
    a, b = FakeConfig(ttft_s=0.01, tpot_s=0.005), FakeConfig(ttft_s=0.01, tpot_s=0.005)
    with FakeServer(a) as sa, FakeServer(b) as sb:
        hosts = [{"name": name, "address": "local", "deploy_root": f"/tmp/bench-{name}", "launcher": "process",
                  "server_port": int(srv.url.rsplit(":", 1)[1])} for name, srv in (("gpu-a", sa), ("gpu-b", sb))]
        conf = tmp_path / "deploy.yaml"
        conf.write_text(yaml.safe_dump({"service": {"name": "svc"}, "model": {"path": "/m"},
                                        "server": {"api_key_env": "BENCH_TEST_KEY"}, "hosts": hosts,
                                        "rollout": {"canary_hosts": 1}}))
        rc, doc, err = run_bench("-c", str(conf), "--hosts", "stable,canary", "--concurrency", "1", "--requests", "1",
                                 "--input-len", "4", "--output-len", "2", "--no-loadgen-check", "--json",
                                 env={"BENCH_TEST_KEY": "sk-bench-1"})
        rc2, _, err2 = run_bench("-c", str(conf), "--hosts", "gpu-c", "--no-loadgen-check")
    assert rc == 0, err
    # canary is the first host (rollout.canary_hosts 1), stable the next: stable is side A
    assert doc["sides"]["stable"]["url"] == sb.url and doc["sides"]["canary"]["url"] == sa.url
    assert a.auth_seen[-1] == b.auth_seen[-1] == "Bearer sk-bench-1"
    assert rc2 == 2 and "gpu-c" in err2.strip().splitlines()[-1]


def test_more_than_two_urls_is_a_usage_error(run_bench):
    rc, _, err = run_bench("--url", "http://127.0.0.1:9", "--url", "http://127.0.0.1:10", "--url",
                           "http://127.0.0.1:11", "--no-loadgen-check")
    assert rc == 2 and "3 servers" in err.strip().splitlines()[-1]
