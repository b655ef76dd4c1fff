"""The analysis window on real parts (issue 28): two stand-in engines (tests/support/standin_engine) on loopback,
the real nginx in front of them (deployctl's own rendered config and JSON access log), deployctl's Analyzer reading
both over the local host layer. No rollout: a window is opened, traffic sent, the window judged (a few seconds).

- Only generation requests count as client traffic: 25 GETs of /v1/models through nginx gave a metrics pass
  (every route counted toward min_client_requests, and with no TTFT samples nothing else judged the window).
- The SLO rule judges the canary's own histograms alone: with stable on an engine without metrics (a mixed
  fleet) it was skipped silently; a canary over slo.tpot_p99_s without a single client request now fails.
"""
from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys
import time

import httpx
import pytest
import yaml

from support.nginx import NginxRouter, free_port
from support.paths import REPO

STANDIN = REPO / "tests" / "support" / "standin_engine"


def start_standin(tmp, name: str, port: int, model, token_s: float) -> subprocess.Popen:
    conf = tmp / f"{name}.runtime.yaml"
    conf.write_text(yaml.safe_dump({"model": str(model), "served_model_name": "tiny-chat", "port": port,
                                    "host": "127.0.0.1", "max_num_seqs": 8}))
    env = {**os.environ, "PYTHONPATH": str(STANDIN), "DEPLOYCTL_STANDIN_TOKEN_S": str(token_s)}
    env.pop("DEPLOYCTL_RUNTIME_API_KEY", None)
    proc = subprocess.Popen([sys.executable, "-m", "deployctl_runtime", "serve", "--config", str(conf)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"the stand-in engine on {port} did not answer /healthz")


@pytest.fixture
def window(tmp_path, standin_model):
    """``make(canary_token_s, stable_kind) -> (cfg, Analyzer, nginx url)``: canary host ``a`` and stable host ``b``,
    each a stand-in engine (per-token delay ``canary_token_s`` on a), nginx splitting evenly between them."""
    from deployctl.config import HostConfig
    from deployctl.hosts import Host
    from deployctl.rollout.analysis import Analyzer
    from deployctl.rollout.router import Router
    from support.render import make_config

    procs: list[subprocess.Popen] = []
    nginx = NginxRouter(tmp_path / "nginx")

    def make(canary_token_s: float = 0.001, stable_kind: str | None = None, **analysis):
        ports = {"a": free_port(), "b": free_port()}
        cfg = make_config(
            model={"path": str(standin_model), "served_name": "tiny-chat", "dtype": "float32"},
            engine={"device": "cpu", "max_model_len": 256, "max_num_seqs": 8},
            server={"bind": "127.0.0.1", "api_key_env": None},
            hosts=[{"name": n, "address": "local", "deploy_root": str(tmp_path / n), "launcher": "process",
                    "python": sys.executable, "server_port": p} for n, p in ports.items()],
            router=nginx.router_config(), slo={"ttft_p99_s": 2.0, "tpot_p99_s": 0.05},
            rollout={"analysis": {"min_requests": 10, "min_latency_samples": 5, "probes": {"enabled": False},
                                  **analysis}})
        procs.append(start_standin(tmp_path, "a", ports["a"], standin_model, canary_token_s))
        procs.append(start_standin(tmp_path, "b", ports["b"], standin_model, 0.001))
        nginx.start(cfg)
        hosts = {h.name: Host.from_config(h) for h in cfg.hosts}
        router = Router(cfg, Host.from_config(HostConfig(name="router", address="local",
                                                         deploy_root=str(tmp_path / "r"))))
        return cfg, Analyzer(cfg, router, hosts, ["a"], ["b"], stable_kind=stable_kind), nginx.url

    try:
        yield make
    finally:
        nginx.stop()
        for p in procs:
            p.kill()
            p.wait(timeout=10)


def chat(base: str, n: int) -> None:
    body = {"model": "tiny-chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(lambda _: httpx.post(base + "/v1/chat/completions", json=body, timeout=30).status_code,
                              range(n)))
    assert codes == [200] * n


def evaluate_once_logged(an, w, sent: int, deadline_s: float = 10):
    """The window's verdict once the router's access log holds all ``sent`` requests: nginx writes a request's line
    when it finalizes the request, which may be after the client has its answer (on a busy machine, well after)."""
    end = time.monotonic() + deadline_s
    while True:
        v = an.evaluate(w, 50)
        if v.canary.requests + v.stable.requests >= sent or time.monotonic() > end:
            return v
        time.sleep(0.1)


def test_requests_without_generations_are_no_client_traffic(window):
    cfg, an, url = window()
    w = an.open_window()
    for _ in range(50):  # ~25 on each side: every route is a request, none a generation
        assert httpx.get(url + "/v1/models", timeout=10).status_code == 200
    v = evaluate_once_logged(an, w, 50)
    assert v.canary.requests >= 10 and v.stable.requests >= 10 and v.canary.generations == 0, v.summary()
    assert v.result == "inconclusive", v.summary()
    assert "0 canary client requests < min_client_requests 1 (generation requests via the router)" in v.reason

    chat(url, 12)
    v = evaluate_once_logged(an, w, 62)
    assert v.canary.generations + v.stable.generations == 12, v.summary()
    assert v.canary.requests + v.stable.requests == 62
    assert "generations)" in v.summary() and f"(all routes; {v.canary.generations} generations)" in v.summary()


def test_slo_judges_the_canary_alone_on_a_mixed_fleet(window):
    """Stable on transformers serve (no metrics route): the canary's own P99 TPOT still fails the SLO, with no
    client request at all (the samples are direct requests, as deployctl's probes are)."""
    cfg, an, _ = window(canary_token_s=0.08, stable_kind="transformers")
    assert not an.metrics and an.canary_metrics
    w = an.open_window()
    chat(f"http://127.0.0.1:{cfg.host('a').server_port}", 6)  # straight to the canary, not through nginx
    v = an.evaluate(w, 5)
    assert v.result == "fail", v.summary()
    assert v.reason.startswith("canary P99 TPOT ") and "> slo.tpot_p99_s 50 ms × max_slo_factor 1 = 50 ms (SLO)" \
        in v.reason, v.reason
    assert v.canary.requests == 0 and v.canary.ttft_count == 6
    assert not any("TPOT against slo" in s for s in v.cannot_judge), v.cannot_judge
