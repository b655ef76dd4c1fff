"""What the generator sends: Poisson arrivals in rate mode, and requests from a JSONL dataset."""
from __future__ import annotations

import json

import pytest
from bench_fake_server import FakeConfig, FakeServer

from deployctl.bench import workload
from deployctl.bench.client import Target
from deployctl.bench.ladder import LadderConfig, poisson_arrivals, run_ladder


def test_poisson_arrivals_have_exponential_gaps_with_mean_one_over_rate():
    times = poisson_arrivals(50.0, 20001, seed=1)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert times[0] == 0.0 and all(g > 0 for g in gaps)
    mean = sum(gaps) / len(gaps)
    assert mean == pytest.approx(1 / 50, rel=0.03)
    # exponential: the standard deviation equals the mean, and P(gap > mean) = 1/e
    var = sum((g - mean) ** 2 for g in gaps) / len(gaps)
    assert var ** 0.5 == pytest.approx(mean, rel=0.05)
    assert sum(g > mean for g in gaps) / len(gaps) == pytest.approx(0.3679, abs=0.015)
    assert poisson_arrivals(50.0, 10, seed=1) == times[:10]


def test_rate_mode_sends_on_the_poisson_schedule():
    cfg = FakeConfig(ttft_s=0.01, tpot_s=0.005, max_concurrency=16)
    with FakeServer(cfg) as srv:
        ladder = LadderConfig(target=Target(srv.url, model=cfg.model), concurrencies=(16,), requests_per_level=10,
                              rate=15.0, seed=5)
        (level,) = run_ladder(ladder, workload.synthetic(16, "4", "3", seed=0))
    assert level.num_ok == 16 and level.rate == 15.0
    expected = poisson_arrivals(15.0, 16, seed=5 + 16)
    lags = [seen - want for seen, want in zip(cfg.arrivals, expected)]  # the level's start + delivery lag each
    base = sorted(lags)[len(lags) // 2]
    spread = sorted(abs(lag - base) for lag in lags)
    # most arrivals within 15 ms of the schedule (a busy machine may delay a few, never by much)
    assert spread[len(spread) * 3 // 4] < 0.015 and spread[-1] < 0.15, spread
    assert sum(b - a for a, b in zip(expected, expected[1:])) > 0.5  # the schedule itself spans the level


def test_dataset_requests_are_sent_as_written(run_bench, tmp_path):
    data = tmp_path / "requests.jsonl"
    rows = [{"prompt": "one two three", "max_tokens": 2},
            {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}], "max_tokens": 3},
            {"prompt": "four", "max_tokens": 4}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = FakeConfig(ttft_s=0.01, tpot_s=0.005)
    with FakeServer(cfg) as srv:
        rc, doc, err = run_bench("--url", srv.url, "--dataset", str(data), "--concurrency", "1", "--requests", "3",
                                 "--warmup", "0", "--no-loadgen-check", "--json")
    assert rc == 0, err
    sent = sorted((json.dumps(b["messages"]), b["max_tokens"]) for b in cfg.bodies)
    want = sorted((json.dumps(workload.BenchRequest(r.get("prompt"), r.get("messages"), r["max_tokens"]).as_messages()),
                   r["max_tokens"]) for r in rows)
    assert sent == want
    assert all(b["stream"] and b["stream_options"] == {"include_usage": True} and b["model"] == "fake-model"
               for b in cfg.bodies)
    assert doc["levels"][0]["total_output_tokens"] == 9
    assert len(set(cfg.client_ports)) == 1  # one keep-alive connection carried all three streams
    data.write_text('{"prompt": "ok"}\nnot json\n')
    rc, _, err = run_bench("--url", srv.url, "--dataset", str(data), "--no-loadgen-check")
    assert rc == 3 and "line 2: not JSON" in err


def test_a_level_stops_sending_after_max_level_seconds():
    cfg = FakeConfig(ttft_s=0.1, tpot_s=0.01, max_concurrency=4)
    with FakeServer(cfg) as srv:
        ladder = LadderConfig(target=Target(srv.url, model=cfg.model), concurrencies=(1,), requests_per_level=50,
                              max_level_s=0.5)
        (level,) = run_ladder(ladder, workload.synthetic(50, "4", "2", seed=0))
    # each request takes ~0.11 s: about 5 fit in 0.5 s, and the ones sent all finish
    assert 2 <= level.num_requests <= 6 and level.num_ok == level.num_requests == cfg.num_arrived


def test_server_histograms_are_scraped_around_each_level():
    cfg = FakeConfig(ttft_s=0.15, tpot_s=0.01, max_concurrency=2)
    with FakeServer(cfg) as srv:
        base = dict(target=Target(srv.url, model=cfg.model), concurrencies=(1, 2), requests_per_level=3)
        levels = run_ladder(LadderConfig(**base, metrics_url=srv.url + "/metrics", metrics_prefix="fake_"),
                            workload.synthetic(3, "4", "3", seed=0))
        (wrong,) = run_ladder(LadderConfig(**{**base, "concurrencies": (1,)}, metrics_url=srv.url + "/metrics"),
                              workload.synthetic(3, "4", "3", seed=0))
        (missing,) = run_ladder(LadderConfig(**{**base, "concurrencies": (1,)}, metrics_url=srv.url + "/nope"),
                                workload.synthetic(3, "4", "3", seed=0))
    for level in levels:  # each window holds exactly that level's requests
        assert level.server["ttft_ms"]["count"] == level.server["ttft_ms"]["client_count"] == level.num_ok == 3
        assert level.server["e2e_ms"]["count"] == 3
        # all TTFTs are ~150 ms: in the (0.1, 0.2] bucket on both sides
        assert 100 < level.server["ttft_ms"]["p50"] <= 200 and 100 < level.server["ttft_ms"]["client_p50"] <= 200
    assert "no deployctl_runtime_* latency histograms" in wrong.server["error"]
    assert "404" in missing.server["error"] and missing.num_ok == 3


def test_vram_peak_per_level_is_sampled_during_the_level_or_said_not_measured():
    """The gauge is at its base before and after a level and higher only while requests run: the peak the level
    records is the in-flight value, which neither scrape around the level can see."""
    base, per = 1_000_000_000, 250_000_000
    cfg = FakeConfig(ttft_s=0.3, tpot_s=0.01, max_concurrency=2, vram_base=base, vram_per_request=per)
    with FakeServer(cfg) as srv:
        ladder = LadderConfig(target=Target(srv.url, model=cfg.model), concurrencies=(1, 2), requests_per_level=2,
                              metrics_url=srv.url + "/metrics", metrics_prefix="fake_", vram_every_s=0.05)
        one, two = run_ladder(ladder, workload.synthetic(2, "4", "3", seed=0))
    assert one.server["vram"]["peak_bytes"] == {"0": base + per} and one.server["vram"]["samples"] >= 3
    assert two.server["vram"]["peak_bytes"] == {"0": base + 2 * per}
    plain = FakeConfig(ttft_s=0.05, tpot_s=0.01)  # no GPU memory gauge, as vLLM or a runtime on cpu
    with FakeServer(plain) as srv:
        (level,) = run_ladder(LadderConfig(target=Target(srv.url, model=plain.model), concurrencies=(1,),
                                           requests_per_level=2, metrics_url=srv.url + "/metrics",
                                           metrics_prefix="fake_"), workload.synthetic(2, "4", "3", seed=0))
    assert level.server["vram"] == {"not_measured": "the server exports no fake_gpu_memory_used_bytes (the bundled "
                                    "runtime's NVML gauge; none on cpu or without NVML)"}
