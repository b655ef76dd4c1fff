"""Rollback time on a 3-host fleet of local hosts (process launcher, the real runtime on CPU with the tiny model,
a real nginx router when one is installed), with where the time goes (``deployctl rollback --json`` phases).

Deploys two releases, then rolls back and forth ``--runs`` times (``rollback --to``), with ``hosts[].spare_port``
set (every host starts the restored release beside the serving one at once). Peers: each host's runtime start in
the same rollbacks (ratio rollback / start: what the rollback adds on top of the start), and the same rollbacks on
a fleet without spare_port (two batches one after the other), interleaved run by run so that both see the same
load (``--no-peer`` skips it). Target (issue 21, C32):
rollback < 15 s.

    python bench/bench_rollback.py [--runs 3] [--hosts 3] [--no-peer]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.append(str(ROOT / "tests"))  # support.nginx: a real nginx under its own prefix (after deployctl)


def _cli(path: Path, *args: str, env: dict) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "deployctl", *args, "-c", str(path)], capture_output=True, text=True,
                       timeout=600, env={**os.environ, **env}, cwd=ROOT)
    if r.returncode != 0:
        raise SystemExit(f"`deployctl {' '.join(args)}` failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return r


class _Fleet:
    """A fresh fleet of ``hosts`` local hosts behind its own nginx, with or without spare_port, two releases
    deployed; ``rollback(i)`` rolls back to the other release and returns the ``rollback --json`` document."""

    def __init__(self, hosts: int, spare: bool):
        from deployctl.demo.localenv import overlay_venv, tiny_model
        from support.nginx import NginxRouter
        from support.ports import free_port

        self.hosts, self.spare = hosts, spare
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
            "rollout": {"canary_hosts": 1, "steps": [100], "pause_s": 0},
        }
        if self.router is not None:
            cfg["router"] = self.router.router_config()
        self.path = work / "deploy.yaml"
        import yaml

        self.path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        self.env = {"DEPLOYCTL_CACHE": str(work / "cache"), "DEPLOYCTL_SKIP_PREFLIGHT": "1"}
        self.label = "spare_port (started beside the old one)" if spare else "no spare_port (two batches)"
        self.releases: list[str] = []

    def deploy_two(self) -> None:
        if self.router is not None:
            from deployctl.config import load_config

            self.router.start(load_config(self.path))
        for _ in range(2):
            _cli(self.path, "deploy", "--yes", env=self.env)
            self.releases.append(os.path.basename(os.readlink(self.work / "h0" / "current")))
            time.sleep(1.1)  # release ids carry the second

    def rollback(self, i: int) -> dict:
        to = self.releases[i % 2]
        doc = json.loads(_cli(self.path, "rollback", "--to", to, "--json", env=self.env).stdout)
        ph = doc["phases"]
        print(f"{self.label}, rollback {i + 1}: {doc['duration_s']:.1f} s; prepare {ph['prepare_s']:g}, "
              f"lock {ph['lock_s']:g}, router {ph['router_s']:g}, drain old {ph.get('drain_s', 0):g}, "
              f"record {ph['record_s']:g}, batches "
              + "; ".join(f"{b['wall_s']:g} s [" + ", ".join(
                  f"{h}: " + " ".join(f"{k[:-2]} {v:g}" for k, v in t.items()) for h, t in b["hosts"].items())
                  + "]" for b in ph["batches"]), flush=True)
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
    fleets = [_Fleet(args.hosts, spare=True)] + ([_Fleet(args.hosts, spare=False)] if args.peer else [])
    try:
        for f in fleets:
            f.deploy_two()
        totals: dict[bool, list] = {True: [], False: []}
        starts = []
        for i in range(args.runs):  # interleaved: both fleets see the same load, run by run
            for f in fleets:
                doc = f.rollback(i)
                totals[f.spare].append(doc["duration_s"])
                if f.spare:
                    starts += [t["ready_s"] + t.get("start_s", 0) for b in doc["phases"]["batches"]
                               for t in b["hosts"].values()]
    finally:
        for f in fleets:
            f.close()
    med, start = statistics.median(totals[True]), statistics.median(starts)
    t = totals[True]
    print(f"\n{args.hosts}-host fleet + nginx: rollback median {med:.1f} s over {args.runs} runs (min {min(t):.1f}, "
          f"max {max(t):.1f}); one runtime start (launch → /readyz 200, {args.hosts} at once) median {start:.1f} s; "
          f"ratio rollback / start {med / start:.2f}; target < 15 s: {'met' if med < 15 else 'NOT met'}")
    if args.peer:
        p = totals[False]
        pm = statistics.median(p)
        print(f"peer without spare_port (two batches, interleaved): median {pm:.1f} s (min {min(p):.1f}, "
              f"max {max(p):.1f}); ratio spare / batches {med / pm:.2f}")
    print(f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
