"""deployctl.promhist against prometheus_client's own exposition and parser, and hand-computed quantiles."""
from __future__ import annotations

import math
import random

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from deployctl import promhist

BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


def _registry():
    reg = CollectorRegistry()
    h = Histogram("demo_ttft_seconds", "TTFT", ["model_name"], buckets=BOUNDS, registry=reg)
    c = Counter("demo_rejected", "rejected", ["reason"], registry=reg)
    return reg, h, c


def test_parser_agrees_with_prometheus_client_on_every_sample():
    reg, h, c = _registry()
    rng = random.Random(1)
    for _ in range(200):
        h.labels(model_name=rng.choice(['a"b\\c', "plain\nname"])).observe(rng.random() * 0.6)
    c.labels(reason="queue_full").inc(3)
    text = generate_latest(reg).decode()
    ours = {(s.name, s.labels): s.value for s in promhist.parse_text(text)}
    theirs = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text) for s in fam.samples
    }
    assert ours == theirs


def test_window_quantiles_follow_histogram_quantile():
    reg, h, _ = _registry()
    for v in (0.3,) * 10:  # before the window
        h.labels(model_name="m").observe(v)
    before = promhist.parse_text(generate_latest(reg).decode())
    # window: 50 in (0.01, 0.025], 40 in (0.025, 0.05], 10 in (0.1, 0.25]; split over two label sets
    for i, v in enumerate([0.02] * 50 + [0.03] * 40 + [0.2] * 10):
        h.labels(model_name="m" if i % 2 else "n").observe(v)
    after = promhist.parse_text(generate_latest(reg).decode())
    win = promhist.histogram(after, "demo_ttft_seconds") - promhist.histogram(before, "demo_ttft_seconds")
    assert win.count == 100 and win.sum == pytest.approx(50 * 0.02 + 40 * 0.03 + 10 * 0.2)
    # rank 50 is the last of bucket (0.01, 0.025]: its upper bound
    assert win.quantile(0.5) == pytest.approx(0.025)
    # rank 70: 20 of 40 into (0.025, 0.05]
    assert win.quantile(0.7) == pytest.approx(0.025 + 0.025 * 20 / 40)
    # rank 99: 9 of 10 into (0.1, 0.25]
    assert win.quantile(0.99) == pytest.approx(0.1 + 0.15 * 9 / 10)
    assert win.bucket_of(0.2) == (0.1, 0.25)
    only_m = promhist.histogram(after, "demo_ttft_seconds", {"model_name": "m"})
    assert only_m.count == 10 + 50


def test_edge_cases_match_prometheus():
    assert math.isnan(promhist.histogram_quantile(0.5, [(1.0, 0), (math.inf, 0)]))
    assert math.isnan(promhist.histogram_quantile(0.5, [(1.0, 3)]))  # no +Inf bucket
    # rank in the +Inf bucket: the highest finite bound
    assert promhist.histogram_quantile(0.99, [(1.0, 1), (2.0, 2), (math.inf, 10)]) == 2.0
    # first bucket interpolates from 0
    assert promhist.histogram_quantile(0.5, [(1.0, 10), (math.inf, 10)]) == pytest.approx(0.5)
    assert promhist.histogram_quantile(1.5, [(1.0, 10), (math.inf, 10)]) == math.inf
    assert promhist.histogram([], "absent").count == 0


def test_counter_reset_and_bad_lines_are_errors():
    h1 = promhist.Histogram([(1.0, 5), (math.inf, 5)], 5, 1.0)
    h0 = promhist.Histogram([(1.0, 2), (math.inf, 2)], 2, 0.5)
    with pytest.raises(ValueError, match="counter reset"):
        h0 - h1
    with pytest.raises(promhist.PromParseError, match="metrics line 2"):
        promhist.parse_text("ok_metric 1\nbad metric line here x\n")
    with pytest.raises(promhist.PromParseError, match="bad value"):
        promhist.parse_text("m{a=\"b\"} notanumber\n")
