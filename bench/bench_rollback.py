"""Rollback time on a 3-host fleet of local hosts (process launcher, the real runtime on CPU with the tiny model,
a real nginx router when one is installed), with where the time goes (``deployctl rollback --json`` phases).

Deploys two releases, then rolls back and forth ``--runs`` times (``rollback --to``), with ``hosts[].spare_port``
set (every host starts the restored release beside the serving one at once). Peers: each host's runtime start in
the same rollbacks (ratio rollback / start: what the rollback adds on top of the start), and the same rollbacks on
a fleet without spare_port (two batches one after the other; ``--no-peer`` skips it). Target (issue 21, C32):
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


def _fleet(args, spare: bool) -> tuple[list, list]:
    """Deploy two releases on a fresh fleet, then ``args.runs`` rollbacks between them; prints each one's phases.
    Returns (rollback seconds, one runtime start's seconds per host and rollback)."""
    from deployctl.demo.localenv import overlay_venv, tiny_model
    from support.nginx import NginxRouter
    from support.ports import free_port

    work = Path(tempfile.mkdtemp(prefix="bench-rollback-"))
    router = NginxRouter(work / "nginx") if shutil.which("nginx") or Path("/usr/sbin/nginx").exists() else None
    cfg = {
        "service": {"name": "bench-rb"},
        "model": {"path": str(tiny_model(work / "model")), "served_name": "tiny-chat", "dtype": "float32"},
        "engine": {"device": "cpu", "max_model_len": 256, "max_num_seqs": 4, "max_num_batched_tokens": 256,
                   "kv_cache_memory": "8MiB"},
        "server": {"startup_timeout_s": 120, "drain_timeout_s": 5},
        "hosts": [{"name": f"h{i}", "address": "local", "deploy_root": str(work / f"h{i}"), "launcher": "process",
                   "python": str(overlay_venv(work / "venv")), "server_port": free_port(),
                   **({"spare_port": free_port()} if spare else {})}
                  for i in range(args.hosts)],
        "rollout": {"canary_hosts": 1, "steps": [100], "pause_s": 0},
    }
    if router is not None:
        cfg["router"] = router.router_config()
    path = work / "deploy.yaml"
    import yaml

    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    env = {"DEPLOYCTL_CACHE": str(work / "cache"), "DEPLOYCTL_SKIP_PREFLIGHT": "1"}
    mode = "spare_port: started beside the old one" if spare else "no spare_port: two batches"
    print(f"-- {args.hosts}-host fleet{' + nginx' if router else ''}, {mode}")
    try:
        if router is not None:
            from deployctl.config import load_config

            router.start(load_config(path))
        releases = []
        for _ in range(2):
            _cli(path, "deploy", "--yes", env=env)
            releases.append(os.path.basename(os.readlink(work / "h0" / "current")))
            time.sleep(1.1)  # release ids carry the second
        totals, starts = [], []
        for i in range(args.runs):
            to = releases[i % 2]
            doc = json.loads(_cli(path, "rollback", "--to", to, "--json", env=env).stdout)
            totals.append(doc["duration_s"])
            ph = doc["phases"]
            for b in ph["batches"]:
                starts += [t["ready_s"] + t.get("start_s", 0) for t in b["hosts"].values()]
            print(f"rollback {i + 1} to {to}: {doc['duration_s']:.1f} s; prepare {ph['prepare_s']:g}, "
                  f"lock {ph['lock_s']:g}, router {ph['router_s']:g}, drain old {ph.get('drain_s', 0):g}, "
                  f"record {ph['record_s']:g}, batches "
                  + "; ".join(f"{b['wall_s']:g} s [" + ", ".join(
                      f"{h}: " + " ".join(f"{k[:-2]} {v:g}" for k, v in t.items()) for h, t in b["hosts"].items())
                      + "]" for b in ph["batches"]))
        return totals, starts
    finally:
        for i in range(args.hosts):
            run = work / f"h{i}" / "shared" / "run"
            for pidfile in run.glob("runtime*.pid") if run.is_dir() else ():
                try:
                    os.killpg(int(pidfile.read_text().split()[0]), signal.SIGKILL)
                except (OSError, ValueError):
                    pass
        if router is not None:
            router.stop()
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--hosts", type=int, default=3)
    ap.add_argument("--peer", action=argparse.BooleanOptionalAction, default=True,
                    help="also time the same rollbacks without spare_port (two batches) as the peer run")
    args = ap.parse_args()
    totals, starts = _fleet(args, spare=True)
    med, start = statistics.median(totals), statistics.median(starts)
    print(f"\n{args.hosts}-host fleet: rollback median {med:.1f} s over {args.runs} runs (min {min(totals):.1f}, "
          f"max {max(totals):.1f}); one runtime start (launch → /readyz 200, {args.hosts} at once) median "
          f"{start:.1f} s; ratio rollback / start {med / start:.2f}; target < 15 s: {'met' if med < 15 else 'NOT met'}")
    if args.peer:
        peer, _ = _fleet(args, spare=False)
        pm = statistics.median(peer)
        print(f"peer without spare_port (two batches): median {pm:.1f} s (min {min(peer):.1f}, max {max(peer):.1f}); "
              f"ratio spare / batches {med / pm:.2f}")
    print(f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
