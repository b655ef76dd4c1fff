"""Pure parts of validate: the access-log facts of the failover layer, the slope, the duration flag, the stream
comparison and the U+FFFD rule, on recorded inputs."""
from __future__ import annotations

import json

import pytest

from deployctl.cli.params import duration
from deployctl.errors import UsageError
from deployctl.validate.client import Reply
from deployctl.validate.failover import access_facts
from deployctl.validate.functional import Case, judge
from deployctl.validate.series import slope_per_h, thirds

VICTIM = "127.0.0.1:9002"


def _line(msec, addrs, connects, method="POST", uri="/v1/chat/completions"):
    return json.dumps({"msec": msec, "request_method": method, "uri": uri, "upstream_addr": addrs,
                       "upstream_connect_time": connects, "status": 200})


def test_access_facts_tell_a_connect_retry_from_a_resent_post():
    text = "\n".join([
        _line(100.5, "127.0.0.1:9001", "0.001"),
        _line(101.2, f"{VICTIM}, 127.0.0.1:9001", "-, 0.001"),  # refused: nothing reached the victim
        _line(101.9, f"{VICTIM}, 127.0.0.1:9001", "0.002, 0.001"),  # connected first: the POST was sent twice
        _line(102.0, "127.0.0.1:9001", "0.001", method="GET", uri="/v1/models"),
        "not json",
    ])
    facts = access_facts(text, VICTIM, kill_at=101.0, back_at=110.0)
    assert facts == {"log_requests": 3, "retried": 2, "resent": 1, "router_stopped_s": 0.9}
    assert access_facts(text, VICTIM, kill_at=101.95, back_at=110.0)["router_stopped_s"] is None


def test_slope_per_hour_and_thirds():
    assert slope_per_h([(0, 0.0), (60, 0.1), (120, 0.2)]) == pytest.approx(6.0)
    assert slope_per_h([(5, 1.0)]) is None and slope_per_h([(5, 1.0), (5, 2.0)]) is None
    assert thirds([1, 1, 1, 5, 5, 5]) == (1.0, 5.0)


@pytest.mark.parametrize("text,seconds", [("90", 90.0), ("90s", 90.0), ("10m", 600.0), ("1.5h", 5400.0)])
def test_duration_units(text, seconds):
    assert duration("--duration")(text) == seconds


@pytest.mark.parametrize("text", ["0", "-5m", "ten", "5d", "inf"])
def test_bad_durations_are_usage_errors(text):
    with pytest.raises(UsageError, match="--duration"):
        duration("--duration")(text)


def test_fffd_the_tokens_explain_warns_and_fffd_beyond_them_fails():
    case = Case("short", "chat", [{"role": "user", "content": "hi"}], 4)
    own = Reply(200, text="a\ufffdb", finish_reason="length", completion_tokens=4, token_ids=[1, 2, 3, 4])
    res = judge(case, own, 8, lambda ids: "a\ufffdb")
    assert res.ok and res.checks["invalid_utf8"] == "warn"
    res = judge(case, own, 8, lambda ids: "axb")
    assert not res.ok and res.problems[0].startswith("invalid_utf8 on 'short' (chat): text has 1 U+FFFD")
    # no token ids (a server that refuses return_token_ids): the model's bytes cannot be told from the server's, so
    # validate says it cannot judge them (issue 26) instead of failing the server
    res = judge(case, Reply(200, text="\ufffd!", finish_reason="stop", completion_tokens=2), 8, lambda ids: None)
    assert res.ok and res.checks["invalid_utf8"] == "warn"
    assert res.warnings[0].startswith("invalid_utf8 on 'short': cannot judge 1 U+FFFD: the server returns no token ids")


def test_an_unexpected_status_and_a_missing_finish_fail_by_name():
    case = Case("over-long", "chat", [{"role": "user", "content": "x"}], 4, expect=400)
    res = judge(case, Reply(200, text="ok", finish_reason="stop"), 8, lambda ids: None)
    assert res.problems == ["status on 'over-long' (chat): expected HTTP 400, got 200"]
    case = Case("long-stream", "chat", [{"role": "user", "content": "x"}], 4, stream=True)
    res = judge(case, Reply(200, text="abc", completion_tokens=3, stream_error="the stream ended without data: "
                            "[DONE]"), 8, lambda ids: None)
    assert res.problems[0] == "error on 'long-stream' (chat, stream): the stream ended without data: [DONE]"
    # a finish_reason came, then no [DONE] (transformers serve): not OpenAI's end marker, but the answer is whole
    res = judge(case, Reply(200, text="abc", completion_tokens=4, finish_reason="length", no_done=True), 8,
                lambda ids: None)
    assert res.ok and res.checks["error"] == "warn" and "without data: [DONE]" in res.warnings[0]


def _samples(n_bursts=6, rss_mib_per_burst=0.0, gpu_mib_per_burst=None, restart_at=None, waiting_up=False):
    from deployctl.validate.stability import Sample

    out, t, src = [], 0.0, "http://h:1/metrics"
    for b in range(n_bursts + 1):
        for k in range(3):
            phase = "idle" if b == 0 else ("gap_end" if k == 2 else "load")
            v = {"kv_usage": 0.0 if phase != "load" else 0.3, "waiting": (b if waiting_up else 0.0) if phase == "load" else 0.0,
                 "running": 2.0, "preemptions": 0.0, "rss_bytes": (500 + b * rss_mib_per_burst) * 2 ** 20,
                 "start_time": 1000.0 if restart_at is None or b < restart_at else 2000.0,
                 "gpu_memory_bytes": None if gpu_mib_per_burst is None else (40000 + b * gpu_mib_per_burst) * 2 ** 20}
            out.append(Sample(t, src, phase, b, v))
            t += 10.0
    return out, [(30.0 * b, 30.0 * b + 20) for b in range(1, n_bursts + 1)]


class _Ok:
    ok, error = True, None


def test_stability_verdicts_on_recorded_samples():
    """NVML facts recorded as a growing series (no GPU here): the memory slope rule, restarts and the queue trend."""
    from deployctl.validate.stability import StabilityConfig, _judge

    cfg = StabilityConfig(duration_s=200, concurrency=4)
    samples, bursts = _samples()
    problems, signals = _judge(cfg, samples, [_Ok()] * 50, bursts)
    assert problems == [] and signals["http://h:1/metrics"]["kv_usage"]["after_bursts"] == [0.0] * 6
    samples, bursts = _samples(gpu_mib_per_burst=100.0)  # +100 MiB per 30 s burst: about 12000 MiB/h
    problems, signals = _judge(cfg, samples, [_Ok()] * 50, bursts)
    slope = signals["http://h:1/metrics"]["gpu_memory"]["slope_mib_per_h"]
    assert 11000 < slope < 13000
    assert problems == [f"gpu_memory on http://h:1/metrics: slope {slope:+.0f} MiB/h > 1024 MiB/h (40100 -> 40600 MiB)"]
    samples, bursts = _samples(rss_mib_per_burst=1.0)  # +120 MiB/h but only 5 MiB in all: noise, not a leak
    assert _judge(cfg, samples, [_Ok()] * 50, bursts)[0] == []
    samples, bursts = _samples(restart_at=3, waiting_up=True)
    problems, _ = _judge(cfg, samples, [_Ok()] * 50, bursts)
    assert any(p.startswith("restarts on http://h:1/metrics: process start time changed 1 time(s)") for p in problems)
    assert any(p.startswith("queue_depth on http://h:1/metrics: waiting requests trend up") for p in problems)


def test_metrics_that_never_answer_are_named_not_taken_for_a_restart():
    from deployctl.validate.stability import Sample, StabilityConfig, _judge

    samples = [Sample(float(t), "http://h:1/metrics", "load", 1, {}, error="ConnectError: refused") for t in range(5)]
    problems, _ = _judge(StabilityConfig(duration_s=5, concurrency=2), samples, [_Ok()] * 10, [(0.0, 5.0)])
    assert problems == ["metrics on http://h:1/metrics: never answered from here (ConnectError: refused); "
                        "nothing to judge"]
