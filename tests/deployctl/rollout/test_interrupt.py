"""Cooperative Ctrl-C (deployctl.rollout.interrupt, issue 31): the SIGINT handler raises nothing into the code the
main thread happens to run — a wait inside a lock goes on and releases it — ; the request shows at the next
check(); a second SIGINT exits 130 at once after printing what is left; a prompt still gets KeyboardInterrupt."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from deployctl.rollout.interrupt import Interruption, StopRequested

_CHILD = textwrap.dedent("""
    import sys, threading, time
    from deployctl.rollout.interrupt import Interruption, StopRequested

    intr = Interruption("stopping at the next safe point", on_force=lambda: "gpu-a still runs r2")
    cond = threading.Condition()
    with intr.installed():
        print("ready", flush=True)
        # library code of the kind paramiko runs: a wait on a Condition; a raising handler would cut it mid-way
        with cond:
            end = time.monotonic() + 3
            while time.monotonic() < end:
                cond.wait(0.05)
        print("lock free:", cond.acquire(timeout=1), flush=True)
        try:
            intr.check()
            print("no request", flush=True)
        except StopRequested as e:
            print("stop requested:", e, flush=True)
        if "--second" in sys.argv:
            print("waiting for the second", flush=True)
            time.sleep(60)
""")


def _child(*args):
    p = subprocess.Popen([sys.executable, "-c", _CHILD, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    assert p.stdout.readline().strip() == "ready"
    return p


def test_first_ctrl_c_is_recorded_and_raised_only_at_the_check_point():
    p = _child()
    time.sleep(0.5)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert "lock free: True" in out  # the wait inside the lock went on and released it
    assert "stop requested: interrupted (Ctrl-C)" in out
    assert "Ctrl-C: stopping at the next safe point (Ctrl-C again exits at once)" in err
    assert "Traceback" not in err


def test_second_ctrl_c_exits_130_saying_what_is_left():
    p = _child("--second")
    time.sleep(0.3)
    p.send_signal(signal.SIGINT)
    for line in p.stdout:
        if line.startswith("waiting for the second"):
            break
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 130
    assert time.monotonic() - t0 < 20  # it did not sleep out its 60 s
    assert "second Ctrl-C: exiting now. gpu-a still runs r2" in err


def test_suspended_gives_a_prompt_its_keyboard_interrupt_back():
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN when the suite runs in a background job (`cmd &`)
    intr = Interruption("x")
    with intr.installed():
        with intr.suspended():
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(5)
        os.kill(os.getpid(), signal.SIGINT)  # the cooperative handler is back: recorded, nothing raised
        time.sleep(0.05)
        assert intr.requested
        with pytest.raises(StopRequested):
            intr.check()
    assert signal.getsignal(signal.SIGINT) is before


def test_abort_goes_on_without_a_host_that_misses_its_deadline_and_names_it(monkeypatch):
    """Fleet.restore: one switched host's restart never returns; the other is put back and routed, the stuck one
    is reported as not restored (by name), and restore returns within its deadline instead of waiting forever."""
    import threading

    from deployctl.config import parse_config
    from deployctl.rollout import fleet as fleet_mod, hostops

    cfg = parse_config("""
service: {name: svc}
model: {path: /m}
hosts:
  - {name: a, address: 127.0.0.1, deploy_root: /d/a, server_port: 8001}
  - {name: b, address: 127.0.0.1, deploy_root: /d/b, server_port: 8002}
  - {name: c, address: 127.0.0.1, deploy_root: /d/c, server_port: 8003}
""")

    class FakeHost:
        def __init__(self, name):
            self.name = name

    stuck = threading.Event()

    def restore(h, cfg, release_id, **kw):
        if h.name == "b":
            stuck.wait()  # the restart (or wake) that never comes back
        return "ok"

    monkeypatch.setattr(fleet_mod.standby, "restore", restore)
    monkeypatch.setattr(hostops, "activate_deadline_s", lambda cfg: 1.0)
    fl = fleet_mod.Fleet(cfg, lambda *a, **k: None)
    fl.hosts = {n: FakeHost(n) for n in "abc"}
    routed = []

    class Plan:
        from_release = "r1"

    try:
        problems = fl.restore(Plan(), {"a", "b"}, lambda split: routed.append(split.stable))
    finally:
        stuck.set()
    assert len(problems) == 1 and problems[0].startswith("b: no result from going back to r1 within 1 s"), problems
    assert routed == [("c",), ("c", "a")]  # never-switched hosts first, then the one that came back; b left out
