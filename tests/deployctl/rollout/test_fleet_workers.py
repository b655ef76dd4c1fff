"""rollout.parallel_hosts bounds every fleet-wide read and write, the lock's, the state store's and the metrics
scrapes' too (they had a fixed 8): with parallel_hosts 1 on 6 ``address: local`` hosts, no two of their remote
commands overlap in time (DEPLOYCTL_TRACE_REMOTE gives each command's end and duration)."""
from __future__ import annotations

import json

from deployctl.config import parse_config
from deployctl.rollout.analysis import Analyzer
from deployctl.rollout.events import emitter
from deployctl.rollout.fleet import Fleet
from deployctl.rollout.state import RolloutState


def _config(root, parallel: int):
    hosts = "".join(f"  - {{name: h{i}, address: local, deploy_root: {root}/h{i}, launcher: process, "
                    f"server_port: {18600 + i}}}\n" for i in range(6))
    return parse_config("service: {name: svc}\nmodel: {path: /m}\nhosts:\n" + hosts
                        + f"rollout: {{parallel_hosts: {parallel}}}\n")


def _most_at_once(trace) -> int:
    """The most commands of the trace running at one moment (1 ms of slack for its rounding)."""
    edges = []
    for line in trace.read_text().splitlines():
        rec = json.loads(line)
        edges += [(rec["t"] - rec["s"] + 0.001, 1), (rec["t"], -1)]
    most = now = 0
    for _, step in sorted(edges):
        now += step
        most = max(most, now)
    return most


def test_parallel_hosts_bounds_the_lock_the_state_store_and_the_scrapes(tmp_path, monkeypatch):
    trace = tmp_path / "trace.jsonl"
    monkeypatch.setenv("DEPLOYCTL_TRACE_REMOTE", str(trace))
    cfg = _config(tmp_path, 1)
    fleet = Fleet(cfg, emitter(None))
    fleet.connect()
    try:
        fleet.store.write_rollout(RolloutState(release="r1"))
        assert fleet.store.read_rollout().release == "r1"
        fleet.store.append_history("deploy", release="r1", result="ok")
        fleet.lock("deploy")
        assert len(fleet.inspect_lock()) == 6
        fleet.unlock()
        names = list(fleet.hosts)
        samples, _ = Analyzer(cfg, None, fleet.hosts, names[:1], names[1:])._scrape_all()
        assert set(samples) == set(names)  # every host asked (nothing serves: no samples)
    finally:
        fleet.close()
    lines = trace.read_text().splitlines()
    assert len(lines) >= 6 * 7, len(lines)
    assert _most_at_once(trace) == 1, lines
