"""`deployctl validate` end to end against a healthy tiny runtime on CPU: every layer passes, the JSON document
has its keys, and the HTML report holds the functional table, the ladder and stability plots and the verdicts."""
from __future__ import annotations

import json
from html.parser import HTMLParser

import pytest

from support.cli import deployctl
from support.runtime import serve_runtime

CONTEXT = 256


@pytest.fixture(scope="module")
def healthy(rollout_model, tmp_path_factory):
    with serve_runtime(rollout_model, tmp_path_factory.mktemp("healthy") / "serve.log", "--max-model-len",
                       str(CONTEXT), "--kv-cache-memory", "8MiB", "--max-num-seqs", "4") as url:
        yield url


@pytest.fixture(scope="module")
def full_run(healthy, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    proc = deployctl("validate", "--url", healthy, "--layers", "stability,functional,latency", "--duration", "6s",
                     "--burst", "2", "--concurrency", "1,2", "--requests", "4", "--json", "--report", str(out),
                     timeout=180)
    return proc, out


def test_a_healthy_runtime_passes_every_layer(full_run):
    proc, _ = full_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert doc["verdict"] == "pass" and doc["max_model_len"] == CONTEXT
    assert list(doc["layers"]) == ["functional", "latency", "stability"]  # always in this order
    fun = doc["layers"]["functional"]
    cases = {c["id"]: c for c in fun["details"]["cases"]}
    at = cases["at-limit"]
    assert at["prompt_tokens"] + at["max_tokens"] == CONTEXT and at["completion_tokens"] == at["max_tokens"]
    assert cases["at-limit-stream"]["checks"]["stream_equal"] == "pass"
    assert {cases[k]["status"] for k in ("empty", "empty-prompt", "over-long", "over-max-tokens")} == {400}
    assert doc["layers"]["latency"]["details"]["knee"]["concurrency"] in (1, 2)
    stab = doc["layers"]["stability"]["details"]
    assert stab["signals"]["load"]["requests"] > 0 and stab["signals"]["load"]["errors"] == 0
    src = f"{doc['url']}/metrics"
    assert stab["signals"][src]["kv_usage"]["after_bursts"] and stab["signals"][src]["rss"]["last_mib"] > 10


class _Structure(HTMLParser):
    def __init__(self):
        super().__init__()
        self.sections, self.svgs, self.series, self.rows, self._section = [], [], [], {}, None
        self.external = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "section":
            self._section = a["id"]
            self.sections.append(a["id"])
        if tag == "svg":
            self.svgs.append((self._section, a.get("aria-label")))
        if tag == "polyline" and a.get("points"):
            self.series.append((self._section, a.get("data-series")))
        if tag == "tr":
            self.rows[self._section] = self.rows.get(self._section, 0) + 1
        if tag in ("script", "link", "img") or (tag == "a" and "href" in a):
            self.external.append(tag)


def test_the_report_page_is_self_contained_with_table_plots_and_verdicts(full_run):
    proc, out = full_run
    assert json.loads((out / "validate.json").read_text()) == json.loads(proc.stdout)
    html = (out / "report.html").read_text()
    page = _Structure()
    page.feed(html)
    assert page.sections == ["functional", "latency", "stability"]
    assert page.external == []  # nothing to fetch: it opens from an attachment
    labels = {label for _, label in page.svgs}
    assert {"Ladder: P99 TTFT against concurrency", "KV cache usage over time", "Process RSS over time",
            "Queue depth (waiting requests) over time"} <= labels
    assert ("latency", "P99 TTFT ms") in page.series  # the ladder has a drawn line
    assert sum(1 for s, _ in page.series if s == "stability") >= 3
    cases = len(json.loads(proc.stdout)["layers"]["functional"]["details"]["cases"])
    assert page.rows["functional"] == cases + 1  # header + one row per case
    assert html.count('class="pass">PASS') >= 4  # overall + three layers


def test_bad_flags_exit_2_naming_the_flag(healthy):
    proc = deployctl("validate", "--url", healthy, "--layers", "functional", "--duration", "x", timeout=60)
    assert proc.returncode == 2 and "--duration x is not a duration" in proc.stderr
    proc = deployctl("validate", "--url", healthy, "--layers", "failover", timeout=60)
    assert proc.returncode == 2 and "--layers failover needs -c deploy.yaml" in proc.stderr
    proc = deployctl("validate", "--url", healthy, "--layers", "functional,soak", timeout=60)
    assert proc.returncode == 2 and "unknown layer soak" in proc.stderr
