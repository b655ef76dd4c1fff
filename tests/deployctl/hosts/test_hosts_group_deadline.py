"""run_on_hosts is bounded (issues 31, 28): a host whose part of a group operation never returns is named with a
HostDeadline outcome and the group returns without it; the bound is per host, from its own start, and a stuck host's
worker slot goes to the next host; the worker threads are daemons, so an abandoned one never holds up the caller or
the process's exit; every host's error is kept, BaseExceptions included."""
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


def test_a_stuck_host_frees_its_slot_and_the_hosts_queued_behind_it_get_their_full_deadline():
    release = threading.Event()
    starts: dict[str, float] = {}
    t0 = time.monotonic()

    def fn(h):
        starts[h.name] = time.monotonic() - t0
        if h.name == "stuck":
            release.wait()
        time.sleep(0.6)  # each healthy host needs 0.6 of its 1 s
        return h.name

    hosts = [_Named("stuck")] + [_Named(f"h{i}") for i in range(5)]
    try:
        out = run_on_hosts(hosts, fn, max_workers=2, deadline_s=1.0, what="activate")
    finally:
        release.set()
    took = time.monotonic() - t0
    assert isinstance(out[0].error, HostDeadline) and "activate" in str(out[0].error)
    assert [o.value for o in out[1:]] == [f"h{i}" for i in range(5)]  # a group deadline (1 s) would cut h1..h4
    assert starts["h1"] >= 0.5  # h1 waited for h0's worker, and still had its own second
    assert starts["h2"] < 1.5  # the stuck host's slot went to the queue at its 1 s, not at the group's end
    assert took < 10


def test_an_abandoned_call_that_ends_late_keeps_its_deadline_outcome():
    release = threading.Event()

    def fn(h):
        if h.name == "slow":
            release.wait()
            return "late"
        time.sleep(0.3)
        release.set()  # the slow host's call ends while the group still waits for this one
        time.sleep(0.3)
        return "ok"

    out = run_on_hosts([_Named("slow"), _Named("b"), _Named("c")], fn, max_workers=1, deadline_s=1.0)
    assert isinstance(out[0].error, HostDeadline) and out[0].value is None
    assert out[1].value == out[2].value == "ok"
