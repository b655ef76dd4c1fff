"""GPUs pinned by UUID (issue 39): the host probe's NVML code records each GPU's UUID and PCI bus id (run against the
stand-in pynvml over recorded NVML answers, tests/data/nvml); a release rendered with those facts pins
CUDA_VISIBLE_DEVICES to the UUIDs hosts[].gpus' indices name and records the mapping in release.json; without facts
it stays by index (and says so in the deploy's record; offline render is unchanged); preflight shows the UUIDs and
warns, naming both, when a recorded index now holds another GPU. The round trip goes through real files: the
rendered release.json under a deploy root's ``current``, read back by the probe's ``current_release``."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from deployctl.hostscripts.probe import probe_current_release, probe_nvidia
from deployctl.preflight import check_facts
from deployctl.render import render_release
from deployctl.render.gpupin import pinning
from support.paths import DATA, REPO
from support.render import API_KEY, make_config

FAKE_NVML = REPO / "tests" / "support" / "fake_nvml" / "pynvml.py"
IDLE = ("GPU-5c1e7d52-0f3a-4b8e-9d21-6a7f0c3e1b40", "00000000:18:00.0")     # h100x2_serving's GPU 0
SERVING = ("GPU-9a04b6e3-71d2-4c5f-8e13-2b9d7f6a0c58", "00000000:2A:00.0")  # h100x2_serving's GPU 1


@pytest.fixture
def nvml(monkeypatch):
    """nvml(name): the probe's ``nvidia`` section as NVML answers from tests/data/nvml/<name>.json."""
    spec = importlib.util.spec_from_file_location("pynvml", FAKE_NVML)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, "pynvml", module)
    monkeypatch.delenv("DEPLOYCTL_FAKE_GPU_MEMORY", raising=False)

    def probe(name: str) -> dict:
        monkeypatch.setenv("DEPLOYCTL_TEST_NVML_FACTS", str(DATA / "nvml" / f"{name}.json"))
        return probe_nvidia()

    return probe


def two_gpus(**host):
    """deploy.yaml with host gpu-a on GPUs 0 and 1 (TP 2, vLLM) and its deploy_root."""
    # no standby: vLLM's dev mode needs a loopback bind (engines.validate.check_dev_mode_bind)
    return make_config(engine={"kind": "vllm", "version": "0.33.0", "tensor_parallel_size": 2}, rollout={"standby_s": 0},
                       hosts=[{"name": "gpu-a", "address": "10.0.0.11", "user": "deploy", "gpus": [0, 1],
                               "deploy_root": "/opt/deployctl/chat-7b", "python": "/opt/deployctl/venv/bin/python",
                               **host}])


def files(cfg, gpu_pinning=None):
    return {f.path: f.content for f in render_release(cfg, cfg.hosts[0], "r20261205-gpus", api_key=API_KEY,
                                                      gpu_pinning=gpu_pinning)}


def test_probe_records_uuid_and_pci_bus_id_of_every_gpu(nvml):
    nv = nvml("h100x2_serving")
    assert [(g["index"], g["uuid"], g["pci_bus_id"]) for g in nv["gpus"]] == [(0, *IDLE), (1, *SERVING)]
    faults = nvml("h100x4_faults")  # the GPU off the bus has neither; the others keep theirs
    assert [g["index"] for g in faults["gpus"]] == [0, 1, 3]
    assert all(g["uuid"].startswith("GPU-") and g["pci_bus_id"].startswith("00000000:") for g in faults["gpus"])


def test_release_pins_cuda_visible_devices_by_uuid_and_records_the_mapping(nvml):
    cfg = two_gpus()
    record = pinning(cfg, cfg.hosts[0], nvml("h100x2_serving"))
    got = files(cfg, record)
    want = f"CUDA_VISIBLE_DEVICES={IDLE[0]},{SERVING[0]}"
    assert f"Environment={want}" in got["chat-7b.service"].splitlines()
    assert f"  export {want}" in got["launch.sh"].splitlines()
    subprocess.run(["bash", "-n"], input=got["launch.sh"], text=True, check=True)
    info = json.loads(got["release.json"])
    assert info["gpu_pinning"] == {"by": "uuid", "why": None, "devices": [
        {"index": 0, "uuid": IDLE[0], "pci_bus_id": IDLE[1]}, {"index": 1, "uuid": SERVING[0], "pci_bus_id": SERVING[1]}]}
    assert info["gpus"] == [0, 1]
    # hosts[].gpus' order is CUDA's device order inside the engine: [1, 0] lists the serving GPU first
    rev = two_gpus(gpus=[1, 0])
    got = files(rev, pinning(rev, rev.hosts[0], nvml("h100x2_serving")))
    assert f"Environment=CUDA_VISIBLE_DEVICES={SERVING[0]},{IDLE[0]}" in got["chat-7b.service"].splitlines()


def test_without_facts_the_release_stays_by_index_and_says_why(nvml):
    cfg = two_gpus()
    offline = files(cfg)  # deployctl render: as before, no record
    assert "Environment=CUDA_VISIBLE_DEVICES=0,1" in offline["chat-7b.service"].splitlines()
    assert "gpu_pinning" not in json.loads(offline["release.json"])
    record = pinning(cfg, cfg.hosts[0], None, why="preflight was skipped")
    got = files(cfg, record)
    assert "Environment=CUDA_VISIBLE_DEVICES=0,1" in got["chat-7b.service"].splitlines()
    assert json.loads(got["release.json"])["gpu_pinning"] == {
        "by": "index", "why": "preflight was skipped",
        "devices": [{"index": 0, "uuid": None, "pci_bus_id": None}, {"index": 1, "uuid": None, "pci_bus_id": None}]}
    # a GPU of hosts[].gpus that NVML does not list (off the bus): by index, naming it
    four = two_gpus(gpus=[2, 3])
    lost = pinning(four, four.hosts[0], nvml("h100x4_faults"))
    assert lost["by"] == "index" and "GPU 2 of hosts[gpu-a].gpus is not among the GPUs NVML lists" in lost["why"]
    assert pinning(make_config(engine={"device": "cpu"}), make_config().hosts[0], None) is None


def test_fleet_records_uuid_from_the_gate_and_index_when_it_was_skipped(nvml):
    from deployctl.rollout.fleet import Fleet

    cfg = two_gpus()
    fleet = Fleet(cfg, lambda *a: None)
    skipped = fleet.gpu_pinning(cfg.hosts[0])
    assert skipped["by"] == "index" and "DEPLOYCTL_SKIP_PREFLIGHT" in skipped["why"]
    fleet.gpu_facts = {"gpu-a": nvml("h100x2_serving")}
    assert [d["uuid"] for d in fleet.gpu_pinning(cfg.hosts[0])["devices"]] == [IDLE[0], SERVING[0]]


def _deployed(tmp_path, cfg, record) -> str:
    """The rendered release written under a deploy root as a deploy leaves it (releases/<id>, current ->)."""
    root = tmp_path / "root"
    rdir = root / "releases" / "r20261205-gpus"
    rdir.mkdir(parents=True)
    for path, text in files(cfg, record).items():
        (rdir / path).write_text(text)
    (root / "current").symlink_to(rdir)
    return str(root)


def _check(cfg, facts):
    rep = check_facts(cfg, [(cfg.hosts[0], facts)], {})
    return {c.name: c for c in rep.hosts[0].checks}["gpu_pinning"]


def test_preflight_shows_the_uuids_and_warns_when_a_recorded_index_holds_another_gpu(nvml, tmp_path):
    cfg = two_gpus()
    root = _deployed(tmp_path, cfg, pinning(cfg, cfg.hosts[0], nvml("h100x2_serving")))
    facts = json.loads((DATA / "facts" / "h200.json").read_text())
    facts["nvidia"] = nvml("h100x2_serving")
    facts["current_release"] = probe_current_release(root)
    assert facts["current_release"]["gpu_pinning"]["by"] == "uuid"
    same = _check(cfg, facts)
    assert same.status == "pass", same
    assert f"GPU 0 = {IDLE[0]} ({IDLE[1]}), GPU 1 = {SERVING[0]} ({SERVING[1]})" in same.message
    assert "release r20261205-gpus runs on the same GPUs" in same.message
    # after a reboot the two enumerate the other way round: the release keeps its GPUs, preflight names both
    facts["nvidia"] = nvml("h100x2_swapped")
    moved = _check(cfg, facts)
    assert moved.status == "warn", moved
    assert (f"GPU 0 on gpu-a is now {SERVING[0]} ({SERVING[1]}), but release r20261205-gpus was pinned to "
            f"{IDLE[0]} ({IDLE[1]}) at index 0; {IDLE[0]} is now GPU 1") in moved.message
    assert "keeps the GPUs it was given" in moved.message and "nvidia-smi -L" in moved.fix
    # the running release's own files still name the UUIDs it was given
    unit = (tmp_path / "root" / "current" / "chat-7b.service").read_text()
    assert f"CUDA_VISIBLE_DEVICES={IDLE[0]},{SERVING[0]}" in unit


def test_preflight_on_facts_without_uuids_says_a_deploy_pins_by_index():
    cfg = make_config()
    facts = json.loads((DATA / "facts" / "h200.json").read_text())  # recorded before UUIDs
    c = _check(cfg, facts)
    assert c.status == "pass" and "by index: NVML gave no UUID for GPU 0 on gpu-a" in c.message
    assert _check(make_config(engine={"device": "cpu"}), facts).message == "skipped: device is cpu"
