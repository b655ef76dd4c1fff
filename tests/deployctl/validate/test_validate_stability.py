"""The stability layer over ~25 s against the tiny runtime on CPU: a healthy runtime passes; one whose finished
requests keep three KV blocks each (the test-only leak_kv_blocks fault) fails, naming KV usage and its slope.
Both runs go at once (one runtime each) through the real command."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from support.cli import repo_env
from support.paths import REPO
from support.runtime import serve_runtime

pytestmark = pytest.mark.slow
DURATION = "24s"


@pytest.fixture(scope="module")
def runs(rollout_model, tmp_path_factory):
    args = ("--max-model-len", "256", "--kv-cache-memory", "8MiB", "--max-num-seqs", "4")
    with serve_runtime(rollout_model, tmp_path_factory.mktemp("ok") / "serve.log", *args) as ok, \
            serve_runtime(rollout_model, tmp_path_factory.mktemp("leak") / "serve.log", *args,
                          env={"DEPLOYCTL_RUNTIME_FAULT": "leak_kv_blocks=3"}) as leak:
        procs = {name: subprocess.Popen(
            [sys.executable, "-m", "deployctl", "validate", "--url", url, "--layers", "stability", "--duration",
             DURATION, "--burst", "5", "--load-concurrency", "2", "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=repo_env(), cwd=REPO)
            for name, url in (("ok", ok), ("leak", leak))}
        out = {}
        for name, p in procs.items():
            stdout, stderr = p.communicate(timeout=150)
            out[name] = (p.returncode, json.loads(stdout) if stdout.strip() else None, stderr)
        yield out


def test_a_healthy_runtime_holds_steady(runs):
    rc, doc, err = runs["ok"]
    assert rc == 0, (err[-3000:], doc and doc["layers"]["stability"]["problems"])
    layer = doc["layers"]["stability"]
    assert layer["verdict"] == "pass", layer["problems"]
    sig = layer["details"]["signals"][f"{doc['url']}/metrics"]
    assert sig["kv_usage"]["after_bursts"] and max(sig["kv_usage"]["after_bursts"]) <= 0.01
    assert len(sig["start_times"]) == 1 and sig["scrape_failures"] == 0
    assert layer["details"]["signals"]["load"]["bursts"] >= 3


def test_a_kv_block_leak_fails_naming_kv_usage_and_its_slope(runs):
    rc, doc, err = runs["leak"]
    assert rc == 1, err[-3000:]
    layer = doc["layers"]["stability"]
    assert layer["verdict"] == "fail"
    kv = [p for p in layer["problems"] if p.startswith("kv_usage on ")]
    assert kv and "not back to its baseline 0.0" in kv[0] and "/h" in kv[0], layer["problems"]
    sig = layer["details"]["signals"][f"{doc['url']}/metrics"]["kv_usage"]
    after = sig["after_bursts"]
    assert after == sorted(after) and after[-1] > 0.05 and sig["slope_per_h"] > 0  # climbs burst after burst
    assert f"slope {sig['slope_per_h']:+.3f}/h" in kv[0]
    assert "kv_usage" in layer["summary"]
