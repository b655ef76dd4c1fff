"""C34 and the runtime's own log, against the real runtime on CPU with the tiny model and a small context
(--max-model-len 256: the default workload, 128 prompt words + 128 tokens, does not fit it): the default bench is
fitted and succeeds; explicit lengths that cannot fit are refused before any request, with the numbers; a level
whose requests all fail names the code and the reason; --from-log reads the runtime's real request log."""
from __future__ import annotations

import json

import pytest
from bench_helpers import make_tiny_model, serve_runtime
from test_bench_runtime import _has_runtime_cli

from deployctl.bench import fromlog

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not _has_runtime_cli(), reason="the runtime (python -m deployctl_runtime) is not on this branch"),
]

CONTEXT = 256


@pytest.fixture(scope="module")
def small_context(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fit")
    log = tmp / "serve.log"
    with serve_runtime(make_tiny_model(tmp), log, "--max-model-len", str(CONTEXT), "--max-num-seqs", "4") as url:
        yield url, log


def _requests_logged(log) -> int:
    return sum(1 for line in log.read_text().splitlines() if "request_id=" in line and "completions" in line)


def test_default_workload_is_fitted_to_max_model_len_and_succeeds(run_bench, small_context):
    url, _ = small_context
    rc, doc, err = run_bench("--url", url, "--concurrency", "1,2", "--requests", "4", "--no-loadgen-check", "--json",
                             timeout=300)
    assert rc == 0, err
    assert doc["max_model_len"] == CONTEXT and doc["workload"]["tokens_per_word"] > 1
    assert int(doc["workload"]["input_len"]) < 128 and int(doc["workload"]["output_len"]) <= CONTEXT // 4
    assert all(level["num_errors"] == 0 and level["num_ok"] >= 4 for level in doc["levels"])
    assert f"workload fitted to max_model_len {CONTEXT}" in err


def test_explicit_lengths_that_cannot_fit_are_refused_before_any_request(run_bench, small_context):
    url, log = small_context
    before = _requests_logged(log)
    rc, _, err = run_bench("--url", url, "--input-len", "600", "--concurrency", "1", "--requests", "2",
                           "--no-loadgen-check")
    last = err.strip().splitlines()[-1]
    assert rc == 2, err
    assert "600 words" in last and f"max_model_len {CONTEXT}" in last and "--input-len" in last
    assert _requests_logged(log) == before  # not one request was sent


def test_a_level_that_all_fails_names_the_code_the_reason_and_the_numbers(run_bench, small_context, tmp_path):
    url, _ = small_context
    ds = tmp_path / "long.jsonl"
    ds.write_text(json.dumps({"prompt": " ".join(["water"] * 400), "max_tokens": 8}) + "\n")
    rc, doc, err = run_bench("--url", url, "--dataset", str(ds), "--route", "completions", "--concurrency", "1",
                             "--requests", "3", "--no-loadgen-check", "--json")
    assert rc == 1, err
    assert doc["levels"][0]["error_codes"] == {"http_400 context_length_exceeded": 3}
    summary = next(line for line in err.splitlines() if line.startswith("errors at concurrency 1"))
    assert "all 3 requests: http_400 context_length_exceeded" in summary
    assert f"maximum context length is {CONTEXT}" in summary and f"against max_model_len {CONTEXT}" in summary
    last = err.strip().splitlines()[-1]
    assert "context_length_exceeded" in last and "--input-len" in last


def test_from_log_reads_the_runtimes_own_request_log(run_bench, small_context):
    url, log = small_context
    logged = fromlog.parse_log(log)
    assert len(logged.entries) >= 8 and all(p > 0 and c > 0 for _, p, c in logged.entries)
    rc, doc, err = run_bench("--url", url, "--from-log", str(log), "--concurrency", "2", "--requests", "6",
                             "--no-loadgen-check", "--json", timeout=300)
    assert rc == 0, err
    assert doc["workload"]["log_requests"] == len(logged.entries) and doc["loop"] == "open"
    assert doc["levels"][0]["num_errors"] == 0, (doc["levels"][0].get("errors"), doc.get("warmup"), err[-2000:])
