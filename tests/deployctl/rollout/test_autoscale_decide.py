"""deployctl.rollout.autoscale.decide: the thresholds, the hysteresis band, the cooldown and the min/max bounds,
each decision's reason naming its numbers; and the autoscale: section's defaults and bad values."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from deployctl.config.autoscale import AutoscaleConfig
from deployctl.rollout.autoscale import Window, decide

AUTO = AutoscaleConfig()


def _d(kv, waiting=(0, 0, 0), p99=None, serving=("a", "b"), warm=("w",), auto=AUTO, since=None, n_hosts=3):
    return decide(Window(kv, waiting, p99), serving=list(serving), warm=list(warm), auto=auto, ttft_slo_s=2.0,
                  n_hosts=n_hosts, since_last_s=since)


def test_kv_above_85_sustained_scales_out_onto_the_first_warm_host():
    d = _d([0.9, 0.92, 0.88])
    assert (d.action, d.hosts) == ("out", ["w"])
    assert "85%" in d.reason and "88%" in d.reason and "2 -> 3" in d.reason
    assert d.numbers["kv_usage_min"] == 0.88
    # one scrape at or under 85% is not sustained
    assert _d([0.9, 0.85, 0.95]).action == "none"


def test_waiting_scales_out_only_while_p99_ttft_misses_the_objective():
    assert _d([0.5] * 3, waiting=(3, 4, 2), p99=2.5).action == "out"
    d = _d([0.5] * 3, waiting=(3, 4, 2), p99=1.5)  # a queue inside the objective: nothing
    assert d.action == "none" and "within the band" in d.reason
    assert _d([0.5] * 3, waiting=(3, 0, 2), p99=2.5).action == "none"  # a queue that emptied once: not sustained


def test_hysteresis_band_and_scale_in_of_the_last_serving_host():
    d = _d([0.1, 0.12, 0.05], serving=("a", "b", "c"), n_hosts=3)
    assert (d.action, d.hosts) == ("in", ["c"])
    assert "30%" in d.reason and "18%" in d.reason  # 12% over 3 hosts is 18% on 2
    # inside the band (30%..85%): nothing either way
    assert _d([0.5, 0.6, 0.4], serving=("a", "b", "c")).action == "none"
    # quiet, but the hosts left would cross the in threshold: kept (0.2 x 3/2 = 0.3)
    d = _d([0.2] * 3, serving=("a", "b", "c"))
    assert d.action == "none" and "keeping 3" in d.reason
    # something waiting: no scale in
    assert _d([0.05] * 3, waiting=(0, 1, 0), serving=("a", "b", "c")).action == "none"


def test_cooldown_decides_nothing_and_says_why():
    d = _d([0.95] * 3, since=120)
    assert d.action == "none" and "120 s ago" in d.reason and "cooldown_s 300" in d.reason
    assert _d([0.95] * 3, since=301).action == "out"


def test_bounds_refuse_with_the_reason():
    d = _d([0.95] * 3, serving=("a", "b", "w"), warm=(), n_hosts=3)  # every host serves: at max
    assert d.action == "none" and "max_hosts 3" in d.reason
    d = _d([0.95] * 3, warm=(), auto=AutoscaleConfig(max_hosts=5))
    assert d.action == "none" and "no warm host" in d.reason
    d = _d([0.01] * 3, serving=("a", "b"))  # default min 2 on a 3-host deploy.yaml
    assert d.action == "none" and "min_hosts 2" in d.reason
    d = _d([0.01] * 3, serving=("a",), warm=(), n_hosts=1)  # one host: min 1, never in
    assert d.action == "none"


def test_config_defaults_and_bad_values():
    assert AUTO.bounds(1) == (1, 1) and AUTO.bounds(4) == (2, 4)
    assert AutoscaleConfig(window_s="2m", cooldown_s="10m").window_s == 120
    with pytest.raises(ValidationError, match="min_hosts 3 is above autoscale.max_hosts 2"):
        AutoscaleConfig(min_hosts=3, max_hosts=2)
    with pytest.raises(ValidationError, match="hysteresis"):
        AutoscaleConfig(scale_in_kv_usage=0.9)
