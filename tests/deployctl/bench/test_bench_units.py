"""Plain-Python parts of bench: percentiles, TPOT, goodput, the knee rule, workloads, the overhead probe."""
from __future__ import annotations

import json
import random
import statistics

import pytest

from deployctl.bench import workload
from deployctl.bench.client import RequestResult
from deployctl.bench.knee import find_knee
from deployctl.bench.overhead import measure_overhead
from deployctl.bench.stats import Objectives, level_stats, percentile, tpot
from deployctl.errors import ConfigError, UsageError


def _res(ttft, e2e, tokens, itl=(), error=None):
    return RequestResult(start=0.0, error=error, ttft=ttft, e2e=e2e, output_tokens=tokens, itl=list(itl),
                         usage_reported=True)


def test_percentile_is_the_inclusive_linear_method():
    rng = random.Random(3)
    for n in (2, 7, 100):
        xs = [rng.random() for _ in range(n)]
        cuts = statistics.quantiles(xs, n=100, method="inclusive")  # numpy's default "linear" as well
        for q in (0.01, 0.5, 0.9, 0.99):
            assert percentile(xs, q) == pytest.approx(cuts[round(q * 100) - 1])
        assert (percentile(xs, 0.0), percentile(xs, 1.0)) == (min(xs), max(xs))
    assert percentile([4.0], 0.99) == 4.0


def test_tpot_is_latency_after_the_first_token_over_the_remaining_tokens():
    assert tpot(_res(0.2, 0.6, 9)) == pytest.approx(0.05)
    assert tpot(_res(0.2, 0.2, 1)) is None  # one token: no TPOT
    assert tpot(_res(None, 1.0, 0, error="http_500")) is None


def test_level_stats_counts_errors_and_goodput():
    results = [_res(0.1, 0.5, 5, itl=[0.1] * 4), _res(0.3, 0.7, 5), _res(None, 0.01, 0, error="http_429"),
               _res(None, 1.0, 0, error="timeout")]
    s = level_stats(4, None, results, 2.0, Objectives(ttft_ms=200, tpot_ms=150))
    assert (s.num_ok, s.num_errors, s.error_rate) == (2, 2, 0.5)
    assert s.errors == {"http_429": 1, "timeout": 1}
    assert s.goodput == {"num_met": 1, "ratio": 0.25, "requests_per_s": 0.5}
    assert s.requests_per_s == 1.0 and s.output_tokens_per_s == 5.0
    assert s.tpot_ms["p50"] == pytest.approx(100.0)
    assert s.itl_ms["p99"] == pytest.approx(100.0)


def _level(conc, ttft_p99_s, tpot_s=0.02, n=10, errors=0, duration=1.0):
    results = [_res(ttft_p99_s, ttft_p99_s + tpot_s * 9, 10) for _ in range(n - errors)]
    results += [_res(None, 0.1, 0, error="http_429") for _ in range(errors)]
    return level_stats(conc, None, results, duration)


def test_knee_is_the_last_level_within_2x_of_level_1():
    levels = [_level(1, 0.1), _level(2, 0.15), _level(4, 0.19), _level(8, 0.25), _level(16, 0.12)]
    knee = find_knee(levels)
    assert knee.concurrency == 4 and knee.broken_at == 8 and knee.criterion == "2x_level1"
    assert knee.ttft_p99_limit_ms == pytest.approx(200.0)
    assert knee.recommended_max_num_seqs == 4
    assert knee.rate_limit_rps == pytest.approx(0.8 * levels[2].requests_per_s)


def test_knee_by_objectives_by_tpot_and_by_errors():
    levels = [_level(1, 0.1), _level(2, 0.1, tpot_s=0.05), _level(4, 0.1, tpot_s=0.09)]
    assert find_knee(levels, Objectives(ttft_ms=500, tpot_ms=60)).concurrency == 2
    assert find_knee([_level(1, 0.1), _level(2, 0.1, errors=3)]).concurrency == 1
    none = find_knee([_level(1, 0.9)], Objectives(ttft_ms=500))
    assert none.concurrency is None and none.recommended_max_num_seqs is None and "TTFT" in none.reason
    top = find_knee([_level(1, 0.1), _level(2, 0.1)])
    assert top.concurrency == 2 and "extend the ladder" in top.reason


def test_length_specs_and_seeded_synthetic_requests():
    rng = random.Random(0)
    assert {workload.parse_length_spec("7", "--input-len")(rng) for _ in range(5)} == {7}
    assert {workload.parse_length_spec("3-5", "--input-len")(rng) for _ in range(200)} == {3, 4, 5}
    draws = [workload.parse_length_spec("normal:100,10", "--output-len")(rng) for _ in range(2000)]
    assert abs(sum(draws) / len(draws) - 100) < 2
    a = workload.synthetic(5, "10-20", "lognormal:64,0.5", seed=4)
    assert a == workload.synthetic(5, "10-20", "lognormal:64,0.5", seed=4)
    assert all(10 <= len(r.prompt.split()) <= 20 for r in a)
    for bad in ("0", "5-2", "normal:x", "lognormal:1", "abc"):
        with pytest.raises(UsageError, match="--input-len"):
            workload.parse_length_spec(bad, "--input-len")


def test_jsonl_dataset_and_its_errors(tmp_path):
    p = tmp_path / "reqs.jsonl"
    p.write_text(json.dumps({"prompt": "hi", "max_tokens": 3}) + "\n\n"
                 + json.dumps({"messages": [{"role": "user", "content": "yo"}]}) + "\n")
    reqs = workload.load_jsonl(p, default_max_tokens=9)
    assert [(r.as_prompt(), r.max_tokens) for r in reqs] == [("hi", 3), ("yo", 9)]
    assert reqs[0].as_messages() == [{"role": "user", "content": "hi"}]
    p.write_text('{"prompt": "ok"}\n{"text": "no prompt"}\n')
    with pytest.raises(ConfigError, match=r"line 2: no 'prompt'"):
        workload.load_jsonl(p, 4)
    p.write_text('{"prompt": "ok", "max_tokens": 0}\n')
    with pytest.raises(ConfigError, match="line 1: max_tokens 0"):
        workload.load_jsonl(p, 4)
    with pytest.raises(ConfigError, match="missing.jsonl"):
        workload.load_jsonl(tmp_path / "missing.jsonl", 4)


def test_overhead_probe_runs_the_client_against_the_trivial_server():
    o = measure_overhead(4, tokens=8)
    assert o.num_errors == 0 and o.concurrency == 4 and o.tokens_per_request == 8
    assert o.capacity_chunks_per_s > 0 and o.per_chunk_ms == pytest.approx(1e3 / o.capacity_chunks_per_s, rel=0.01)
    assert 0 < o.unloaded_ttft_p50_ms <= o.unloaded_ttft_p99_ms
