"""Render per engine: vLLM (TP 2) and SGLang (TP 4) for every target pass the same validators as the bundled
runtime's files (systemd-analyze verify, nginx -t, promtool, kubernetes-validate, the compose checks) and match
golden files (tests/data/golden/engines/<kind>-<target>; DEPLOYCTL_UPDATE_GOLDEN=1 regenerates them). The API key
is only in the 0600 env file, never on a command line; the GPUs are in PCI bus order; probes and alert rules use the
engine's own routes and metric names."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from deployctl.config import load_config, parse_config
from deployctl.engines import adapter
from deployctl.render import render_all
from support.render import golden_problems
from deployctl.render.validate import check_alert_rules, validate_tree
from support import paths

DATA = paths.DATA
GOLDEN = DATA / "golden" / "engines"
KEY = "sk-engines-golden-0123456789"
ENV = {"LLM_API_KEY": KEY}


def _tree(root: Path) -> dict[str, str]:
    # launch.sh is the runtime's template around ENGINE_CMD (golden in tests/data/golden/systemd; the command is
    # checked by test_engines_parsers.py); runtime.env holds the key
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name not in ("runtime.env", "launch.sh") and not p.name.endswith(".conf.keys")}


@pytest.mark.parametrize("kind,target", [(k, t) for k in ("vllm", "sglang") for t in ("systemd", "container", "k8s-rollout")])
def test_engine_render_validates_and_matches_golden(tmp_path, kind, target):
    cfg = load_config(DATA / "engines" / f"deploy-{kind}.yaml")
    out = tmp_path / "out"
    render_all(cfg, out, target=target, release_id="20261201T000000Z-golden1", env=ENV)
    results = validate_tree(cfg, out)
    assert results and all(r.ok for r in results), [(r.tool, r.path, r.output) for r in results if not r.ok]
    a = adapter(kind)
    for path in out.rglob("*"):
        if path.is_file() and path.name != "runtime.env" and not path.name.endswith(".conf.keys"):
            assert KEY not in path.read_text(), f"the API key leaked into {path.name}"
    envs = list(out.rglob("runtime.env"))
    assert envs and all(oct(p.stat().st_mode & 0o777) == "0o600" for p in envs)
    assert all(f"{a.api_key_env or 'DEPLOYCTL_ENGINE_API_KEY'}={KEY}" in p.read_text() for p in envs)
    rules = (out / "prometheus" / "alerts.rules.yaml").read_text()
    assert a.metrics["ttft"] in rules and "deployctl_runtime_" not in rules
    if target == "systemd":
        for h in cfg.hosts:
            unit = (out / "hosts" / h.name / f"{cfg.service.name}.service").read_text()
            ids = ",".join(map(str, h.gpu_ids))
            assert "Environment=CUDA_DEVICE_ORDER=PCI_BUS_ID" in unit and f"CUDA_VISIBLE_DEVICES={ids}" in unit
            assert all(f"DeviceAllow=/dev/nvidia{g} rw" in unit for g in h.gpu_ids)
            assert f"/releases/20261201T000000Z-golden1/engine/bin/python " in unit  # the release's pinned engine env
            launch = (out / "hosts" / h.name / "launch.sh").read_text()
            assert "export CUDA_DEVICE_ORDER=PCI_BUS_ID" in launch
    if target == "k8s-rollout":
        pod = yaml.safe_load((out / "k8s" / "rollout.yaml").read_text())["spec"]["template"]["spec"]["containers"][0]
        assert pod["image"] == f"{a.image}:v{cfg.engine.version}"
        assert pod["resources"]["limits"]["nvidia.com/gpu"] == cfg.engine.tensor_parallel_size
        assert pod["readinessProbe"]["httpGet"]["path"] == a.ready_route
        assert not (out / "k8s" / "configmap.yaml").exists()  # the settings are on the pod's command
    problems = golden_problems(_tree(out), GOLDEN / f"{kind}-{target}", f"{kind}-{target}")
    assert not problems, "rendered files differ (DEPLOYCTL_UPDATE_GOLDEN=1 if intended):\n" + "\n".join(problems)


def test_transformers_render_has_an_explicit_cache_and_only_host_rules(tmp_path):
    text = (DATA / "engines" / "deploy-vllm.yaml").read_text()
    doc = yaml.safe_load(text)
    doc["engine"] = {"kind": "transformers", "version": "5.24.0", "device": "cpu", "max_model_len": 256,
                     "max_num_seqs": 4, "block_size": 16}
    doc["server"] = {"bind": "127.0.0.1", "port": 8000}
    doc["router"]["listen_address"] = "127.0.0.1"  # no key: render refuses a public router without one
    doc["model"]["served_name"] = doc["model"]["path"]  # transformers serve answers only to its model path
    cfg = parse_config(yaml.safe_dump(doc), "t.yaml")
    out = tmp_path / "out"
    render_all(cfg, out, target="systemd", release_id="r1", env={})
    assert all(r.ok for r in validate_tree(cfg, out))
    launch = (out / "hosts" / "gpu-a" / "launch.sh").read_text()
    assert "engine/bin/python -m transformers.cli.transformers serve /models/Meta-Llama-3-8B-Instruct" in launch
    assert "--cb-num-blocks 64 " in launch and "--continuous-batching" in launch  # 4 × 256/16
    rules = out / "prometheus" / "alerts.rules.yaml"
    # no engine metrics: only node_exporter's disk rules for the hosts and mtail's router rules (prometheus/scrape.yaml),
    # none on the engine
    names = [r["alert"] for r in yaml.safe_load(rules.read_text())["groups"][0]["rules"]]
    assert names == ["DeployctlDiskNearlyFull", "DeployctlDiskFull", "DeployctlRouterErrorRateHigh",
                     "DeployctlRouterMetricsDown"] and check_alert_rules(rules).ok


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_stop_drains_on_every_target(tmp_path, kind):
    """Issue 26: SIGTERM reaches the engine's main process only (KillMode=mixed: vLLM's TP workers and SGLang's
    schedulers keep serving while it drains) and every stop budget covers the drain plus the engine's own exit."""
    doc = yaml.safe_load((DATA / "engines" / f"deploy-{kind}.yaml").read_text())
    doc["server"]["drain_timeout_s"] = 42.5
    cfg = parse_config(yaml.safe_dump(doc), "d.yaml")
    a = adapter(kind)
    budget = 43 + a.stop_overhead_s + 15  # ceil(drain) + the engine's exit (vLLM 5 s, SGLang 20 s) + margin
    assert a.sigterm_drains and a.stop_overhead_s == {"vllm": 5, "sglang": 20}[kind]
    out = tmp_path / "systemd"
    render_all(cfg, out, target="systemd", release_id="r1", env=ENV)
    results = validate_tree(cfg, out)  # systemd-analyze verify on every unit, among others
    # per host: the runtime's unit, and the log cap's service and timer; once: the autoscale service and timer
    assert sum(r.tool == "systemd-analyze verify" for r in results) == 3 * len(cfg.hosts) + 2, [r.tool for r in results]
    assert all(r.ok for r in results), [(r.tool, r.path, r.output) for r in results if not r.ok]
    for h in cfg.hosts:
        unit = (out / "hosts" / h.name / f"{cfg.service.name}.service").read_text().splitlines()
        assert "KillMode=mixed" in unit and "KillSignal=SIGTERM" in unit
        assert f"TimeoutStopSec={budget}" in unit
        launch = (out / "hosts" / h.name / "launch.sh").read_text()
        assert f"STOP_TIMEOUT_S=${{DEPLOYCTL_LAUNCH_STOP_TIMEOUT_S:-{budget}}}" in launch
        exec_start = next(line for line in unit if line.startswith("ExecStart="))
        if kind == "vllm":  # vLLM aborts in-flight requests on SIGTERM unless told how long to drain
            assert " --shutdown-timeout 43 " in exec_start + " " and "--shutdown-timeout 43" in launch
        else:
            assert "--shutdown-timeout" not in exec_start  # SGLang drains on SIGTERM by itself
    out = tmp_path / "container"
    render_all(cfg, out, target="container", release_id="r1", env=ENV)
    svc = yaml.safe_load((out / "hosts" / cfg.hosts[0].name / "compose.yaml").read_text())["services"]["runtime"]
    assert (svc["stop_signal"], svc["stop_grace_period"]) == ("SIGTERM", f"{budget}s")
    probe_s = {"vllm": 5, "sglang": 25}[kind]  # SGLang's /health runs a generation for up to 20 s
    assert a.probe_timeout_s == probe_s and svc["healthcheck"]["timeout"] == f"{probe_s}s"
    assert f"timeout={probe_s - 1})" in svc["healthcheck"]["test"][-1]
    assert ("--shutdown-timeout" in svc["entrypoint"]) == (kind == "vllm")
    out = tmp_path / "k8s"
    render_all(cfg, out, target="k8s-rollout", release_id="r1", env=ENV)
    pod = yaml.safe_load((out / "k8s" / "rollout.yaml").read_text())["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["lifecycle"]["preStop"] == {"sleep": {"seconds": 5}}  # only the endpoints' drop: the engine drains
    assert pod["terminationGracePeriodSeconds"] == 5 + budget
    assert all(c[p]["timeoutSeconds"] == probe_s for p in ("startupProbe", "readinessProbe", "livenessProbe"))
    if kind == "vllm":
        assert c["command"][c["command"].index("--shutdown-timeout") + 1] == "43"


def test_adapters_stop_claims_match_the_pinned_sources():
    """What the adapters say about SIGTERM, read from the pinned engines in .venv-engines (no import: text)."""
    site = next((paths.REPO / ".venv-engines" / "lib").glob("python3*/site-packages"), None)
    if site is None:
        pytest.fail(".venv-engines is missing: run `bash tests/setup_test_venvs.sh`")
    args = (site / "vllm" / "engine" / "arg_utils.py").read_text()
    assert '"--shutdown-timeout"' in args and "0 = abort, >0 = wait" in args and "shutdown_timeout: int = 0" in args
    core = (site / "vllm" / "v1" / "engine" / "core.py").read_text()
    assert 'mode = "abort" if shutdown_timeout == 0 else "drain"' in core
    assert adapter("vllm").flags["shutdown_timeout"].name == "--shutdown-timeout"
    tm = (site / "sglang" / "srt" / "managers" / "tokenizer_manager.py").read_text()
    assert "Draining requests and shutting down" in tm and "_SCHEDULER_EXIT_TIMEOUT_SECS = 15" in tm
    assert "shutdown_timeout" not in adapter("sglang").flags  # no such flag: it drains with no bound of its own
    schedule = (site / "sglang" / "srt" / "arg_groups" / "fields" / "schedule.py").read_text()
    assert "chunked_prefill_size: A[" in schedule and "maximum of this value and the model's maximum" in schedule
    assert adapter("sglang").flags["max_num_batched_tokens"].name == "--chunked-prefill-size"
    http = (site / "sglang" / "srt" / "entrypoints" / "http_server.py").read_text()
    assert 'HEALTH_CHECK_TIMEOUT = int(os.getenv("SGLANG_HEALTH_CHECK_TIMEOUT", 20))' in http
    assert adapter("sglang").probe_timeout_s > 20
