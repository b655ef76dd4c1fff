"""run_on_hosts is bounded (issue 31): a host whose part of a group operation never returns is named with a
HostDeadline outcome and the group returns without it; the worker threads are daemons, so an abandoned one never
holds up the caller or the process's exit; every host's error is kept, BaseExceptions included."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time

from deployctl.hosts import HostDeadline, run_on_hosts


class _Named:
    def __init__(self, name: str):
        self.name = name


def test_a_host_that_never_returns_is_named_and_the_others_come_back():
    release = threading.Event()
    hosts = [_Named("gpu-a"), _Named("gpu-b"), _Named("gpu-c")]

    def fn(h):
        if h.name == "gpu-b":
            release.wait()  # a remote call stuck past every timeout
        if h.name == "gpu-c":
            raise RuntimeError("disk full")
        return h.name.upper()

    t0 = time.monotonic()
    try:
        out = run_on_hosts(hosts, fn, deadline_s=1.0, what="switching to r2")
    finally:
        release.set()
    waited = time.monotonic() - t0
    assert [o.host for o in out] == ["gpu-a", "gpu-b", "gpu-c"]
    assert out[0].ok and out[0].value == "GPU-A"
    assert isinstance(out[1].error, HostDeadline)
    assert "gpu-b" in str(out[1].error) and "switching to r2" in str(out[1].error) and "1 s" in str(out[1].error)
    assert isinstance(out[2].error, RuntimeError) and "disk full" in str(out[2].error)
    assert waited < 30  # bounded: it returned instead of waiting for gpu-b (the bound itself is 1 s)


def test_base_exceptions_of_a_host_are_its_outcome_not_the_callers():
    def fn(h):
        if h.name == "b":
            raise KeyboardInterrupt
        return 1

    out = run_on_hosts([_Named("a"), _Named("b")], fn, deadline_s=10)
    assert out[0].value == 1 and isinstance(out[1].error, KeyboardInterrupt)


def test_at_most_max_workers_run_at_once():
    running, peak, lock = [0], [0], threading.Lock()

    def fn(h):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.2)
        with lock:
            running[0] -= 1
        return h.name

    out = run_on_hosts([_Named(f"h{i}") for i in range(6)], fn, max_workers=2, deadline_s=30)
    assert [o.value for o in out] == [f"h{i}" for i in range(6)]
    assert peak[0] == 2


def test_an_abandoned_worker_does_not_keep_the_process_alive():
    code = textwrap.dedent("""
        import threading
        from deployctl.hosts import run_on_hosts

        class H:
            name = "stuck"

        out = run_on_hosts([H()], lambda h: threading.Event().wait(), deadline_s=0.5)
        print(type(out[0].error).__name__)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "HostDeadline"
