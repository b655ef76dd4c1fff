"""Side by side on two real runtimes of the same tiny model, B with the token-delay fault
(DEPLOYCTL_RUNTIME_FAULT=token_delay_ms=N: N ms more per engine step): the B/A P50 TPOT ratio is the injected
one within 20%, each side has its knee, the verdict names the slow one, and both got the same requests in the
same order (the runtimes' own access logs)."""
from __future__ import annotations

import pytest
from bench_helpers import make_tiny_model, serve_runtime
from test_bench_runtime import _has_runtime_cli

from deployctl.bench import fromlog

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not _has_runtime_cli(), reason="the runtime (python -m deployctl_runtime) is not on this branch"),
]

DELAY_MS = 40.0
OUT = 8


def test_slow_runtime_shows_in_the_ratios_knees_and_verdict(run_bench, tmp_path):
    model = make_tiny_model(tmp_path)
    log_a, log_b = tmp_path / "a.log", tmp_path / "b.log"
    fault = {"DEPLOYCTL_RUNTIME_FAULT": f"token_delay_ms={DELAY_MS:g}"}
    with serve_runtime(model, log_a, "--max-num-seqs", "4") as url_a, \
            serve_runtime(model, log_b, "--max-num-seqs", "4", env=fault) as url_b:
        rc, doc, err = run_bench("--url", url_a, "--url", url_b, "--concurrency", "1,2", "--requests", "4",
                                 "--input-len", "4-24", "--output-len", str(OUT), "--ignore-eos", "--seed", "3",
                                 "--no-loadgen-check", "--json", timeout=400)
    assert rc == 0, err
    a, b = doc["sides"]["A"], doc["sides"]["B"]
    for la, lb, ratio in zip(a["levels"], b["levels"], doc["comparison"]["levels"]):
        assert la["num_errors"] == lb["num_errors"] == 0
        injected = (la["tpot_ms"]["p50"] + DELAY_MS) / la["tpot_ms"]["p50"]
        assert ratio["tpot_p50"] == pytest.approx(injected, rel=0.2), (la["tpot_ms"], lb["tpot_ms"])
        assert ratio["output_tokens_per_s"] < 1
    # each side's own knee (2x its level-1 P99: level 1 holds by definition; a CPU runtime's P99 of 4 requests
    # at 2 concurrent may or may not hold); by A's limits B, 40 ms slower per token, holds at no level
    knee_a = a["knee"]["concurrency"]
    assert knee_a in (1, 2) and b["knee"]["concurrency"] in (1, 2)
    assert doc["comparison"]["knees"] == {"A": knee_a, "B": None}
    assert doc["verdict"].startswith("A holds") and f"up to {knee_a} concurrent" in doc["verdict"]
    assert ", B at no level;" in doc["verdict"]
    assert "knee A" in err and "knee B" in err and "verdict: A holds" in err
    # the same requests in the same order: at concurrency 1 the logs list them one after the other
    served_a = [p for _, p, _ in fromlog.parse_log(log_a).entries]
    served_b = [p for _, p, _ in fromlog.parse_log(log_b).entries]
    probes = len(served_a) - len(served_b)  # side A also answered the probes that fit the workload
    assert probes > 0 and served_a[probes:probes + 4] == served_b[:4]
    assert sorted(served_a[probes:]) == sorted(served_b)
