"""The GPU memory stand-in (deployctl_runtime/gpu_ledger.py) and deployctl's host probe that reads it agree with a real
driver about exited processes: an exited runtime that its parent has not reaped yet (a zombie) holds no GPU memory,
so its allocation is not counted, and the probe does not report that pid as a live service."""
from __future__ import annotations

import json
import os
import subprocess
import time

from deployctl.hostscripts.probe import probe_fake_gpu, probe_service
from deployctl_runtime.gpu_ledger import GpuMemoryExhausted, Ledger, usage

GiB = 2**30


def _zombie() -> subprocess.Popen:
    """A child that has exited and is not reaped (the caller must not poll() it before it is done)."""
    child = subprocess.Popen(["true"])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with open(f"/proc/{child.pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                return child
        time.sleep(0.01)
    raise AssertionError("the child did not become a zombie")


def test_a_zombies_allocation_is_freed_in_the_ledger_and_the_probe(tmp_path):
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps({"total_bytes": 10 * GiB}))
    child, me = _zombie(), Ledger(path, os.getpid())
    try:
        Ledger(path, child.pid).set(8 * GiB, "weights+kv", "the old release")
        me.set(8 * GiB, "weights+kv", "the new release")  # fits: the zombie's 8 GiB were freed at its exit
        assert usage(path)["used_bytes"] == 8 * GiB and list(usage(path)["allocations"]) == [str(os.getpid())]

        data = json.loads(path.read_text())
        data["allocations"][str(child.pid)] = {"bytes": 2 * GiB, "what": "weights+kv", "label": ""}
        path.write_text(json.dumps(data))  # as if written before it exited
        gpu = probe_fake_gpu(str(path))["gpus"][0]
        assert [p["pid"] for p in gpu["processes"]] == [os.getpid()] and gpu["memory_free"] == 2 * GiB

        root = tmp_path / "deploy"
        (root / "shared" / "run").mkdir(parents=True)
        (root / "shared" / "run" / "runtime.pid").write_text(f"{child.pid}\n")
        assert probe_service(str(root))["alive"] is False
        (root / "shared" / "run" / "runtime.pid").write_text(f"{os.getpid()}\n")
        assert probe_service(str(root))["alive"] is True
        try:
            Ledger(path, 1).set(4 * GiB, "weights+kv")  # a live process (init) that does not fit is still refused
        except GpuMemoryExhausted as exc:
            assert exc.free == 2 * GiB
        else:
            raise AssertionError("a live holder's memory was not counted")
    finally:
        child.wait()
        me.release()
