"""How fast a canary stops when on-call says so: a `rollback` from a second shell, a `deployctl abort`, and Ctrl-C
of the deploy, each during a long canary pause at 10% (C20; issue 31 moved these times out of the test, which now
asserts only what happened).

A 2-host fleet of local hosts (process launcher, the real runtime on CPU with the tiny model) behind a real nginx,
release 1 deployed; then ``--runs`` rounds of: deploy a canary at 10% (pause 600 s) and stop it three ways. Printed
per way: seconds from the command (or SIGINT) to nginx sending 100% to stable, and to the deploy's exit. The peer,
measured in the same rounds: one runtime restart on a canary host (the abort's own work: switch back, stop, start,
ready), so each figure also prints as a ratio to it — what the stop adds on top of the restart it must do.

    python bench/bench_interrupt.py [--runs 2]
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
sys.path.append(str(ROOT / "tests"))  # support.nginx: a real nginx under its own prefix
from localfleet import kill_runtimes  # noqa: E402  (bench/ is the script's directory)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2)
    args = ap.parse_args()

    import yaml

    from deployctl.config import load_config
    from deployctl.demo.localenv import overlay_venv, tiny_model
    from support.nginx import NginxRouter
    from support.ports import free_port

    work = Path(tempfile.mkdtemp(prefix="bench-interrupt-"))
    router = NginxRouter(work / "nginx")
    hosts = [{"name": f"gpu-{c}", "address": "local", "deploy_root": str(work / c), "launcher": "process",
              "python": str(overlay_venv(work / "venv")), "server_port": free_port()} for c in "ab"]
    cfg = {"service": {"name": "bench-stop"},
           "model": {"path": str(tiny_model(work / "model")), "served_name": "tiny-chat", "dtype": "float32"},
           "engine": {"device": "cpu", "max_model_len": 256, "max_num_seqs": 4, "kv_cache_memory": "8MiB"},
           "server": {"startup_timeout_s": 120, "drain_timeout_s": 5}, "hosts": hosts,
           "router": router.router_config(),
           "rollout": {"canary_hosts": 1, "steps": [10, 100], "pause_s": 600,
                       "analysis": {"interval_s": 2, "min_p99_delta_s": 0.5, "inconclusive_limit": 0}}}
    path = work / "deploy.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    env = {**os.environ, "DEPLOYCTL_CACHE": str(work / "cache"), "DEPLOYCTL_SKIP_PREFLIGHT": "1"}
    canary_port = str(hosts[0]["server_port"])
    upstream = router.upstream_conf

    def cli(*a, check=True):
        r = subprocess.run([sys.executable, "-m", "deployctl", *a, "-c", str(path)], capture_output=True, text=True,
                           timeout=600, env=env, cwd=ROOT)
        if check and r.returncode != 0:
            raise SystemExit(f"`deployctl {' '.join(a)}` failed ({r.returncode}):\n{r.stderr[-3000:]}")
        return r

    def canary_at_10():
        p = subprocess.Popen([sys.executable, "-m", "deployctl", "deploy", "--yes", "--canary", "10", "-c", str(path)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
        end = time.monotonic() + 300
        state = Path(hosts[0]["deploy_root"]) / "state" / "rollout.json"
        while time.monotonic() < end:
            try:
                st = json.loads(state.read_text())
                if st.get("weight") == 10 and st.get("status") == "running" and canary_port in upstream.read_text():
                    return p
            except (OSError, ValueError):
                pass
            if p.poll() is not None:
                raise SystemExit(f"the canary deploy exited {p.returncode}:\n{p.communicate()[1][-3000:]}")
            time.sleep(0.1)
        raise SystemExit("the canary never reached 10%")

    def stop(way: str) -> tuple[float, float, float]:
        deploy = canary_at_10()
        t0 = time.monotonic()
        other = None
        if way == "Ctrl-C":
            deploy.send_signal(signal.SIGINT)
        else:
            other = subprocess.Popen([sys.executable, "-m", "deployctl", way, "-c", str(path)], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
        while canary_port in upstream.read_text() and time.monotonic() - t0 < 300:
            time.sleep(0.05)
        t_router = time.monotonic() - t0
        _, err = deploy.communicate(timeout=300)
        t_exit = time.monotonic() - t0
        if other is not None:
            other.communicate(timeout=300)
        done = time.monotonic() - t0
        want = {"Ctrl-C": 130, "rollback": 6, "abort": 6}[way]
        if deploy.returncode != want:
            raise SystemExit(f"{way}: the deploy exited {deploy.returncode}, not {want}:\n{err[-3000:]}")
        return t_router, t_exit, done

    def restart() -> float:
        """The peer: one canary-host restart (switch back to the same release, stop, start, ready) as an abort does."""
        from deployctl.hosts import Host
        from deployctl.rollout import hostops

        c = load_config(path)
        h = Host.from_config(c.hosts[0])
        rid = os.path.basename(os.readlink(Path(hosts[0]["deploy_root"]) / "current"))
        t0 = time.monotonic()
        hostops.activate(h, c, rid)
        return time.monotonic() - t0

    figures: dict[str, list] = {"rollback": [], "abort": [], "Ctrl-C": []}
    restarts: list[float] = []
    try:
        router.start(load_config(path))
        cli("deploy", "--yes")
        for i in range(args.runs):
            for way in figures:
                t = stop(way)
                figures[way].append(t)
                print(f"run {i + 1}, {way}: nginx 100% stable after {t[0]:.1f} s, deploy exited after {t[1]:.1f} s, "
                      f"all done after {t[2]:.1f} s", flush=True)
                time.sleep(1.1)  # release ids carry the second
            restarts.append(restart())
            print(f"run {i + 1}, peer: one canary-host restart {restarts[-1]:.1f} s", flush=True)
    finally:
        kill_runtimes([h["deploy_root"] for h in hosts])
        router.stop()
        shutil.rmtree(work, ignore_errors=True)
    peer = statistics.median(restarts)
    print(f"\nmedians over {args.runs} runs; peer: one canary-host restart {peer:.1f} s")
    for way, ts in figures.items():
        r, e, d = (statistics.median(x[k] for x in ts) for k in range(3))
        print(f"{way:>8}: nginx 100% stable {r:.1f} s, deploy exit {e:.1f} s ({e / peer:.2f}x the restart), "
              f"done {d:.1f} s")
    print(f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
