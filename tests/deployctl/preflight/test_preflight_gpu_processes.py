"""Issue 39: preflight names the processes on the host's GPUs that belong to no engine of this service. The host
probe's real NVML code runs against the stand-in pynvml (tests/support/fake_nvml) whose recorded processes are
real processes started here, so names, command lines, working directories and launch.sh's environment marker are
read from /proc as on a host; the serving runtime and the standby are found from their real pidfiles
(probe_service). Named: a stranger (pid, name, bytes), an orphaned engine of this deploy root (its release from its
cwd, its port from the marker) and a process whose command line names a release; never the serving runtime or
the sleeping standby."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from deployctl.config import parse_config
from deployctl.hostscripts.probe import probe_nvidia, probe_service
from deployctl.preflight import check_facts
from support.paths import DATA, REPO

FAKE_NVML = REPO / "tests" / "support" / "fake_nvml" / "pynvml.py"
GiB = 2**30


@pytest.fixture
def procs(tmp_path):
    started = []

    def start(cwd, env=None, argv=("sleep", "300")):
        cwd.mkdir(parents=True, exist_ok=True)
        p = subprocess.Popen(list(argv), cwd=cwd, env={"PATH": os.environ["PATH"], **(env or {})},
                             start_new_session=True)
        started.append(p)
        return p.pid

    yield start
    for p in started:
        p.kill()
        p.wait()


def _cfg(root, device="cuda"):
    return parse_config(f"""
service: {{name: chat-8b}}
model: {{path: /models/llama-3-8b-instruct}}
engine: {{device: {device}, max_model_len: 8192}}
server: {{port: 8080}}
hosts:
  - {{name: gpu-a, address: 10.0.0.1, gpus: [0, 1], deploy_root: {root}, python: /opt/deployctl/venv/bin/python,
      spare_port: 9001}}
""")


def test_preflight_names_foreign_gpu_processes_and_the_release_they_came_from(tmp_path, procs, monkeypatch):
    root = tmp_path / "root"
    run = root / "shared" / "run"
    run.mkdir(parents=True)
    serving = procs(root / "releases" / "r2")
    standby = procs(root / "releases" / "r1")
    (run / "runtime.pid").write_text(f"{serving}\n")
    (run / "runtime.9001.pid").write_text(f"{standby}\n")
    (run / "standby.json").write_text(json.dumps({"release": "r1", "port": 9001, "since": 0, "expires_at": 9e9}))
    orphan = procs(root / "releases" / "r0", env={"DEPLOYCTL_INSTANCE": str(root), "DEPLOYCTL_INSTANCE_PORT": "8080"})
    stranger = procs(tmp_path / "elsewhere")
    named = procs(tmp_path, argv=("sh", "-c", "sleep 300; :", f"{root}/releases/r9/launch.sh"))
    other_gpu = procs(tmp_path)  # on GPU 2, which this host entry does not use

    nvml = json.loads((DATA / "nvml" / "h100x2_serving.json").read_text())
    gpu0, gpu1 = nvml["gpus"][0], nvml["gpus"][1]
    gpu0["processes"] = [{"pid": serving, "usedGpuMemory": 60 * GiB}, {"pid": stranger, "usedGpuMemory": 3 * GiB},
                         {"pid": named, "usedGpuMemory": GiB}]
    gpu1["processes"] = [{"pid": standby, "usedGpuMemory": GiB // 2}, {"pid": orphan, "usedGpuMemory": 20 * GiB}]
    nvml["gpus"].append({**gpu0, "uuid": "GPU-2", "processes": [{"pid": other_gpu, "usedGpuMemory": GiB}]})
    facts_file = tmp_path / "nvml.json"
    facts_file.write_text(json.dumps(nvml))
    spec = importlib.util.spec_from_file_location("pynvml", FAKE_NVML)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, "pynvml", module)
    monkeypatch.setenv("DEPLOYCTL_TEST_NVML_FACTS", str(facts_file))
    monkeypatch.delenv("DEPLOYCTL_FAKE_GPU_MEMORY", raising=False)

    facts = json.loads((DATA / "facts" / "h200.json").read_text())
    facts["nvidia"] = probe_nvidia()
    facts["service"] = probe_service(str(root))
    assert facts["service"]["pids"] == [serving] and facts["service"]["standby_pids"] == [standby]

    cfg = _cfg(root)
    rep = check_facts(cfg, [(cfg.hosts[0], facts)], {})
    check = next(c for c in rep.hosts[0].checks if c.name == "gpu_processes")
    assert check.status == "warn", check
    msg = check.message
    assert msg.startswith("3 process(es) on GPU 0, 1 of gpu-a belong to no engine of this service: "), msg
    assert f"pid {stranger} (sleep) 3.0 GiB on GPU 0;" in msg
    assert f"pid {named} (sh) 1.0 GiB on GPU 0, from release r9 (no supervisor)" in msg
    assert f"pid {orphan} (sleep) 20.0 GiB on GPU 1, from release r0 (port 8080, no supervisor)" in msg
    for pid in (serving, standby, other_gpu):
        assert f"pid {pid} " not in msg
    assert f"launch.sh stop` ends every one of this deploy root (or kill {named} {orphan})" in check.fix
    assert f"stop the other processes (kill {stranger})" in check.fix

    # the same GPUs held by the service alone: nothing to name
    gpu0["processes"], gpu1["processes"] = [{"pid": serving, "usedGpuMemory": 60 * GiB}], \
        [{"pid": standby, "usedGpuMemory": GiB // 2}]
    facts_file.write_text(json.dumps(nvml))
    facts["nvidia"] = probe_nvidia()
    rep = check_facts(cfg, [(cfg.hosts[0], facts)], {})
    check = next(c for c in rep.hosts[0].checks if c.name == "gpu_processes")
    assert check.status == "pass" and "2 of theirs" in check.message, check


def test_a_cpu_service_skips_it():
    from deployctl.preflight.gpuprocs import check_gpu_processes

    cfg = _cfg("/opt/d", device="cpu")
    assert check_gpu_processes(cfg, cfg.hosts[0], {}).status == "pass"
