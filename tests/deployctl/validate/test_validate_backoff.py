"""The stability layer against a server that fails every request (issue 26): the load backs off — a burst of
nothing but errors stops after its first few requests, the gap after it doubles, three such bursts stop the load
and fail naming the error — instead of a closed loop of instant errors (~700 requests/s against `transformers
serve` before). A server that exports no /metrics (404) is "cannot judge", not a failure. Real HTTP: the bench
stand-in server (FastAPI + uvicorn)."""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from bench_fake_server import FakeConfig, FakeServer  # noqa: E402

from deployctl.bench.client import Target  # noqa: E402
from deployctl.bench.ladder import LadderConfig  # noqa: E402
from deployctl.bench.workload import BenchRequest  # noqa: E402
from deployctl.validate.stability import Backoff, StabilityConfig, run_stability  # noqa: E402

REQS = [BenchRequest(prompt="one two three", messages=None, max_tokens=4)]


def _run(srv: FakeServer, metrics: str, duration_s: float, gap_s: float = 0.2):
    cfg = StabilityConfig(duration_s=duration_s, concurrency=4, burst_s=3.0, gap_s=gap_s, interval_s=0.5)
    ladder = LadderConfig(target=Target(srv.url, model="fake-model"), timeout=10.0)
    t0 = time.monotonic()
    res = run_stability(cfg, ladder, REQS, (srv.url + metrics,), gpu=lambda: None)
    return res, time.monotonic() - t0


def test_load_that_fails_every_request_backs_off_and_stops_naming_the_error():
    cfg = FakeConfig(ttft_s=0.0, tpot_s=0.0, pattern=(500,))
    with FakeServer(cfg) as srv:
        res, wall = _run(srv, "/metrics", duration_s=60.0)
    load = res.details["signals"]["load"]
    # three bursts that each stopped after its first max(8, concurrency) failures (+ those already in flight)
    assert load["bursts"] == Backoff.STOP_AFTER and load["backed_off"] == Backoff.STOP_AFTER - 1
    assert load["requests"] <= Backoff.STOP_AFTER * (Backoff.FAIL_FAST + 4) and cfg.num_arrived == load["requests"]
    assert wall < 20  # stopped: not the 60 s of --duration (gaps 0.4 s and 0.8 s, bursts of milliseconds)
    assert res.verdict == "fail"
    stop = [p for p in res.problems if p.startswith("load stopped after 3 bursts in a row")]
    assert stop and "http_500" in stop[0], res.problems
    assert "backed off 2 time(s)" in res.summary


def test_one_success_resets_the_backoff():
    b = Backoff(StabilityConfig(duration_s=10, concurrency=2, gap_s=1.0))
    failed, ok = type("R", (), {"ok": False, "error": "http_500"})(), type("R", (), {"ok": True, "error": ""})()
    for want in (2.0, 4.0):
        b.start_burst()
        for _ in range(8):
            b.done(failed)
        assert b.failing_fast() and b.gap_after_burst() == want
    b.start_burst()
    b.done(failed)
    b.done(ok)
    assert not b.failing_fast() and b.gap_after_burst() == 1.0 and b.streak == 0 and not b.stopped


def test_a_server_without_metrics_is_cannot_judge_not_a_failure():
    cfg = FakeConfig(ttft_s=0.001, tpot_s=0.001)
    with FakeServer(cfg) as srv:
        res, _ = _run(srv, "/no-metrics-here", duration_s=2.0)
    assert res.verdict == "pass", res.problems
    assert "cannot judge restarts, KV usage, memory, queue or preemptions" in res.summary
    assert "answers 404" in res.summary and res.details["signals"]["load"]["errors"] == 0
