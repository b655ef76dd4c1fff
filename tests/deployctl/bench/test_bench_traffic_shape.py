"""The service's own traffic shape: --from-log rebuilds the length distribution and arrival pattern from the
runtime's access log (token counts and times only); --dataset reads ShareGPT JSON as the field's benchmarks do."""
from __future__ import annotations

import json
import math
import random
from datetime import datetime, timedelta

import pytest
from bench_fake_server import FakeConfig, FakeServer

from deployctl.bench import fromlog
from deployctl.bench.fit import TokenEstimate
from deployctl.bench.stats import percentile
from deployctl.errors import ConfigError

RATE = 8.0  # requests/s in the synthetic log


def write_runtime_log(path, num: int, seed: int = 1, rate: float = RATE) -> tuple[list[int], list[int]]:
    """A log in the runtime's format (deployctl_runtime.server: `%(asctime)s %(levelname)s %(name)s: %(message)s`
    and the access line of server/middleware.py), ``num`` requests with Poisson arrivals at ``rate``, prompt
    tokens uniform 20..400 and completion tokens lognormal (median 60). Also other log lines and a 400. Returns the
    logged (prompt tokens, completion tokens)."""
    rng = random.Random(seed)
    t = datetime(2026, 12, 1, 8, 0, 0)
    lines, prompts, outs = ["2026-12-01 07:59:59,000 INFO deployctl_runtime.server: ready: serving model 'tiny'"], [], []
    events = []
    for i in range(num):
        t += timedelta(seconds=rng.expovariate(rate))
        p, c = rng.randint(20, 400), max(1, round(rng.lognormvariate(math.log(60), 0.6)))
        total_ms = 50 + 5 * c + rng.random() * 30
        prompts.append(p)
        outs.append(c)
        events.append((t + timedelta(milliseconds=total_ms), f"request_id=chatcmpl-{i:04x} method=POST "
                       f"path=/v1/chat/completions status=200 prompt_tokens={p} completion_tokens={c} ttft_ms=12.5 "
                       f"total_ms={total_ms:.1f} finish=length"))
    events.append((t, "request_id=cmpl-bad method=POST path=/v1/completions status=400 prompt_tokens=0 "
                      "completion_tokens=0 ttft_ms=- total_ms=1.0 finish=-"))
    for end, msg in sorted(events):  # logged when each request ends, so out of arrival order
        stamp = end.strftime("%Y-%m-%d %H:%M:%S,") + f"{end.microsecond // 1000:03d}"
        lines.append(f"{stamp} INFO deployctl_runtime.access: {msg}")
    path.write_text("\n".join(lines) + "\n")
    return prompts, outs


def _close(got: list[float], want: list[float], rel: float) -> list[tuple]:
    bad = []
    for q in (0.1, 0.25, 0.5, 0.75, 0.9):
        g, w = percentile(got, q), percentile(want, q)
        if abs(g - w) > rel * w:
            bad.append((q, g, w))
    return bad


def test_from_log_rebuilds_lengths_within_5pct_and_the_rate_within_10pct(tmp_path):
    log = tmp_path / "serve.log"
    prompts, outs = write_runtime_log(log, 200)
    shape = fromlog.parse_log(log)
    assert len(shape.entries) == 200  # the 400 and the other lines are skipped
    assert shape.rate == pytest.approx(RATE, rel=0.2)  # the log's own Poisson sample
    est = TokenEstimate(per_word=1.9, overhead=12, measured=True)  # the server makes 1.9 tokens of a word
    reqs = fromlog.requests_from_log(shape, 2000, seed=3, words_for=lambda prompt, _out: est.words_for(prompt))
    got_prompt_tokens = [est.tokens(len(r.prompt.split())) for r in reqs]
    assert _close(got_prompt_tokens, prompts, 0.05) == []
    assert _close([r.max_tokens for r in reqs], outs, 0.05) == []
    times = list(fromlog.arrival_times(shape.gaps, shape.rate, 2000, seed=3))
    assert (len(times) - 1) / times[-1] == pytest.approx(shape.rate, rel=0.10)
    faster = list(fromlog.arrival_times(shape.gaps, 2 * shape.rate, 2000, seed=3))  # --rate rescales the gaps
    assert (len(faster) - 1) / faster[-1] == pytest.approx(2 * shape.rate, rel=0.10)


def test_from_log_drives_an_open_loop_at_the_logs_rate(run_bench, tmp_path):
    log = tmp_path / "serve.log"
    _, outs = write_runtime_log(log, 60, rate=20.0)
    cfg = FakeConfig(ttft_s=0.01, tpot_s=0.0005, max_concurrency=16)
    with FakeServer(cfg) as srv:
        rc, doc, err = run_bench("--url", srv.url, "--from-log", str(log), "--concurrency", "16", "--requests", "40",
                                 "--no-loadgen-check", "--json")
    assert rc == 0, err
    (level,) = doc["levels"]
    shape = fromlog.parse_log(log)
    assert doc["loop"] == "open" and doc["config"]["rate"] == pytest.approx(shape.rate)
    assert doc["workload"]["kind"] == "from_log" and doc["workload"]["log_requests"] == 60
    assert {b["max_tokens"] for b in cfg.bodies} <= set(outs)
    assert level["num_ok"] == 40 and level["achieved_rate"] == pytest.approx(level["scheduled_rate"], rel=0.1)
    assert "replaying the shape of 60 logged requests" in err


def test_from_log_without_request_lines_is_a_config_error(run_bench, tmp_path):
    log = tmp_path / "other.log"
    log.write_text("2026-12-01 08:00:00,000 INFO something: hello\n")
    with pytest.raises(ConfigError, match="no completed inference request"):
        fromlog.parse_log(log)
    rc, _, err = run_bench("--url", "http://127.0.0.1:9", "--from-log", str(log), "--no-loadgen-check", "--model", "m")
    assert rc == 3 and str(log) in err.strip().splitlines()[-1]


def test_sharegpt_dataset_first_human_turn_and_answer_length(run_bench, tmp_path):
    data = [
        {"id": "a", "conversations": [{"from": "human", "value": "What is a block table?"},
                                      {"from": "gpt", "value": " ".join(["word"] * 9)}]},
        {"id": "b", "conversations": [{"from": "system", "value": "be brief"}, {"from": "human", "value": "Hi there"},
                                      {"from": "gpt", "value": "Hello! How can I help?"}, {"from": "human", "value": "x"}]},
        {"id": "c", "conversations": [{"from": "human", "value": "only one turn"}]},
    ]
    ds = tmp_path / "sharegpt.json"
    ds.write_text(json.dumps(data))
    cfg = FakeConfig(ttft_s=0.01, tpot_s=0.002)
    with FakeServer(cfg) as srv:
        rc, doc, err = run_bench("--url", srv.url, "--dataset", str(ds), "--concurrency", "1", "--requests", "6",
                                 "--no-loadgen-check", "--json")
    assert rc == 0, err
    sent = {(b["messages"][0]["content"], b["max_tokens"]) for b in cfg.bodies}
    # 9 and 5 words at 4/3 tokens per word; the one warm-up request carries its own mark in front
    assert sent == {("What is a block table?", 12), ("Hi there", 7), ("warm-up 0: What is a block table?", 12)}
    assert doc["workload"]["kind"] == "dataset"
