"""Acceptance: a ladder against the real runtime on CPU with the tiny model agrees with the runtime's own
/metrics histograms over the same window: counts equal, percentiles within bucket resolution."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from bench_fake_server import closed_port
from bench_helpers import REPO, subprocess_env



def _has_runtime_cli() -> bool:
    try:
        return importlib.util.find_spec("deployctl_runtime.__main__") is not None
    except ModuleNotFoundError:
        return False


pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not _has_runtime_cli(), reason="the runtime (python -m deployctl_runtime) is not on this branch yet"),
]


def _runtime(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "deployctl_runtime", *args], env=subprocess_env(), cwd=REPO, **kw)


@pytest.fixture(scope="module")
def runtime_url(tmp_path_factory):
    model = tmp_path_factory.mktemp("tiny") / "model"
    made = _runtime("tiny-model", str(model))
    assert made.wait(120) == 0
    port = closed_port()
    log = open(tmp_path_factory.mktemp("log") / "serve.log", "w+")
    proc = _runtime("serve", "--model", str(model), "--port", str(port), "--device", "cpu", "--max-num-seqs", "4",
                    stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, f"runtime exited: {Path(log.name).read_text()[-3000:]}"
            try:
                if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "runtime not ready within 180 s"
            time.sleep(0.25)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()


def _within_bucket(client_ms: float, server: dict, q: str) -> bool:
    """The client's percentile is within one bucket width (plus 2 ms of HTTP) of the histogram's estimate."""
    est = server[q] / 1e3
    bounds = [0.0] + [b for b in server["buckets_s"] if b != float("inf")]
    lower, upper = next(((lo, up) for lo, up in zip(bounds, bounds[1:]) if est <= up), (bounds[-2], bounds[-1]))
    return abs(client_ms - server[q]) <= (upper - lower) * 1e3 + 2.0


@pytest.mark.parametrize("route", ["chat", "completions"])
def test_ladder_matches_the_runtimes_histograms(run_bench, runtime_url, route):
    rc, doc, err = run_bench(
        "--url", runtime_url, "--route", route, "--concurrency", "1,2", "--requests", "4", "--input-len", "8-16",
        "--output-len", "8", "--ignore-eos", "--metrics-url", runtime_url + "/metrics", "--no-loadgen-check",
        "--json", "--timeout", "60", timeout=300,
    )
    assert rc == 0, err
    for level in doc["levels"]:
        assert level["num_errors"] == 0, level["errors"]
        assert level["num_usage_missing"] == 0
        assert level["total_output_tokens"] == 8 * level["num_ok"]
        server = level["server"]
        assert "error" not in server, server
        for key in ("ttft_ms", "e2e_ms", "tpot_ms"):
            assert server[key]["count"] == level["num_ok"], (key, server[key], level["num_ok"])
            for q in ("p50", "p90", "p99"):
                assert _within_bucket(level[key][q], server[key], q), (key, q, level[key][q], server[key])
