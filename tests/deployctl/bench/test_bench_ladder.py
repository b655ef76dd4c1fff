"""Acceptance: `deployctl bench` against a real streaming server with known TTFT, TPOT and concurrency limit
finds the knee at that limit and measures TTFT/TPOT within 10%; errors are counted per reason, never fatal."""
from __future__ import annotations

import pytest
from bench_fake_server import FakeConfig, FakeServer, closed_port

# delays large against scheduling noise on a busy 2-core machine (10% of 400 ms is 40 ms)
TTFT_S, TPOT_S, LIMIT, OUT = 0.4, 0.05, 4, 11


def _level(doc, conc):
    return next(level for level in doc["levels"] if level["concurrency"] == conc)


def test_knee_at_the_servers_concurrency_limit_and_injected_latencies(run_bench, tmp_path):
    cfg = FakeConfig(ttft_s=TTFT_S, tpot_s=TPOT_S, max_concurrency=LIMIT)
    plot = tmp_path / "ladder.png"
    with FakeServer(cfg) as srv:
        rc, doc, err = run_bench(
            "--url", srv.url, "--concurrency", "1,2,4,8", "--requests", "4", "--output-len", str(OUT),
            "--input-len", "8-16", "--json", "--plot", str(plot),
        )
    assert rc == 0, err
    assert cfg.max_in_flight_seen == LIMIT  # the ladder really drove the server past its limit
    knee = doc["knee"]
    assert knee["concurrency"] == LIMIT, knee
    assert knee["criterion"] == "2x_level1" and knee["broken_at"] == 2 * LIMIT
    assert knee["recommended_max_num_seqs"] == LIMIT
    assert 0 < knee["rate_limit_rps"] < _level(doc, LIMIT)["requests_per_s"]
    for conc in (1, 2, 4):
        level = _level(doc, conc)
        assert level["num_ok"] == max(4, conc) and level["num_errors"] == 0
        assert level["ttft_ms"]["p50"] == pytest.approx(TTFT_S * 1e3, rel=0.10)
        assert level["tpot_ms"]["p50"] == pytest.approx(TPOT_S * 1e3, rel=0.10)
        assert level["itl_ms"]["p50"] == pytest.approx(TPOT_S * 1e3, rel=0.10)
        assert level["total_output_tokens"] == OUT * level["num_ok"]  # from usage
        assert level["num_usage_missing"] == 0
    # beyond the limit half the requests queue behind a whole request: TTFT + (TTFT + (OUT-1) * TPOT)
    top = _level(doc, 8)
    queued_ttft_ms = (2 * TTFT_S + (OUT - 1) * TPOT_S) * 1e3
    assert top["ttft_ms"]["p99"] == pytest.approx(queued_ttft_ms, rel=0.10)
    assert top["tpot_ms"]["p50"] == pytest.approx(TPOT_S * 1e3, rel=0.10)
    assert doc["loadgen_overhead"]["num_errors"] == 0 and doc["loadgen_overhead"]["concurrency"] == 8
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "knee: concurrency 4" in err


def test_a_warm_up_request_keeps_a_cold_servers_first_answer_out_of_level_1_and_the_knee(run_bench):
    args = ("--concurrency", "1,2", "--requests", "4", "--output-len", "3", "--no-loadgen-check", "--json")
    warm_cfg = FakeConfig(ttft_s=0.05, tpot_s=0.01, cold_s=1.5)
    with FakeServer(warm_cfg) as srv:  # the default: --warmup 1
        rc, doc, err = run_bench("--url", srv.url, *args)
    assert rc == 0, err
    # the warm-up shares no prefix with a measured request (it would seed the prefix cache for level 1's first):
    # the workload's own text behind a mark of its own
    texts = [b["prompt"] if "prompt" in b else b["messages"][0]["content"] for b in warm_cfg.bodies]
    assert len(texts) == 1 + 4 + 4 and texts[0].startswith("warm-up 0: "), texts[:2]
    assert texts[0].removeprefix("warm-up 0: ") in texts[1:] and not any(t.startswith("warm-up") for t in texts[1:])
    assert doc["warmup"]["requests"] == 1 and doc["warmup"]["ok"] == 1 and doc["warmup"]["e2e_s"][0] >= 1.5
    assert _level(doc, 1)["ttft_ms"]["p99"] < 1000 and _level(doc, 1)["num_requests"] == 4  # not counted there
    assert "warm-up: 1 request(s) before level 1, counted in no level" in err
    cold_cfg = FakeConfig(ttft_s=0.05, tpot_s=0.01, cold_s=1.5)
    with FakeServer(cold_cfg) as srv:
        rc, doc, err = run_bench("--url", srv.url, *args, "--warmup", "0")
    assert rc == 0, err
    assert doc["warmup"]["requests"] == 0 and cold_cfg.num_arrived == 4 + 4
    assert _level(doc, 1)["ttft_ms"]["p99"] >= 1500  # without it the cold answer sets level 1's P99
    rc, _, err = run_bench("--url", srv.url, *args, "--warmup", "-1")
    assert rc != 0 and "--warmup -1" in err


def test_objectives_set_the_knee_and_goodput_on_the_completions_route(run_bench):
    cfg = FakeConfig(ttft_s=TTFT_S, tpot_s=TPOT_S, max_concurrency=LIMIT)
    with FakeServer(cfg) as srv:
        rc, doc, err = run_bench(
            "--url", srv.url + "/v1", "--route", "completions", "--concurrency", "2,4,8", "--requests", "4",
            "--output-len", str(OUT), "--ttft-slo-ms", "850", "--tpot-slo-ms", "100", "--no-loadgen-check", "--json",
        )
    assert rc == 0, err
    assert doc["knee"]["concurrency"] == LIMIT and doc["knee"]["criterion"] == "objectives"
    assert doc["knee"]["ttft_p99_limit_ms"] == 850
    assert _level(doc, 4)["goodput"]["ratio"] == 1.0
    top = _level(doc, 8)
    assert top["goodput"] == {"num_met": 4, "ratio": 0.5, "requests_per_s": pytest.approx(
        4 / top["duration_s"], rel=0.01)}, (top["ttft_ms"], top["tpot_ms"])
    assert _level(doc, 2)["tpot_ms"]["p50"] == pytest.approx(TPOT_S * 1e3, rel=0.10)


def test_429_500_timeouts_and_broken_streams_are_counted_per_reason(run_bench):
    cfg = FakeConfig(ttft_s=0.01, tpot_s=0.005, pattern=(200, 429, 500, "hang", "drop"))
    with FakeServer(cfg) as srv:
        rc, doc, err = run_bench(
            "--url", srv.url, "--concurrency", "1,2", "--requests", "5", "--output-len", "3",
            "--timeout", "1", "--no-loadgen-check", "--json",
        )
    assert rc == 0, err
    for level in doc["levels"]:
        assert level["num_requests"] == 5 and level["num_ok"] == 1
        assert level["errors"] == {"connection_lost": 1, "http_429": 1, "http_500": 1, "timeout": 1}
        assert level["error_rate"] == 0.8
        assert "queue full" in level["error_examples"]["http_429"]
    assert doc["knee"]["concurrency"] is None  # 80% errors at the first level: no capacity to claim
    assert "http_429: 1" in err
    with FakeServer(FakeConfig(ttft_s=0.1, tpot_s=0.01, pattern=(200,) * 9 + (429,))) as srv:
        rc, doc, err = run_bench("--url", srv.url, "--concurrency", "1,2", "--requests", "10", "--output-len", "2",
                                 "--no-loadgen-check", "--json", "--max-error-rate", "0.2")
    assert rc == 0, err
    assert [lv["errors"] for lv in doc["levels"]] == [{"http_429": 1}, {"http_429": 1}]
    assert doc["knee"]["concurrency"] == 2 and doc["knee"]["max_error_rate"] == 0.2


def test_server_down_is_counted_and_reported_not_a_crash(run_bench):
    url = f"http://127.0.0.1:{closed_port()}"
    rc, doc, err = run_bench("--url", url, "--concurrency", "1,2", "--requests", "3", "--no-loadgen-check",
                             "--json", "--timeout", "5")
    assert rc == 1, err
    assert [lv["errors"] for lv in doc["levels"]] == [{"connect_error": 3}, {"connect_error": 3}]
    assert doc["model"] is None
    assert "Traceback" not in err
    assert f"no request to {url} succeeded (connect_error: 6)" in err


def test_api_key_from_env_and_bad_flags(run_bench):
    rc, _, err = run_bench("--url", "http://127.0.0.1:1", "--api-key-env", "BENCH_TEST_KEY_UNSET")
    assert rc == 2 and "BENCH_TEST_KEY_UNSET" in err and "Traceback" not in err
    rc, _, err = run_bench("--url", "http://127.0.0.1:1", "--concurrency", "0,4")
    assert rc == 2 and "--concurrency '0,4'" in err
    rc, _, err = run_bench("--url", "http://127.0.0.1:1", "--output-len", "normal:abc")
    assert rc == 2 and "--output-len 'normal:abc'" in err
    rc, _, err = run_bench("--url", "http://127.0.0.1:1", "--plot", "/nonexistent-dir/ladder.png")
    assert rc == 2 and "/nonexistent-dir" in err and "Traceback" not in err
    rc, _, err = run_bench("--url", "127.0.0.1:8000")
    assert rc == 2 and "not an http(s) URL" in err


def test_api_key_is_read_from_the_environment(run_bench):
    cfg = FakeConfig(ttft_s=0.01, tpot_s=0.005)
    with FakeServer(cfg) as srv:
        rc, _, err = run_bench("--url", srv.url, "--concurrency", "1", "--requests", "2", "--output-len", "2",
                               "--no-loadgen-check", "--api-key-env", "BENCH_KEY", env={"BENCH_KEY": "sk-bench"})
        assert rc == 0, err
        assert cfg.auth_seen == ["Bearer sk-bench"] * 3  # the warm-up request and the two measured ones
        rc, _, err = run_bench("--url", srv.url, "--concurrency", "1", "--requests", "1", "--output-len", "2",
                               "--no-loadgen-check", env={"OPENAI_API_KEY": "sk-openai"})
        assert rc == 0, err
        assert cfg.auth_seen[-1] == "Bearer sk-openai"
