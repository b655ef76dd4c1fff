"""deployctl deploy's verdict (rollout.analysis.judge) on every window of tests/data/analysis_cases.yaml: the same
table the AnalysisTemplate's PromQL is run on under promtool (tests/deployctl/render/test_render_analysis_promql.py)."""
from __future__ import annotations

import pytest

from deployctl.rollout.analysis import GroupStats, judge
from support.analysis_cases import CASES, IDS, config, e2e, kv


def _stats(side: dict | None, hosts: list[str]) -> GroupStats:
    if side is None:
        return GroupStats(hosts=hosts)
    samples = side["requests"] - side["errors"]
    return GroupStats(hosts=hosts, requests=side["requests"], errors=side["errors"], generations=side["requests"],
                      p99_ttft_s=side["ttft_p99_s"] if samples else None,
                      p99_tpot_s=side["tpot_p99_s"] if samples else None,
                      p99_e2e_s=e2e(side) if samples else None, ttft_count=samples, kv_usage=kv(side))


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_judge_gives_the_table_verdict(case):
    cfg = config()
    v = judge(cfg, _stats(case["canary"], ["gpu-b"]), _stats(case["stable"], ["gpu-a"]), 60.0, 25)
    assert v.result == case["verdict"], v.summary()
