"""Version drift between hosts: release.json records each host's driver, CUDA, torch and engine versions from the
deploy's preflight facts (preflight.platform_of), the fleet snapshot reads them back from the host, and
``differences`` (status, status --check) names the host whose versions differ from the rest."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import yaml

from deployctl.config import parse_config
from deployctl.hosts.host import Host
from deployctl.preflight import platform_of
from deployctl.rollout.fleetcheck import differences, snapshot
from deployctl.rollout.release import ReleaseInfo, release_files
from deployctl.render import RenderedFile
from support.paths import DATA

H200 = {"nvidia_driver": "570.133.20", "cuda": "12.8", "torch": "2.6.0+cu124", "torch_cuda": "12.4",
        "engine_version": None}


def test_platform_from_recorded_preflight_facts():
    facts = json.loads((DATA / "facts" / "h200.json").read_text())
    assert platform_of(facts) == H200
    facts["nvidia"] = {"available": False, "error": "NVML Shared Library Not Found"}
    facts["engine"] = {"importable": True, "version": "0.8.5"}
    assert platform_of(facts) == {**H200, "nvidia_driver": None, "cuda": None, "engine_version": "0.8.5"}


def test_release_json_records_the_platform():
    info = ReleaseInfo("r1", "2026-12-01T00:00:00Z", "c" * 64, "m" * 64, "deployctl_runtime-0.1.0-py3-none-any.whl",
                       "w" * 64, "0.1.0")
    files = [RenderedFile("release.json", json.dumps({"service": "svc"})), RenderedFile("runtime.yaml", "a: 1\n")]
    doc = json.loads(next(f for f in release_files(info, files, H200) if f.path == "release.json").content)
    assert doc["platform"] == H200 and doc["service"] == "svc" and doc["id"] == "r1"
    doc = json.loads(next(f for f in release_files(info, files) if f.path == "release.json").content)
    assert doc["platform"] is None  # preflight skipped: nothing recorded, nothing compared


def _host_with_release(root: Path, platform):
    rdir = root / "releases" / "r1"
    rdir.mkdir(parents=True)
    (rdir / "release.json").write_text(json.dumps({"id": "r1", "config_hash": "c" * 64, "platform": platform,
                                                   "runtime_wheel": "deployctl_runtime-0.1.0-py3-none-any.whl"}))
    (rdir / "manifest.sha256").write_text("")
    os.symlink("releases/r1", root / "current")


def test_status_names_the_host_whose_driver_and_torch_drift(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "manifest.sha256").write_text("x  config.json\n")
    cfg = parse_config(yaml.safe_dump({
        "service": {"name": "svc"}, "model": {"path": str(model)}, "engine": {"device": "cpu"},
        "hosts": [{"name": n, "address": "local", "deploy_root": str(tmp_path / n), "python": sys.executable,
                   "launcher": "process", "server_port": 18000 + i} for i, n in enumerate("abc")]}))
    old = {**H200, "nvidia_driver": "550.54.15", "torch": "2.5.1+cu124"}
    for n, plat in (("a", H200), ("b", old), ("c", H200)):
        _host_with_release(tmp_path / n, plat)
    rows = [{"host": h.name, **snapshot(Host.from_config(h), cfg)} for h in cfg.hosts]
    assert rows[1]["nvidia_driver"] == "550.54.15" and rows[0]["torch"] == "2.6.0+cu124"
    lines = differences(rows)
    assert lines == [
        "b: NVIDIA driver 550.54.15 differs from the rest (570.133.20 on a, c; recorded by the deploy's preflight)",
        "b: torch 2.5.1+cu124 differs from the rest (2.6.0+cu124 on a, c; recorded by the deploy's preflight)"], lines
    # a host deployed without preflight (platform null) is not called different
    rows[2] = {**rows[2], "nvidia_driver": None, "torch": None, "cuda": None, "torch_cuda": None}
    assert [ln.split(":")[0] for ln in differences(rows)] == ["b", "b"]
