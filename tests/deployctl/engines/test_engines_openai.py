"""``engine.kind: openai`` (issue 26): any OpenAI-compatible server declared in deploy.yaml. Its command template
renders with deploy.yaml's settings in every place a known engine's does (and passes the same validators), its
declared stop signal and drain reach the unit, launch.sh, compose and the pod, bad declarations exit 3 naming the key,
and what it exports no metric for is named by the canary analysis ("cannot judge") instead of passing silently.
The end-to-end run on the sshd fleet is in tests/deployctl/rollout/test_rollout_engines.py."""
from __future__ import annotations


import pytest
import yaml

from deployctl.config import parse_config
from deployctl.engines import of
from deployctl.errors import ConfigError
from deployctl.render import render_all
from deployctl.render.validate import validate_tree
from deployctl.rollout.analysis import GroupStats, Verdict
from deployctl.rollout.blind import cannot_judge
from support import paths
from support.render import assert_config_refused

DATA = paths.DATA
KEY = {"LLM_API_KEY": "sk-generic-0123"}
TF_WORDS = ["{python}", "-m", "transformers.cli.transformers", "serve", "{model}", "--host", "{host}", "--port",
            "{port}", "--dtype", "{dtype}", "--device", "{device}", "--cb-max-batch-tokens",
            "{max_num_batched_tokens}", "--cb-block-size", "{block_size}", "--cb-num-blocks", "{num_gpu_blocks}",
            "--continuous-batching", "--log-level", "info"]


def _doc(kind: str = "openai", **server) -> dict:
    doc = yaml.safe_load((DATA / "engines" / "deploy-vllm.yaml").read_text())
    doc["engine"] = {"kind": kind, "device": "cpu", "max_model_len": 256, "max_num_seqs": 4, "block_size": 16}
    if kind == "openai":
        doc["engine"]["server"] = {"command": TF_WORDS, "sse_done": False, "model_name_is_path": True, **server}
    else:
        doc["engine"]["version"] = "5.24.0"
    doc["server"] = {"bind": "127.0.0.1", "port": 8000, "drain_timeout_s": 12}
    doc["router"]["listen_address"] = "127.0.0.1"  # no key: render refuses a public router without one
    doc["model"]["served_name"] = doc["model"]["path"]
    return doc


def _engine_cmd(out, host="gpu-a") -> str:
    return next(line for line in (out / "hosts" / host / "launch.sh").read_text().splitlines()
                if line.startswith("ENGINE_CMD="))


def test_declared_transformers_serve_renders_as_its_adapter_does(tmp_path):
    """The same server declared generically renders the command its own adapter renders, with hosts[].python as
    {python} (nothing to install), and the tree passes systemd-analyze, nginx -t and promtool."""
    cmds = {}
    for kind in ("transformers", "openai"):
        cfg = parse_config(yaml.safe_dump(_doc(kind)), "d.yaml")
        out = tmp_path / kind
        render_all(cfg, out, target="systemd", release_id="r1", env={})
        results = validate_tree(cfg, out)
        assert results and all(r.ok for r in results), [(r.tool, r.output) for r in results if not r.ok]
        cmds[kind] = _engine_cmd(out)
    py = cfg.hosts[0].python
    assert cmds["openai"] == cmds["transformers"].replace("/opt/deployctl/llama-8b/releases/r1/engine/bin/python", py)
    assert "--cb-num-blocks 64 " in cmds["openai"]  # {num_gpu_blocks}: 4 × ceil(256 / 16), the plan's arithmetic


def test_declared_stop_reaches_every_target(tmp_path):
    """A server that stops on SIGINT, cuts in-flight requests, takes 7 s to exit and 9 s to answer a probe."""
    doc = _doc(stop_signal="SIGINT", sigterm_drains=False, stop_overhead_s=7, probe_timeout_s=9,
               image="ghcr.io/example/server", ready_route="/ready", metrics_route="/metrics",
               metrics={"ttft": "srv_ttft_seconds", "tpot": "srv_tpot_seconds", "kv_usage": "srv_kv_usage",
                        "success": "srv_requests_total"},
               api_key_env="SRV_API_KEY")
    doc["engine"]["version"] = "1.2.3"
    doc["server"].update(bind="0.0.0.0", api_key_env="LLM_API_KEY")  # pods listen on the pod IP, behind a key
    cfg = parse_config(yaml.safe_dump(doc), "d.yaml")
    budget = 12 + 7 + 15  # ceil(drain) + its exit + margin
    out = tmp_path / "systemd"
    render_all(cfg, out, target="systemd", release_id="r1", env=KEY)
    assert all(r.ok for r in validate_tree(cfg, out))
    assert "SRV_API_KEY=sk-generic-0123" in (out / "hosts" / "gpu-a" / "runtime.env").read_text()
    unit = (out / "hosts" / "gpu-a" / f"{cfg.service.name}.service").read_text().splitlines()
    assert "KillSignal=SIGINT" in unit and "KillMode=mixed" in unit and f"TimeoutStopSec={budget}" in unit
    launch = (out / "hosts" / "gpu-a" / "launch.sh").read_text()
    assert 'kill -INT "$child"' in launch and 'kill -TERM "$child"' not in launch
    rules = (out / "prometheus" / "alerts.rules.yaml").read_text()
    assert "srv_ttft_seconds" in rules  # the declared names, not another engine's
    out = tmp_path / "container"
    render_all(cfg, out, target="container", release_id="r1", env=KEY)
    svc = yaml.safe_load((out / "hosts" / "gpu-a" / "compose.yaml").read_text())["services"]["runtime"]
    assert (svc["stop_signal"], svc["stop_grace_period"], svc["image"]) == ("SIGINT", f"{budget}s",
                                                                              "ghcr.io/example/server:1.2.3")
    assert svc["healthcheck"]["timeout"] == "9s" and "/ready" in svc["healthcheck"]["test"][-1]
    out = tmp_path / "k8s"
    render_all(cfg, out, target="k8s-rollout", release_id="r1", env=KEY)
    assert all(r.ok for r in validate_tree(cfg, out)), [(r.tool, r.output) for r in validate_tree(cfg, out) if not r.ok]
    pod = yaml.safe_load((out / "k8s" / "rollout.yaml").read_text())["spec"]["template"]["spec"]
    c = pod["containers"][0]
    # it cuts in-flight requests on its stop signal: the pod waits out the drain before it is sent
    assert c["lifecycle"]["preStop"] == {"sleep": {"seconds": 5 + 12}}
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready" and c["readinessProbe"]["timeoutSeconds"] == 9
    assert c["command"][c["command"].index("--port") + 1] == "8000"
    template = (out / "k8s" / "analysis-template.yaml").read_text()
    assert "srv_ttft_seconds_bucket" in template


@pytest.mark.parametrize("server,kind,says", [
    ({"command": ["srv", "--port", "{prot}"]}, "openai", "unknown placeholder {prot}"),
    ({"command": ["srv", "--listen", "8000"]}, "openai", "no {port} placeholder"),
    ({"command": ["srv", "--port", "{port}", "--api-key", "x"]}, "openai", "engine.server.api_key_env"),
    ({"command": ["srv --port {port}"]}, "openai", "one word per item"),
    ({"command": ["srv", "--port", "{port}"], "metrics": {"ttft": "x_seconds"}}, "openai", "metrics_route is unset"),
    ({"command": ["srv", "--port", "{port}"], "metrics_route": "/m", "metrics": {"latency": "x"}}, "openai",
     "unknown metric role 'latency'"),
    (None, "openai", "engine.kind openai needs engine.server"),
    ({"command": ["srv", "--port", "{port}"]}, "vllm", "remove engine.server or set engine.kind: openai"),
])
def test_bad_declarations_exit_3_naming_the_key(tmp_path, server, kind, says):
    doc = _doc()
    doc["engine"]["kind"] = kind
    if kind == "vllm":
        doc["engine"].update(version="0.33.0", device="cuda")
        doc["model"].pop("served_name")
    if server is None:
        doc["engine"].pop("server")
    else:
        doc["engine"]["server"] = server
    assert_config_refused(doc, says, tmp_path)


def test_container_target_without_an_image_is_refused(tmp_path):
    cfg = parse_config(yaml.safe_dump(_doc()), "d.yaml")
    with pytest.raises(ConfigError) as exc:
        render_all(cfg, tmp_path / "o", target="container", release_id="r1", env={})
    assert "engine.server.image is unset" in str(exc.value)


def test_analysis_names_what_a_generic_server_cannot_be_judged_on():
    bare = parse_config(yaml.safe_dump(_doc()), "d.yaml")
    said = cannot_judge(bare, of(bare), both_metrics=False)
    assert any(s.startswith("a restart or hang inside the window (openai (engine.server) has no metrics route")
               for s in said), said
    assert any(s.startswith("KV cache usage against slo.max_kv_cache_usage") for s in said), said
    # the active probes judge latency against stable, but the SLO rule reads the canary's own histograms: named
    assert "P99 TTFT against slo.ttft_p99_s (openai (engine.server) exports no ttft histogram)" in said, said
    assert "P99 TPOT against slo.tpot_p99_s (openai (engine.server) exports no tpot histogram)" in said, said
    assert not any("against stable" in s for s in said), said
    full = parse_config(yaml.safe_dump(_doc(metrics_route="/metrics", metrics={
        "ttft": "a_ttft_seconds", "tpot": "a_tpot_seconds", "kv_usage": "a_kv"})), "d.yaml")
    assert cannot_judge(full, of(full), both_metrics=True) == []
    half = parse_config(yaml.safe_dump(_doc(metrics_route="/metrics", metrics={"ttft": "a_ttft_seconds"})), "d.yaml")
    said = cannot_judge(half, of(half), both_metrics=True)
    assert ("P99 TPOT against slo.tpot_p99_s and against stable (openai (engine.server) exports no tpot histogram)"
            in said and len(said) == 2), said
    v = Verdict("pass", "", GroupStats(["a"]), GroupStats(["b"]), 2.0, cannot_judge=said)
    assert v.summary().endswith("cannot judge: " + "; ".join(said))
