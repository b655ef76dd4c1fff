"""Scale-out to serving by a wake (a warm-pool host whose engine sleeps) and by a cold start (its engine stopped and
its releases purged: install, start, load), in one run on one local loopback fleet: 3 local hosts (process launcher,
the real runtime on CPU with the tiny model, a real nginx router when one is installed), h0 and h1 serving, h2
``pool: warm``. Per run: ``scale in h2 --purge``, ``scale out h2`` (cold), ``scale in h2`` (its engine sleeps),
``scale out h2`` (wake). "To serving" is ``to_serving_s`` from ``scale out --json``: from the command's start until
the engine is verified (ready, sample inference, golden answers), before the warm-up and the slow-start ramp, which
are printed beside it. Prints both medians and their ratio (issue 42: seconds instead of a cold start).

    python bench/bench_scale.py [--runs 2]
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.append(str(ROOT / "tests"))  # support.nginx: a real nginx under its own prefix (after deployctl)
from localfleet import cli, kill_runtimes  # noqa: E402  (bench/ is the script's directory)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2)
    args = ap.parse_args()
    from deployctl.demo.localenv import overlay_venv, tiny_model
    from support.nginx import NginxRouter
    from support.ports import free_port
    import yaml

    work = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    router = NginxRouter(work / "nginx") if shutil.which("nginx") or Path("/usr/sbin/nginx").exists() else None
    if router is None:
        raise SystemExit("bench_scale needs nginx (scale out ramps the router's weights)")
    python = str(overlay_venv(work / "venv"))
    cfg = {
        "service": {"name": "bench-scale"},
        "model": {"path": str(tiny_model(work / "model")), "served_name": "tiny-chat", "dtype": "float32"},
        "engine": {"device": "cpu", "max_model_len": 256, "max_num_seqs": 4, "max_num_batched_tokens": 256,
                   "kv_cache_memory": "8MiB"},
        "server": {"startup_timeout_s": 120, "drain_timeout_s": 5},
        "hosts": [{"name": f"h{i}", "address": "local", "deploy_root": str(work / f"h{i}"), "launcher": "process",
                   "python": python, "server_port": free_port(), **({"pool": "warm"} if i == 2 else {})}
                  for i in range(3)],
        "rollout": {"canary_hosts": 1, "steps": [100], "pause_s": 0},
        "router": router.router_config(),
    }
    path = work / "deploy.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    env = {"DEPLOYCTL_CACHE": str(work / "cache"), "DEPLOYCTL_SKIP_PREFLIGHT": "1",
           "DEPLOYCTL_STATE": str(work / "control")}
    from deployctl.config import load_config

    router.start(load_config(path))
    cold, wake = [], []
    try:
        cli(path, "deploy", "--yes", env=env)
        cfg["engine"]["max_num_seqs"] = 3  # a second release, deployed as a canary: its golden answers recorded,
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))  # so that both paths ask them
        cli(path, "deploy", "--yes", env=env)
        cli(path, "scale", "out", "h2", "--slow-start", "1", env=env)  # the first start: pip caches warm
        for i in range(args.runs):
            cli(path, "scale", "in", "h2", "--purge", env=env)
            for label, into in (("cold start", cold), ("wake", wake)):
                doc = json.loads(cli(path, "scale", "out", "h2", "--slow-start", "1", "--json", env=env).stdout)
                want = "wake" if label == "wake" else "start"
                if doc["paths"]["h2"] != want:
                    raise SystemExit(f"run {i + 1}: scale out took the {doc['paths']['h2']} path, not {want}")
                into.append(doc["to_serving_s"]["h2"])
                t = doc["timings"]["h2"]
                print(f"run {i + 1}, {label}: serving (verified) after {doc['to_serving_s']['h2']:.2f} s "
                      f"({', '.join(f'{k} {v:g}' for k, v in t.items())}); warm-up "
                      f"{doc['warmup']['h2']['requests']} requests {doc['warmup']['h2']['seconds']:g} s; "
                      f"whole command {doc['duration_s']:.1f} s", flush=True)
                if label == "cold start":
                    cli(path, "scale", "in", "h2", env=env)  # its engine asleep for the wake
    finally:
        kill_runtimes([work / f"h{i}" for i in range(3)])
        router.stop()
        shutil.rmtree(work, ignore_errors=True)
    c, w = statistics.median(cold), statistics.median(wake)
    print(f"scale-out to serving, median of {args.runs}: cold start {c:.2f} s, wake {w:.2f} s, "
          f"wake / cold = {w / c:.2f}")


if __name__ == "__main__":
    main()
