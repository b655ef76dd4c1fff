"""Checks over recorded facts (tests/data/facts): C01 (capacity), C14 (driver vs torch CUDA build),
GPU memory held by other processes, port holders, API key, chat template. No GPU needed: the same
check code runs on facts captured from GPU hosts."""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from deployctl.config import parse_config
from deployctl.preflight import check_facts
from deployctl.preflight.drivers import cuda_from_nvml, cuda_supported_by_driver, min_driver_for_cuda
from support.cli import repo_env
from support.paths import DATA, REPO

FACTS = DATA / "facts"


def facts(name: str) -> dict:
    return json.loads((FACTS / f"{name}.json").read_text())


def config(engine: str = "", server: str = "") -> object:
    text = f"""
service: {{name: chat-8b}}
model: {{path: /models/llama-3-8b-instruct}}
engine:
{"" if "device:" in engine else "  device: cuda"}
{engine}
server:
  port: 8080
{server}
hosts:
  - {{name: gpu-a, address: 10.0.0.1, deploy_root: /opt/deployctl/chat-8b, python: /opt/deployctl/venv/bin/python}}
"""
    return parse_config(text)


SERVE_TEXT = """
service: {name: chat-8b}
model: {path: /models/llama-3-8b-instruct}
engine: {device: cuda, max_model_len: 8192, max_num_seqs: 64}
server: {port: 8080}
hosts:
  - {name: gpu-a, address: 10.0.0.1, deploy_root: /opt/deployctl/chat-8b, python: /opt/deployctl/venv/bin/python}
"""


def run(cfg, f: dict, environ=None):
    rep = check_facts(cfg, [(cfg.hosts[0], f)], environ or {})
    return rep, {c.name: c for c in rep.hosts[0].checks}


def test_h200_host_passes_every_check():
    cfg = config("  max_model_len: 8192\n  max_num_seqs: 64")
    rep, checks = run(cfg, facts("h200"))
    assert rep.ok, [c for c in checks.values() if c.status != "pass"]
    # every check passes; one serving host is a warning (serving_hosts: test_one_serving_host_warns)
    assert all(c.status == "pass" for n, c in checks.items() if n != "serving_hosts")
    assert checks["serving_hosts"].status == "warn"
    assert "570.133.20" in checks["nvidia_driver"].message and "12.8" in checks["nvidia_driver"].message
    # the plan uses the GPU size from the host's facts (143771 MiB), not this machine's NVML
    assert "143,771 MiB" in checks["gpu_memory"].message
    doc = rep.to_json()
    assert set(doc) == {"ok", "hosts"} and set(doc["hosts"][0]) == {"host", "checks", "facts"}
    assert set(doc["hosts"][0]["checks"][0]) == {"name", "status", "message", "fix"}


def test_c14_driver_530_with_cu124_torch_fails_naming_versions_and_fix():
    rep, checks = run(config(), facts("c14_driver530_cu124"))
    c = checks["nvidia_driver"]
    assert not rep.ok and c.status == "fail"
    assert "530.30.02" in c.message and "CUDA up to 12.1" in c.message and "CUDA 12.4" in c.message
    assert "2.5.1+cu124" in c.message
    assert ">= 550.54.14" in c.fix and "CUDA <= 12.1" in c.fix
    # minor-version compatibility is named, not relied on
    assert "525.60.13" in c.message
    assert checks["torch"].status == "fail" and "too old" in checks["torch"].message


def test_c14_driver_470_with_cu118_torch_fails():
    rep, checks = run(config(), facts("c14_driver470_cu118"))
    c = checks["nvidia_driver"]
    assert c.status == "fail"
    assert "470.182.03" in c.message and "11.4" in c.message and "11.8" in c.message
    assert ">= 520.61.05" in c.fix


def test_c14_no_driver_is_a_plain_separate_message():
    rep, checks = run(config(), facts("no_driver"))
    c = checks["nvidia_driver"]
    assert c.status == "fail" and c.message == "NVIDIA driver not found (NVML: Driver Not Loaded)"
    assert checks["capacity"].status == "warn" and "Driver Not Loaded" in checks["capacity"].message


def test_driver_table():
    assert cuda_from_nvml(12010) == "12.1" and cuda_from_nvml(11040) == "11.4" and cuda_from_nvml(12080) == "12.8"
    assert cuda_supported_by_driver("530.30.02") == "12.1"
    assert cuda_supported_by_driver("470.182.03") == "11.4"
    assert cuda_supported_by_driver("550.54.14") == "12.4" and cuda_supported_by_driver("550.54.13") == "12.3"
    assert min_driver_for_cuda("12.4") == "550.54.14" and min_driver_for_cuda("12.7") == "570.26"


def test_driver_from_table_when_nvml_gives_no_cuda_version():
    f = facts("c14_driver530_cu124")
    f["nvidia"]["cuda_version"] = None
    _, checks = run(config(), f)
    assert checks["nvidia_driver"].status == "fail" and "CUDA up to 12.1" in checks["nvidia_driver"].message


@pytest.mark.parametrize("version", ["fake", "", "570.x"])
def test_a_driver_version_that_is_not_dotted_numbers_is_a_warning_naming_it_not_a_traceback(version):
    f = facts("h200")
    f["nvidia"]["driver_version"] = version
    rep, checks = run(config("  max_model_len: 8192\n  max_num_seqs: 64"), f)
    c = checks["nvidia_driver"]
    assert c.status == "warn" and repr(version) in c.message and "nvidia-smi" in c.fix
    assert rep.ok  # a warning: the other checks still ran and passed
    assert checks["gpu_memory"].status == "pass"


def test_c01_a_kv_pool_smaller_than_one_request_fails_with_the_numbers():
    cfg = config("  max_model_len: 4096\n  block_size: 16\n  num_gpu_blocks_override: 229\n  max_num_seqs: 8")
    rep, checks = run(cfg, facts("h200"))
    c = checks["capacity"]
    assert not rep.ok and c.status == "fail"
    for needle in ("4096", "3664 tokens", "229 blocks", "16 tokens", "131072 bytes/token", "largest feasible max_model_len is 3664"):
        assert needle in c.message, needle
    assert "3664" in c.fix


def test_c01_b_half_concurrency_warns():
    cfg = config("  max_model_len: 8192\n  num_gpu_blocks_override: 2048\n  max_num_seqs: 8")
    rep, checks = run(cfg, facts("h200"))
    c = checks["capacity"]
    assert rep.ok and c.status == "warn"
    assert "0.50×" in c.message and "32768" in c.message


def test_gpu_memory_held_by_another_process_fails_naming_it():
    cfg = config("  max_model_len: 4096\n  max_num_seqs: 8")
    rep, checks = run(cfg, facts("rtx4090_shared"))
    c = checks["gpu_memory"]
    assert c.status == "fail"
    assert "pid 4121 (python3) 12,288 MiB" in c.message and "11,862 MiB free" in c.message
    assert c.fix.startswith("stop those processes") and "weights + overhead alone need 16,853 MiB" in c.fix
    # a smaller model leaves room beside them: the fix proposes a utilization that fits
    f = facts("rtx4090_shared")
    f["model"]["weights_bytes"] = 4 * 2**30
    _, checks = run(cfg, f)
    assert "gpu_memory_utilization <= 0.48" in checks["gpu_memory"].fix


def test_gpu_memory_of_our_running_release_counts_as_free():
    f = facts("rtx4090_shared")
    f["service"] = {"pid_file": "x", "pid": 4000, "alive": True, "pids": [4000, 4121]}
    _, checks = run(config("  max_model_len: 4096\n  max_num_seqs: 8"), f)
    assert checks["gpu_memory"].status == "pass", checks["gpu_memory"]


def test_other_process_that_leaves_room_is_a_warning():
    f = facts("h200")
    f["nvidia"]["gpus"][0]["processes"] = [{"pid": 77, "name": "jupyter", "cmdline": "", "used_memory": 2048 * 2**20}]
    f["nvidia"]["gpus"][0]["memory_free"] -= 2048 * 2**20
    _, checks = run(config("  gpu_memory_utilization: 0.8"), f)
    assert checks["gpu_memory"].status == "warn" and "pid 77 (jupyter)" in checks["gpu_memory"].message


def test_port_held_by_other_process_fails_and_by_our_release_passes():
    f = facts("h200")
    f["port"] = {"bind": "127.0.0.1", "port": 8080, "free": False, "bind_error": "Address already in use (errno 98)",
                 "holders": [{"address": "0.0.0.0:8080", "pid": 991, "name": "python3", "cmdline": "python3 -m http.server 8080"}]}
    _, checks = run(config(), f)
    c = checks["port"]
    assert c.status == "fail" and "pid 991 (python3: python3 -m http.server 8080)" in c.message and "kill 991" in c.fix
    f["service"] = {"pid_file": "x", "pid": 990, "alive": True, "pids": [990, 991]}
    _, checks = run(config(), f)
    assert checks["port"].status == "pass" and "running release" in checks["port"].message


def test_device_cpu_skips_gpu_checks():
    f = facts("no_driver")
    f["torch"]["cuda"] = None
    _, checks = run(config("  device: cpu\n  max_model_len: 4096\n  kv_cache_memory: 1GiB"), f)
    for name in ("nvidia_driver", "gpu_memory"):
        assert checks[name].status == "pass" and "device is cpu" in checks[name].message
    assert checks["torch"].status == "pass"


def test_api_key_required_for_non_loopback_bind():
    cfg = config(server="  bind: 0.0.0.0\n  api_key_env: LLM_API_KEY")
    rep, checks = run(cfg, facts("h200"), environ={})
    assert checks["api_key"].status == "fail" and "$LLM_API_KEY" in checks["api_key"].message
    rep, checks = run(cfg, facts("h200"), environ={"LLM_API_KEY": "k"})
    assert checks["api_key"].status == "pass"


def test_missing_chat_template_and_disk_and_weights_issues():
    f = copy.deepcopy(facts("h200"))
    f["model"]["chat_template"] = None
    f["disk"][0]["free_bytes"] = 40 * 2**20  # under the disk rule's 64 MiB floor (deployctl.preflight.disk)
    f["weights"]["issues"] = [{"file": "model-00002-of-00004.safetensors", "kind": "sha256_mismatch",
                               "message": "model-00002-of-00004.safetensors: sha256 mismatch: expected a, actual b",
                               "expected": "a", "actual": "b"}]
    rep, checks = run(config(), f)
    assert checks["chat_template"].status == "warn"
    assert checks["disk"].status == "fail" and "40.0 MiB free" in checks["disk"].message
    assert checks["weights"].status == "fail" and "model-00002-of-00004.safetensors" in checks["weights"].message


def test_unreachable_host_is_one_failed_check():
    cfg = config()
    rep = check_facts(cfg, [(cfg.hosts[0], {"error": "gpu-a: connection refused", "fix": "is sshd running?"})], {})
    assert not rep.ok and [c.name for c in rep.hosts[0].checks] == ["reach"]


@pytest.mark.parametrize("name", ["h200", "rtx4090_shared", "no_driver", "c14_driver530_cu124", "c14_driver470_cu118"])
def test_recorded_facts_have_the_probe_keys(name):
    from deployctl.hostscripts.probe import FACT_KEYS

    # "memory" (host RAM, for a sleeping standby's weights) and "current_release" (what the running release was
    # given: its GPU pinning) and "space" (the disk rule's leftovers, release size, engine venv) came after these
    # recordings: a check reads them as unknown
    assert set(FACT_KEYS) - {"memory", "current_release", "more_ports", "space"} <= set(facts(name))


def test_cli_table_and_summary_line():
    from deployctl.cli._app import out_console
    from deployctl.cli.preflight import _print_report

    cfg = config("  max_model_len: 4096\n  max_num_seqs: 8")
    rep = check_facts(cfg, [(cfg.hosts[0], facts("rtx4090_shared"))], {})
    with out_console.capture() as cap:
        _print_report(rep)
    text = cap.get()
    assert "preflight: gpu-a" in text and "gpu_memory" in text and "fail" in text
    # gpu_processes names the sharers, serving_hosts warns of one host; gpu_pinning passes
    assert "preflight FAILED on gpu-a: 1 host(s), 11 pass, 2 warn, 1 fail" in text


def test_port_check_uses_the_hosts_own_server_port():
    from deployctl.preflight.gather import probe_params

    cfg = parse_config(f"""
service: {{name: chat-8b}}
model: {{path: /models/llama-3-8b-instruct}}
server: {{port: 8080}}
hosts:
  - {{name: gpu-a, address: 10.0.0.1, deploy_root: /opt/d, server_port: 9001}}
""")
    assert probe_params(cfg, cfg.hosts[0])["port"] == 9001
    f = facts("h200")
    f["port"] = {"bind": "127.0.0.1", "port": 9001, "free": False, "bind_error": None,
                 "holders": [{"address": "127.0.0.1:9001", "pid": 5, "name": "nginx", "cmdline": "nginx: worker"}]}
    c = {c.name: c for c in check_facts(cfg, [(cfg.hosts[0], f)], {}).hosts[0].checks}["port"]
    assert c.status == "fail" and c.message.startswith("port 9001 on 127.0.0.1 on gpu-a is held by pid 5 (nginx")


def test_cli_unknown_host_is_a_config_error(tmp_path):
    import os
    import subprocess
    import sys

    repo = REPO
    cfg = tmp_path / "deploy.yaml"
    cfg.write_text("service: {name: s}\nmodel: {path: /m}\nhosts:\n  - {name: gpu-a, address: local, deploy_root: /tmp/x}\n")
    proc = subprocess.run([sys.executable, "-m", "deployctl", "preflight", "-c", str(cfg), "--host", "gpu-z"],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(repo)})
    assert proc.returncode == 3 and "no host named 'gpu-z'" in proc.stderr and "gpu-a" in proc.stderr


# -- regressions (from test_preflight_edge_cases.py): preflight with a hosts[].python that cannot run the probe: the reach check names the python and gives a fix (it showed the base64 blob of the probe's command line and fix null).

ENV = repo_env()


@pytest.mark.parametrize("python", ["/nonexistent/bin/python", "/usr/bin/false"])
def test_unusable_host_python_is_named_with_a_fix(tmp_path, python):
    (tmp_path / "m").mkdir()
    cfg = tmp_path / "deploy.yaml"
    cfg.write_text(f"service: {{name: x}}\nmodel: {{path: '{tmp_path / 'm'}'}}\nengine: {{device: cpu}}\n"
                   f"hosts: [{{name: a, address: local, deploy_root: '{tmp_path / 'root'}', python: '{python}'}}]\n")
    proc = subprocess.run([sys.executable, "-m", "deployctl", "preflight", "-c", str(cfg), "--json"], env=ENV,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 4, proc.stderr
    (check,) = json.loads(proc.stdout)["hosts"][0]["checks"]
    assert check["name"] == "reach" and check["status"] == "fail"
    assert python in check["message"] and "base64" not in check["message"], check
    assert check["fix"] and "hosts[].python" in check["fix"], check


def test_repeated_host_flag_probes_the_host_once(tmp_path):
    # `--host a --host a` probed and reported host a twice, in parallel (two weight verifications racing on one
    # hash cache)
    (tmp_path / "m").mkdir()
    cfg = tmp_path / "deploy.yaml"
    cfg.write_text(f"service: {{name: x}}\nmodel: {{path: '{tmp_path / 'm'}'}}\nengine: {{device: cpu}}\n"
                   f"hosts: [{{name: a, address: local, deploy_root: '{tmp_path / 'root'}', python: '{sys.executable}'}}]\n")
    proc = subprocess.run([sys.executable, "-m", "deployctl", "preflight", "-c", str(cfg), "--host", "a", "--host", "a",
                           "--json", "--skip-weights"], env=ENV, capture_output=True, text=True, timeout=120)
    assert [h["host"] for h in json.loads(proc.stdout)["hosts"]] == ["a"], proc.stderr


def _routed(router: str, server: str = ""):
    """A config with a router in front; ``router`` adds lines under router:, ``server`` under server:."""
    return parse_config(f"""
service: {{name: chat-8b}}
model: {{path: /models/llama-3-8b-instruct}}
engine: {{device: cuda}}
server:
  port: 8080
{server}
router:
  upstream_conf: /etc/nginx/conf.d/chat-8b.conf
{router}
hosts:
  - {{name: gpu-a, address: 10.0.0.1, deploy_root: /opt/deployctl/chat-8b, python: /opt/deployctl/venv/bin/python}}
""")


def test_public_router_without_an_api_key_fails_and_names_the_address_and_both_fixes():
    # router.listen on every address (no listen_address), a loopback runtime, no key: nginx publishes the runtime
    _, checks = run(_routed("  listen: 80"), facts("h200"))
    c = checks["api_key"]
    assert c.status == "fail", c
    assert "*:80" in c.message and "no API key needed" not in c.message
    assert "server.api_key_env" in c.fix and "router.listen_address: 127.0.0.1" in c.fix
    # a non-loopback listen address: named as it is
    _, checks = run(_routed("  listen: 8000\n  listen_address: 10.0.0.9"), facts("h200"))
    assert checks["api_key"].status == "fail" and "10.0.0.9:8000" in checks["api_key"].message
    # the key's variable named but not exported: still a failure, naming the variable
    _, checks = run(_routed("  listen: 80", server="  api_key_env: LLM_API_KEY"), facts("h200"), environ={})
    assert checks["api_key"].status == "fail" and "$LLM_API_KEY is not set" in checks["api_key"].message
    assert "export LLM_API_KEY" in checks["api_key"].fix


def test_public_router_with_a_key_warns_without_limits_and_passes_with_them():
    keyed = {"LLM_API_KEY": "k"}
    _, checks = run(_routed("  listen: 80", server="  api_key_env: LLM_API_KEY"), facts("h200"), environ=keyed)
    assert checks["api_key"].status == "warn" and "router.limits" in checks["api_key"].fix
    assert "*:80" in checks["api_key"].message
    _, checks = run(_routed("  listen: 80\n  limits: {requests_per_s: 5, key: api_key}",
                            server="  api_key_env: LLM_API_KEY"), facts("h200"), environ=keyed)
    assert checks["api_key"].status == "pass", checks["api_key"]


def test_loopback_router_needs_no_key_and_says_where_it_listens():
    _, checks = run(_routed("  listen: 8000\n  listen_address: 127.0.0.1"), facts("h200"))
    assert checks["api_key"].status == "pass" and "127.0.0.1:8000 only" in checks["api_key"].message
    _, checks = run(_routed("  listen: 8000\n  listen_address: '::1'"), facts("h200"))
    assert checks["api_key"].status == "pass" and "[::1]:8000" in checks["api_key"].message


def test_public_runtime_bind_without_the_key_names_both_fixes():
    cfg = config(server="  bind: 0.0.0.0\n  api_key_env: LLM_API_KEY")
    _, checks = run(cfg, facts("h200"), environ={})
    c = checks["api_key"]
    assert c.status == "fail" and "0.0.0.0" in c.message and "export LLM_API_KEY" in c.fix and "bind 127.0.0.1" in c.fix


def test_one_serving_host_warns_once_for_the_fleet_and_two_pass():
    one = config("  max_model_len: 8192\n  max_num_seqs: 64")
    _, checks = run(one, facts("h200"))
    c = checks["serving_hosts"]
    assert c.status == "warn" and "one serving host (gpu-a)" in c.message and "validation only" in c.message
    assert "second serving host" in c.fix
    host = "  - {name: gpu-a, address: 10.0.0.1, deploy_root: /opt/deployctl/chat-8b, python: /opt/deployctl/venv/bin/python}"
    second = "\n  - {name: gpu-w, address: 10.0.0.2, deploy_root: /opt/deployctl/chat-8b, pool: %s}"

    def fleet(pool: str):
        return parse_config(SERVE_TEXT.replace(host, host + second % pool))

    with_pool = fleet("warm")  # a warm host does not serve: still one
    rep = check_facts(with_pool, [(h, facts("h200")) for h in with_pool.hosts], {})
    found = [(h.host, c.status, c.message) for h in rep.hosts for c in h.checks if c.name == "serving_hosts"]
    assert [(h, st) for h, st, _ in found] == [("gpu-a", "warn")] and "warm pool: gpu-w" in found[0][2]
    two = fleet("serving")
    rep = check_facts(two, [(h, facts("h200")) for h in two.hosts], {})
    found = [(h.host, c.status) for h in rep.hosts for c in h.checks if c.name == "serving_hosts"]
    assert found == [("gpu-a", "pass")]
