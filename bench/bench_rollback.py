"""Rollback time on a 3-host fleet of local hosts (process launcher, the real runtime on CPU with the tiny model,
a real nginx router when one is installed), with where the time goes (``deployctl rollback --json`` phases).

Three fleets, interleaved run by run so that all see the same load:
- wake: ``hosts[].spare_port`` and ``rollout.standby_s`` (default): each run deploys a new release (the previous
  one sleeps on every host's other port) and rolls back to it: every host wakes its standby at once (issue 25);
- cold start: spare_port with ``standby_s: 0``: the restored release starts beside the serving one on every host
  at once (C32), rolled back and forth with ``rollback --to``;
- two batches: no spare_port: a third of the hosts restart, then the rest.
Also each host's runtime start in the cold-start rollbacks (ratio rollback / start). Targets: wake <= 0.3x cold
start and < 3 s here (issue 25), judged on ``phases.serving_s`` (until nginx points at the restored release on
every host: done for users; the command's whole time, with the bad release's drain and stop, is printed beside it);
cold start < 15 s (issue 21). ``--no-peer`` times the wake fleet alone.

    python bench/bench_rollback.py [--runs 3] [--hosts 3] [--no-peer]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.append(str(ROOT / "tests"))  # support.nginx: a real nginx under its own prefix (after deployctl)
from localfleet import cli  # noqa: E402  (bench/ is the script's directory)


class _Fleet:
    """A fresh fleet of ``hosts`` local hosts behind its own nginx, with or without spare_port, two releases
    deployed; ``rollback(i)`` rolls back to the other release and returns the ``rollback --json`` document."""

    def __init__(self, hosts: int, spare: bool, wake: bool = False):
        from deployctl.demo.localenv import overlay_venv, tiny_model
        from support.nginx import NginxRouter
        from support.ports import free_port

        self.hosts, self.spare, self.wake = hosts, spare, wake
        self.work = work = Path(tempfile.mkdtemp(prefix="bench-rollback-"))
        self.router = NginxRouter(work / "nginx") if shutil.which("nginx") or Path("/usr/sbin/nginx").exists() else None
        cfg = {
            "service": {"name": "bench-rb"},
            "model": {"path": str(tiny_model(work / "model")), "served_name": "tiny-chat", "dtype": "float32"},
            "engine": {"device": "cpu", "max_model_len": 256, "max_num_seqs": 4, "max_num_batched_tokens": 256,
                       "kv_cache_memory": "8MiB"},
            "server": {"startup_timeout_s": 120, "drain_timeout_s": 5},
            "hosts": [{"name": f"h{i}", "address": "local", "deploy_root": str(work / f"h{i}"), "launcher": "process",
                       "python": str(overlay_venv(work / "venv")), "server_port": free_port(),
                       **({"spare_port": free_port()} if spare else {})}
                      for i in range(hosts)],
            "rollout": {"canary_hosts": 1, "steps": [100], "pause_s": 0, **({} if wake else {"standby_s": 0})},
        }
        if self.router is not None:
            cfg["router"] = self.router.router_config()
        self.path = work / "deploy.yaml"
        import yaml

        self.path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        self.env = {"DEPLOYCTL_CACHE": str(work / "cache"), "DEPLOYCTL_SKIP_PREFLIGHT": "1"}
        self.label = ("wake (the standby woken)" if wake else "cold start (started beside the old one)" if spare
                      else "two batches (no spare_port)")
        self.releases: list[str] = []

    def deploy_two(self) -> None:
        if self.router is not None:
            from deployctl.config import load_config

            self.router.start(load_config(self.path))
        for _ in range(2):
            cli(self.path, "deploy", "--yes", env=self.env)
            self.releases.append(os.path.basename(os.readlink(self.work / "h0" / "current")))
            time.sleep(1.1)  # release ids carry the second

    def rollback(self, i: int) -> dict:
        if self.wake:  # a new release, the previous one asleep on every host: roll back to it
            to = os.path.basename(os.readlink(self.work / "h0" / "current"))
            cli(self.path, "deploy", "--yes", env=self.env)
            time.sleep(1.1)
        else:
            to = self.releases[i % 2]
        doc = json.loads(cli(self.path, "rollback", "--to", to, "--json", env=self.env).stdout)
        ph = doc["phases"]
        print(f"{self.label}, rollback {i + 1}: {doc['duration_s']:.1f} s, serving the target after "
              f"{ph.get('serving_s', 0):.1f} s; prepare {ph['prepare_s']:g}, "
              f"lock {ph['lock_s']:g}, router {ph['router_s']:g}, drain old {ph.get('drain_s', 0):g}, "
              f"record {ph['record_s']:g}, batches "
              + "; ".join(f"{b['wall_s']:g} s [" + ", ".join(
                  f"{h}: " + " ".join(f"{k[:-2]} {v:g}" for k, v in t.items()) for h, t in b["hosts"].items())
                  + "]" for b in ph["batches"]), flush=True)
        modes = [b.get("mode", "batch") for b in ph["batches"]]
        want = "wake" if self.wake else "beside" if self.spare else "batch"
        if any(m != want for m in modes):
            raise SystemExit(f"{self.label}: rollback {i + 1} took the {modes} path, not {want}: {ph}")
        return doc

    def close(self) -> None:
        for i in range(self.hosts):
            run = self.work / f"h{i}" / "shared" / "run"
            for pidfile in run.glob("runtime*.pid") if run.is_dir() else ():
                try:
                    os.killpg(int(pidfile.read_text().split()[0]), signal.SIGKILL)
                except (OSError, ValueError):
                    pass
        if self.router is not None:
            self.router.stop()
        shutil.rmtree(self.work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--hosts", type=int, default=3)
    ap.add_argument("--peer", action=argparse.BooleanOptionalAction, default=True,
                    help="also time the same rollbacks on a fleet without spare_port (two batches), interleaved")
    args = ap.parse_args()
    fleets = [_Fleet(args.hosts, spare=True, wake=True)]
    if args.peer:
        fleets += [_Fleet(args.hosts, spare=True), _Fleet(args.hosts, spare=False)]
    try:
        for f in fleets:
            f.deploy_two()
        totals: dict[str, list] = {f.label: [] for f in fleets}
        served: dict[str, list] = {f.label: [] for f in fleets}
        starts, wakes = [], []
        for i in range(args.runs):  # interleaved: the fleets see the same load, run by run
            for f in fleets:
                doc = f.rollback(i)
                totals[f.label].append(doc["duration_s"])
                served[f.label].append(doc["phases"]["serving_s"])
                hosts = [t for b in doc["phases"]["batches"] for t in b["hosts"].values()]
                if f.wake:
                    wakes += [sum(t.values()) for t in hosts]
                elif f.spare:
                    starts += [t["ready_s"] + t.get("start_s", 0) for t in hosts]
    finally:
        for f in fleets:
            f.close()
    meds = {k: statistics.median(v) for k, v in totals.items()}
    smeds = {k: statistics.median(v) for k, v in served.items()}
    for f in fleets:
        t = totals[f.label]
        print(f"\n{args.hosts}-host fleet + nginx, rollback by {f.label}: serving the target after median "
              f"{smeds[f.label]:.2f} s; the command (draining and stopping the bad release, the record) median "
              f"{meds[f.label]:.2f} s over {args.runs} runs (min {min(t):.2f}, max {max(t):.2f})", end="")
    print()
    # the rollback is done for users when nginx points at the restored release on every host (phases.serving_s);
    # the targets are judged on that, the command's whole time is printed beside it
    wake, wake_cmd = smeds[fleets[0].label], meds[fleets[0].label]
    print(f"one host's wake + verify (wake, ready, sample request) median {statistics.median(wakes):.2f} s; "
          f"rollback by wake target < 3 s (serving): {'met' if wake < 3 else 'NOT met'}")
    if args.peer:
        cold, batches = smeds[fleets[1].label], smeds[fleets[2].label]
        start = statistics.median(starts)
        print(f"serving after: wake / cold start {wake / cold:.2f}x (target <= 0.3x: "
              f"{'met' if wake <= 0.3 * cold else 'NOT met'}); wake / two batches {wake / batches:.2f}x; "
              f"cold start / two batches {cold / batches:.2f}x")
        print(f"whole command: wake / cold start {wake_cmd / meds[fleets[1].label]:.2f}x; wake / two batches "
              f"{wake_cmd / meds[fleets[2].label]:.2f}x")
        cold = meds[fleets[1].label]
        print(f"one runtime start in the cold-start rollbacks (launch -> /readyz 200, {args.hosts} at once) median "
              f"{start:.1f} s; ratio cold-start rollback / start {cold / start:.2f}; cold start target < 15 s: "
              f"{'met' if cold < 15 else 'NOT met'}")
    print(f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
