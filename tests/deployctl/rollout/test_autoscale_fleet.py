"""`deployctl autoscale --once` on real parts: stand-in engines (tests/support/standin_engine) on loopback read over
real HTTP /metrics through the local host layer, history in the hosts' state/ directories. A stand-in fault
(DEPLOYCTL_STANDIN_WAITING / DEPLOYCTL_STANDIN_KV_USAGE) reports a long queue and a full KV cache; the actor
records its calls (the scale commands are deployctl.rollout.scale's, another issue's part)."""
from __future__ import annotations

import json
import sys

import pytest

from support.cli import run_cli
from support.nginx import free_port
from support.render import write_config

from test_analysis_traffic import start_standin  # noqa: E402  (same directory: the stand-in launcher)


class Recorder:
    def __init__(self):
        self.calls: list[tuple[str, list[str]]] = []

    def out(self, names):
        self.calls.append(("out", list(names)))

    def in_(self, names):
        self.calls.append(("in", list(names)))


@pytest.fixture
def fleet(tmp_path, standin_model, monkeypatch):
    procs = []

    def make(label: str, serving: list[str], warm: list[str], fault: dict, **auto):
        for k, v in fault.items():
            monkeypatch.setenv(k, v)
        ports = {n: free_port() for n in serving + warm}
        path = write_config(
            tmp_path / f"{label}.yaml",
            model={"path": str(standin_model), "served_name": "tiny-chat", "dtype": "float32"},
            engine={"device": "cpu", "max_model_len": 256, "max_num_seqs": 8},
            server={"bind": "127.0.0.1", "api_key_env": None},
            hosts=[{"name": n, "address": "local", "deploy_root": str(tmp_path / label / n), "launcher": "process",
                    "python": sys.executable, "server_port": p, **({"pool": "warm"} if n in warm else {})}
                   for n, p in ports.items()],
            autoscale={"window_s": 0.2, "samples": 2, **auto})
        for n in serving:  # the warm host's engine is not read (it is asleep in a real pool)
            procs.append(start_standin(tmp_path, f"{label}-{n}", ports[n], standin_model, 0.001))
        for k in fault:
            monkeypatch.delenv(k)
        from deployctl.config import load_config

        return path, load_config(path)

    try:
        yield make
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=10)


def test_autoscale_once_out_cooldown_in_and_min(fleet):
    from deployctl.config import load_config
    from deployctl.rollout.autoscale_run import autoscale_once
    from deployctl.rollout.fleet import Fleet

    # a queue of 12 and KV 95% on both serving engines: out onto the warm host, through the actor
    path, cfg = fleet("busy", ["a", "b"], ["w"], {"DEPLOYCTL_STANDIN_WAITING": "12",
                                                  "DEPLOYCTL_STANDIN_KV_USAGE": "0.95"})
    rec = Recorder()
    d = autoscale_once(cfg, actor=rec)
    assert (d.action, d.hosts, rec.calls) == ("out", ["w"], [("out", ["w"])])
    assert d.numbers["kv_usage_min"] == 0.95 and d.numbers["waiting_min"] == 24, d.numbers
    # right after: the cooldown holds, nothing is called, and the CLI says why
    r = run_cli("autoscale", "--once", "-c", str(path))
    assert r.returncode == 0, r.stderr
    assert "autoscale: nothing" in r.stdout and "inside autoscale.cooldown_s 300" in r.stdout, r.stdout
    assert rec.calls == [("out", ["w"])]
    f = Fleet(cfg, lambda *a, **k: None)
    f.connect()
    try:
        hist = [h for h in f.store.read_history() if h["action"] == "autoscale"]
    finally:
        f.close()
    assert [(h["result"], h["acted"]) for h in hist] == [("out", True), ("none", False)]
    assert hist[0]["numbers"]["kv_usage_min"] == 0.95 and "95%" in hist[0]["reason"]

    # an idle fleet of three above min_hosts 2: in, the last serving host; the dry run records but calls nothing
    path, cfg = fleet("idle", ["a", "b", "c"], [], {})
    r = run_cli("autoscale", "--once", "--dry-run", "--json", "-c", str(path))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert (doc["action"], doc["hosts"], doc["dry_run"]) == ("in", ["c"], True)
    rec = Recorder()
    assert autoscale_once(cfg, actor=rec).action == "in" and rec.calls == [("in", ["c"])]  # dry run: no cooldown

    # the same idle engines with min_hosts 3 (and a history of their own): refused, with the reason
    import yaml

    doc = yaml.safe_load(path.read_text())
    doc["autoscale"]["min_hosts"] = 3
    for h in doc["hosts"]:
        h["deploy_root"] += "-atmin"
    path = path.with_name("atmin.yaml")
    path.write_text(yaml.safe_dump(doc))
    cfg = load_config(path)
    r = run_cli("autoscale", "--once", "-c", str(path))
    assert r.returncode == 0 and "at autoscale.min_hosts 3" in r.stdout, r.stdout
    # while a deploy runs (state/rollout.json in progress): nothing, whatever the metrics
    from deployctl.rollout.state import RolloutState

    f = Fleet(cfg, lambda *a, **k: None)
    f.connect()
    try:
        f.store.write_rollout(RolloutState(release="r2", status="running", owner="ops@box"))
    finally:
        f.close()
    rec = Recorder()
    d = autoscale_once(load_config(path).model_copy(update={"autoscale": cfg.autoscale.model_copy(
        update={"min_hosts": 2})}), actor=rec)
    assert d.action == "none" and "a deploy of r2 is running (started by ops@box)" in d.reason and rec.calls == []


def test_autoscale_without_readable_metrics_exits_4(fleet):
    path, cfg = fleet("down", [], ["w"], {})
    # no engine runs on the serving host: decide nothing blind
    import yaml

    doc = yaml.safe_load(path.read_text())
    doc["hosts"][0]["pool"] = "serving"
    path.write_text(yaml.safe_dump(doc))
    r = run_cli("autoscale", "--once", "-c", str(path))
    assert r.returncode == 4 and "no serving engine's metrics could be read" in r.stderr, (r.stdout, r.stderr)


def test_autoscale_reads_the_window_from_prometheus(fleet, tmp_path):
    """With autoscale.prometheus_url: a real Prometheus scraping the stand-ins with render's scrape job (its job and
    deployctl_host labels) gives the window."""
    import subprocess
    import time

    import httpx
    import yaml

    from deployctl.render.targets import render_scrape
    from deployctl.rollout.autoscale_run import autoscale_once

    port = free_port()
    path, cfg = fleet("prom", ["a", "b"], ["w"],
                      {"DEPLOYCTL_STANDIN_WAITING": "5", "DEPLOYCTL_STANDIN_KV_USAGE": "0.9"},
                      prometheus_url=f"http://127.0.0.1:{port}", window_s=3, samples=3)
    job = yaml.safe_load(render_scrape(cfg).content)["scrape_configs"][0]
    job["scrape_interval"] = "1s"
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({"scrape_configs": [job]}))
    prom = subprocess.Popen(["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        # until the window holds scrapes of its whole length on BOTH engines (the waiting sum is over both)
        q = {"query": 'count(count_over_time(deployctl_runtime_kv_cache_usage_ratio{deployctl_host=~"a|b"}[10s]) >= 6)'}
        while time.monotonic() < deadline:
            try:
                res = httpx.get(f"http://127.0.0.1:{port}/api/v1/query", params=q, timeout=2).json()["data"]["result"]
                if res and float(res[0]["value"][1]) >= 2:
                    break
            except (httpx.HTTPError, KeyError, ValueError):
                pass
            time.sleep(0.5)
        rec = Recorder()
        d = autoscale_once(cfg, actor=rec)
        assert (d.action, rec.calls) == ("out", [("out", ["w"])]), d.reason
        assert d.numbers["kv_usage_min"] == 0.9 and d.numbers["waiting_min"] == 10, d.numbers
    finally:
        prom.terminate()
        prom.wait(timeout=20)
