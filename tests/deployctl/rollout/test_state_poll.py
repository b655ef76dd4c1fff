"""A running deploy polls control.json between its step boundaries (issue 28, fleet scale): one host's copy per
poll, the next host each time, and at most one read per POLL_MAX_AGE_S however many threads check — where every
check once read every host (N reads a tick, N x N during a parallel readiness wait). Real hosts: ``address:
local`` ones, whose reads are real subprocesses; the reads are counted on the way to them."""
from __future__ import annotations

import json
import os
import threading
import time

import pytest

from deployctl.config import HostConfig
from deployctl.errors import RemoteError
from deployctl.hosts import Host
from deployctl.rollout.state import StateStore


class _Counting(Host):
    """A local host that counts the control.json reads it runs."""

    reads = 0
    fail = False

    def run(self, argv, **kw):
        if "control.json" in str(argv):
            self.reads += 1
            if self.fail:
                raise RemoteError(f"{self.name}: lost the connection")
        return super().run(argv, **kw)


@pytest.fixture
def hosts(tmp_path):
    out = []
    for i in range(8):
        h = Host.from_config(HostConfig(name=f"h{i}", address="local", deploy_root=str(tmp_path / f"h{i}"),
                                        launcher="process"))
        h.__class__ = _Counting
        out.append(h)
    yield out
    for h in out:
        h.close()


def test_one_host_read_per_poll_in_turn_and_one_read_per_tick_for_all_threads(hosts):
    store = StateStore(hosts)
    store.send("deploy")
    base = [h.reads for h in hosts]  # send reads every host once (the generation to bump)
    for _ in range(8):
        assert store.poll_control(max_age_s=0).command == "deploy"
    assert [h.reads - b for h, b in zip(hosts, base)] == [1] * 8  # each host once, in turn

    # 16 threads checking at once, as readiness waits in 16 host workers do: one read between them
    before = sum(h.reads for h in hosts)
    store._polled = None
    seen = []
    threads = [threading.Thread(target=lambda: seen.append(store.poll_control(max_age_s=60))) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(h.reads for h in hosts) - before == 1 and len(seen) == 16


def test_a_request_from_another_shell_is_seen_at_the_next_poll(hosts):
    mine, other = StateStore(hosts), StateStore(hosts)
    start = mine.send("deploy")
    assert mine.poll_control(max_age_s=0).generation == start.generation
    other.send("abort", reason="from another shell")
    c = mine.poll_control(max_age_s=0)
    assert (c.command, c.generation) == ("abort", start.generation + 1)


def test_a_host_the_sender_missed_does_not_hide_what_another_host_showed(hosts, tmp_path):
    store = StateStore(hosts)
    StateStore(hosts).send("abort")
    os.remove(tmp_path / "h1" / "state" / "control.json")  # the sender never reached h1
    assert store.poll_control(max_age_s=0).command == "abort"  # h0
    assert store.poll_control(max_age_s=0).command == "abort"  # h1 has none: h0's record stands


def test_a_lost_host_raises_at_its_turn(hosts):
    store = StateStore(hosts)
    store.send("deploy")
    hosts[3].fail = True
    for _ in range(3):
        store.poll_control(max_age_s=0)
    with pytest.raises(RemoteError, match="h3"):
        store.poll_control(max_age_s=0)


def test_the_senders_own_request_is_never_followed_by_an_older_poll(hosts):
    store = StateStore(hosts)
    store.poll_control(max_age_s=60)  # generation 0 read and kept
    c = store.send("deploy")
    assert store.poll_control(max_age_s=60).generation == c.generation  # not the 0 read before
    assert json.loads((open(os.path.join(hosts[0].config.deploy_root, "state", "control.json")).read()))[
        "generation"] == c.generation

