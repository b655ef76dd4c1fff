"""A multi-GPU start that never becomes ready (a hung NCCL init) fails verification within the deadline derived from
the plan's load time (deployctl.engines.startup), with the engine's log tail, instead of waiting for
server.startup_timeout_s.

No GPU and no NCCL exist on this machine, so the engine is a stand-in: a vLLM TP-2 release is rendered for real
(launch.sh, runtime.env with the GPU environment) on a process-launcher host, ``nvidia-smi`` is a stub that lists
two GPUs (launch.sh waits for the GPUs before the first start), and the release's engine interpreter
(<release>/engine/bin/python, which the rendered command runs) prints the NCCL lines a rank prints before the
rendezvous and then sleeps: alive, silent, never listening — what a hung NCCL init looks like from outside."""
from __future__ import annotations

import os
import sys
import time

import pytest

from deployctl.config import HostConfig
from deployctl.engines import startup
from deployctl.errors import HealthError
from deployctl.hosts import Host
from deployctl.render import render_release
from deployctl.rollout import hostops
from deployctl.service.engine import Engine
from support.ports import free_port
from support.render import make_config

GB = 10**9


def test_deadline_formula_matches_hand_arithmetic():
    # Llama-3-8B bf16, 16.06 GB: 120 s + 16.06e9 / (125 × 2^20) B/s = 120 + 122.5 = 242.5 s; × 2 = 485 s
    assert startup.load_time_s(16_060_000_000) == pytest.approx(242.53, abs=0.01)
    assert startup.start_deadline_s(16_060_000_000, cap_s=7200) == pytest.approx(485.06, abs=0.01)
    # a 70B bf16 checkpoint (141 GB) would need 2 × (120 + 1075.7) s: the configured startup_timeout_s caps it
    assert startup.start_deadline_s(141 * GB, cap_s=600) == 600
    assert "(server.startup_timeout_s)" in startup.describe(141 * GB, 600)


@pytest.fixture
def hung_tp2_release(tmp_path, monkeypatch):
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"\0" * 3_000_000)  # 3 MB: the deadline's checkpoint bytes
    root = tmp_path / "root"
    cfg = make_config(
        model={"path": str(model), "served_name": "m"},
        engine={"kind": "vllm", "version": "0.33.0", "device": "cuda", "tensor_parallel_size": 2},
        server={"bind": "127.0.0.1", "api_key_env": None, "startup_timeout_s": 600},
        hosts=[{"name": "h", "address": "local", "deploy_root": str(root), "python": sys.executable,
                "launcher": "process", "gpus": [0, 1], "server_port": free_port()}])
    rel = root / "releases" / "r1"
    rel.mkdir(parents=True)
    for f in render_release(cfg, cfg.hosts[0], "r1", api_key=None):
        (rel / f.path).write_text(f.content)
        (rel / f.path).chmod(f.mode)
    (root / "current").symlink_to("releases/r1")
    engine_bin = rel / "engine" / "bin"
    engine_bin.mkdir(parents=True)
    stand_in = engine_bin / "python"  # the stand-in engine: the rendered vLLM command runs this interpreter
    stand_in.write_text("#!/bin/sh\necho \"rank0: NCCL INFO Bootstrap: Using eth0 CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES\"\n"
                        "echo 'rank0: NCCL INFO Channel 00/02 : 0 1'\nexec sleep 600\n")
    stand_in.chmod(0o755)
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    smi = stubs / "nvidia-smi"  # the GPU stand-in: two devices visible
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3'\necho 'GPU 1: NVIDIA H100 80GB HBM3'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{stubs}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("DEPLOYCTL_VERIFY_TIMEOUT_S", raising=False)
    host = Host.from_config(HostConfig(name="h", address="local", deploy_root=str(root), launcher="process",
                                       python=sys.executable, gpus=[0, 1]))
    yield cfg, host, root
    Engine(host, cfg).stop(timeout=5)
    host.close()


def test_hung_multi_gpu_start_fails_within_the_derived_deadline_with_the_log_tail(hung_tp2_release, monkeypatch):
    cfg, host, root = hung_tp2_release
    # the formula's boot allowance scaled from 120 s to 1 s so the test waits seconds; the checkpoint bytes are
    # read on the host: deadline = 2 × (1 + 3e6 / 131072000) = 2.05 s (server.startup_timeout_s is 600)
    monkeypatch.setattr(startup, "BOOT_S", 1.0)
    timeout, why = hostops.verify_timeout(cfg, host)
    assert timeout == pytest.approx(2 * (1 + 3_000_000 / startup.READ_BYTES_PER_S), rel=0.05)
    assert "tensor_parallel_size 2, GPUs 0,1" in why and "load time" in why
    offset = Engine(host, cfg).start()
    t0 = time.monotonic()
    with pytest.raises(HealthError) as err:
        Engine(host, cfg).verify(timeout=timeout, log_offset=offset, deadline_why=why)
    waited = time.monotonic() - t0
    assert waited < timeout + 10  # bounded by the deadline (plus one poll and the log read), not by 600 s
    msg = str(err.value)
    assert msg.startswith("h: not ready after 2 s, a multi-GPU start (tensor_parallel_size 2"), msg
    assert "hung NCCL init" in msg and "NCCL INFO Channel 00/02" in msg  # the engine's own last lines
    assert "CUDA_VISIBLE_DEVICES=0,1" in msg  # the rendered GPU environment reached the engine
    assert "NCCL_DEBUG=INFO" in err.value.fix
    assert Engine(host, cfg).running()  # it hung rather than exited: the deploy's abort stops it


def test_single_gpu_and_override_keep_the_configured_timeout(hung_tp2_release, monkeypatch):
    cfg, host, _ = hung_tp2_release
    one = cfg.model_copy(update={"engine": cfg.engine.model_copy(update={"tensor_parallel_size": 1})})
    assert hostops.verify_timeout(one, host) == (600, "")
    monkeypatch.setenv("DEPLOYCTL_VERIFY_TIMEOUT_S", "45")
    assert hostops.verify_timeout(cfg, host) == (45, "")
