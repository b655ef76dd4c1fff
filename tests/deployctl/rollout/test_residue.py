"""rollout.residue: what a sleeping runtime still holds on the GPU, read by its host's probe until it stops moving.
A local host (``address: local``) runs the real probe with the stand-in pynvml (tests/support/fake_nvml) answering
from a facts file this test rewrites while the measurement runs; the sleeper is a real process whose pidfile is the
standby's (``runtime.<port>.pid``)."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest

from deployctl.config import parse_config
from deployctl.rollout import residue
from support.paths import REPO

GiB = 2**30
TOTAL = 80 * GiB


def _facts(path, held, serving_pid: int, sleeper_pid: int) -> None:
    """One GPU: the serving runtime holds 70 GiB, the sleeper ``held`` (None: NVML gives no per-process figure)."""
    used = 70 * GiB + (held or 0)
    gpu = {"name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-1", "memory": {"total": TOTAL, "free": TOTAL - used,
                                                                         "used": used},
           "compute_capability": [9, 0], "retired_pages_pending": None, "remapped_rows": [0, 0, 0, 0],
           "processes": [{"pid": serving_pid, "usedGpuMemory": 70 * GiB}, {"pid": sleeper_pid, "usedGpuMemory": held}]}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"driver_version": "550.54.15", "cuda_driver_version": 12040, "gpus": [gpu]}))
    tmp.replace(path)


@pytest.fixture
def host(tmp_path):
    """A local host whose python sees the stand-in pynvml; yields (Host, facts file, sleeper pid, serving pid)."""
    from deployctl.hosts import Host

    facts = tmp_path / "nvml.json"
    wrapper = tmp_path / "python"
    wrapper.write_text(f"#!/bin/sh\nunset DEPLOYCTL_FAKE_GPU_MEMORY\nexport PYTHONPATH={REPO}/tests/support/fake_nvml\n"
                       f"export DEPLOYCTL_TEST_NVML_FACTS={facts}\nexec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    cfg = parse_config(f"""
service: {{name: chat}}
model: {{path: /models/m}}
engine: {{device: cuda}}
server: {{port: 8080}}
hosts:
  - {{name: gpu-a, address: local, deploy_root: {tmp_path / 'root'}, python: {wrapper}, spare_port: 8081}}
""")
    run = tmp_path / "root" / "shared" / "run"
    run.mkdir(parents=True)
    sleeper, serving = (subprocess.Popen(["sleep", "120"]) for _ in range(2))
    (run / "runtime.8080.pid").write_text(f"{sleeper.pid}\n")
    h = Host.from_config(cfg.hosts[0])
    try:
        yield h, facts, sleeper.pid, serving.pid
    finally:
        h.close()
        for p in (sleeper, serving):
            p.kill()
            p.wait()


def test_the_residue_is_read_until_it_stops_moving(host):
    """The sleeper frees its memory over a couple of seconds (40 → 30 → ... → 9 GiB): the first reads are not
    taken; the figure is the settled one, with the free bytes beside it."""
    h, facts, sleeper, serving = host
    steps = [40 * GiB, 30 * GiB, 20 * GiB, 12 * GiB, 9 * GiB]
    _facts(facts, steps[0], serving, sleeper)
    done = threading.Event()

    def free_gradually():
        for held in steps[1:]:
            if done.wait(0.3):
                return
            _facts(facts, held, serving, sleeper)

    t = threading.Thread(target=free_gradually, daemon=True)
    t.start()
    try:
        res = residue.measure(h, 8080, reported={"0": 2 * GiB})
    finally:
        done.set()
        t.join()
    assert res.bytes == {"0": 9 * GiB} and res.stable and res.how == "nvml", res
    assert res.reads >= 3 and res.free == {"0": TOTAL - 79 * GiB}
    assert res.reported == {"0": 2 * GiB}  # the engine's own figure is kept, not believed
    assert res.to_json()["residue_bytes"] == {"0": 9 * GiB} and res.to_json()["engine_resident_bytes"]
    # the next release (one awake copy: 70 GiB) does not fit in the 1 GiB left beside the sleeper
    why = residue.misfit(res, 70 * GiB)
    assert why and "measured residue of 9.0 GiB" in why and "needs 70.0 GiB" in why
    assert residue.misfit(res, 1 * GiB) is None


def test_without_per_process_memory_the_engines_figure_is_used_and_said(host):
    h, facts, sleeper, serving = host
    _facts(facts, None, serving, sleeper)
    res = residue.measure(h, 8080, reported={"0": 3 * GiB})
    assert res.bytes == {"0": 3 * GiB} and res.how == "the engine's /sleep answer" and not res.stable
    res = residue.measure(h, 8080)
    assert not res.known and res.bytes == {} and "could not be read" in res.text()


def test_a_residue_recorded_at_the_last_sleep_predicts_the_misfit_before_anything_changes():
    assert residue.predicted_misfit({"0": 9 * GiB}, 5 * GiB).startswith("the residue measured at this host's last")
    assert residue.predicted_misfit({"0": 9 * GiB}, 10 * GiB) is None
    assert residue.predicted_misfit(None, 1) is None and residue.predicted_misfit({"0": 1}, None) is None
    assert residue.reported_bytes({"resident_bytes": {"0": 5, 1: "6"}}) == {"0": 5, "1": 6}
    assert residue.reported_bytes({"resident_bytes": [1]}) is None and residue.reported_bytes(None) is None


def test_the_misfit_and_drain_settings_default_to_drop_and_the_servers_drain_and_refuse_other_values():
    from deployctl.errors import ConfigError
    from deployctl.rollout.standby import drain_bound_s

    base = """
service: {name: chat}
model: {path: /models/m}
server: {port: 8080, drain_timeout_s: 7}
hosts: [{name: a, address: 10.0.0.1, deploy_root: /opt/d, python: /usr/bin/python3, spare_port: 8081}]
"""
    cfg = parse_config(base)
    assert cfg.rollout.standby_misfit == "drop" and drain_bound_s(cfg) == 7
    cfg = parse_config(base + "rollout: {standby_misfit: fail, standby_drain_s: 10m}\n")
    assert cfg.rollout.standby_misfit == "fail" and drain_bound_s(cfg) == 600
    with pytest.raises((ConfigError, ValueError)) as e:
        parse_config(base + "rollout: {standby_misfit: keep}\n")
    assert "standby_misfit" in str(e.value)
