"""How deploy and rollback time grow with the fleet (issue 28): 8, 16 and 32 hosts in one run.

Each host is a real OpenSSH server on 127.0.0.1 (tests/support/sshd.py's fleet, so every remote command pays a
real SSH round trip) running the light stand-in engine (tests/support/standin_engine: deployed through the
ordinary DEPLOYCTL_RUNTIME_WHEEL upload, pip install, launch.sh supervisor and verify; it starts in well under a
second, so the times are deployctl's own: SSH, uploads, installs, router reloads, state files). A real nginx routes.

Per fleet size: the first deploy (every host at once, ``rollout.parallel_hosts`` at a time), a canary deploy (one
canary host at 100%, then the rest in batches of ``rollout.max_unavailable``, default a quarter), and a rollback (a
third of the hosts, then the rest). The peer is the linear extrapolation from the smallest fleet: each line prints
time / (hosts / smallest × the smallest fleet's time); below 1.0 grows less than linearly.

    python bench/bench_fleet.py [--hosts 8,16,32] [--parallel-hosts 8]
    python bench/bench_fleet.py --one-sshd 10:30:60 [--hosts 8,16,32]

Each size starts with `deployctl preflight` (its time and the hosts it reached). ``--one-sshd MAXSTARTUPS``: the N
host entries share one sshd with that MaxStartups (as behind a bastion; each entry its own deploy_root and ports),
and the last line gives the largest size's time over the smallest's (issue 41).

Needs root (sshd) and nginx: tests/setup.sh installs both.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.append(str(ROOT / "tests"))


def _model(d: Path) -> Path:
    """The stand-in's model directory: the files deployctl hashes and reads, no weights."""
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"model_type": "standin", "max_position_embeddings": 256}) + "\n")
    (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{% for m in messages %}{{ m.content }}"
                                                                          "{% endfor %}"}) + "\n")
    (d / "manifest.sha256").write_text("".join(f"{hashlib.sha256((d / n).read_bytes()).hexdigest()}  {n}\n"
                                               for n in ("config.json", "tokenizer_config.json")))
    return d


def _cli(path: Path, env: dict, *args: str) -> tuple[float, dict]:
    """Run one deployctl command; (seconds, its remote commands from $DEPLOYCTL_TRACE_REMOTE: per host
    ``commands`` and ``remote_s``, the mean over hosts)."""
    trace = path.with_name(f"trace-{time.monotonic_ns()}.jsonl")
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "deployctl", *args, "-c", str(path)], capture_output=True, text=True,
                       timeout=1800, env={**os.environ, **env, "DEPLOYCTL_TRACE_REMOTE": str(trace)}, cwd=ROOT)
    wall = time.monotonic() - t0
    if r.returncode != 0:
        raise SystemExit(f"`deployctl {' '.join(args)}` failed ({r.returncode}):\n{r.stderr[-3000:]}")
    per: dict[str, list] = {}
    kinds: dict[str, list] = {}  # the command's first 60 characters -> [count, seconds] over the gpu-* hosts
    for line in trace.read_text().splitlines() if trace.exists() else []:
        rec = json.loads(line)
        per.setdefault(rec["host"], []).append(rec["s"])
        if rec["host"].startswith("gpu-"):
            k = kinds.setdefault(" ".join(rec["cmd"].split())[:60], [0, 0.0])
            k[0] += 1
            k[1] += rec["s"]
    hosts = [v for k, v in per.items() if k.startswith("gpu-")]
    n = max(1, len(hosts))
    top = sorted(kinds.items(), key=lambda kv: -kv[1][1])[:6]
    return wall, {"commands": sum(map(len, hosts)) / n, "remote_s": sum(map(sum, hosts)) / n,
                  "top": [(cmd, c / n, t / n) for cmd, (c, t) in top]}


def _preflight(path: Path, env: dict) -> tuple[float, int]:
    """`deployctl preflight --json` (its exit may be non-zero: a check failing on this machine is not the point);
    (seconds, hosts reached: no failed "reach" check)."""
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "deployctl", "preflight", "--json", "-c", str(path)], capture_output=True,
                       text=True, timeout=1800, env={**os.environ, **env}, cwd=ROOT)
    wall = time.monotonic() - t0
    if not r.stdout.strip():
        raise SystemExit(f"`deployctl preflight` printed nothing ({r.returncode}):\n{r.stderr[-3000:]}")
    doc = json.loads(r.stdout)
    return wall, sum(all(c["name"] != "reach" for c in h["checks"]) for h in doc["hosts"])


def run_size(n: int, parallel: int, work: Path, python: str, model: Path, wheel: Path, key: Path,
             max_startups: str | None = None) -> dict:
    """One fleet of ``n`` hosts: preflight, a first deploy, a canary deploy, a rollback. ``max_startups``: the ``n``
    host entries share one sshd with that MaxStartups (each its own deploy_root and port) instead of one sshd each."""
    import yaml

    from support.nginx import NginxRouter
    from support.ports import free_port
    from support.sshd import Fleet

    root = work / f"fleet-{n}"
    root.mkdir()
    os.chmod(root, 0o755)
    known = root / "known_hosts"
    known.touch()
    fleet = Fleet(root, key, known)
    nginx = NginxRouter(root / "nginx")
    hosts: list[dict] = []
    env = {"DEPLOYCTL_KNOWN_HOSTS": str(known), "DEPLOYCTL_CACHE": str(work / "cache"),
           "DEPLOYCTL_SKIP_PREFLIGHT": "1", "DEPLOYCTL_RUNTIME_WHEEL": str(wheel),
           "DEPLOYCTL_STATE": str(root / "control-state")}
    try:
        for _ in range(1 if max_startups else n):
            fleet.add_host(None, False, True)
        hosts = fleet.host_yaml(python=python)
        if max_startups:
            fleet.restart(fleet.hosts[0].name, max_startups=max_startups)
            hosts = [dict(hosts[0], name=f"gpu-{i:02d}", deploy_root=str(root / f"entry-{i:02d}")) for i in range(n)]
            for h in hosts:
                Path(h["deploy_root"]).mkdir()
        for h in hosts:
            h["server_port"] = free_port()
        cfg = {"service": {"name": "bench-fleet"},
               "model": {"path": str(model), "served_name": "tiny-chat", "dtype": "float32"},
               "engine": {"device": "cpu", "max_model_len": 256, "max_num_seqs": 8, "max_num_batched_tokens": 256,
                          "kv_cache_memory": "8MiB"},
               "server": {"port": 18080, "drain_timeout_s": 2, "startup_timeout_s": 60},
               "hosts": hosts, "router": nginx.router_config(),
               "rollout": {"canary_hosts": 1, "steps": [100], "pause_s": 0, "standby_s": 0,
                           "parallel_hosts": parallel, "keep_releases": 3}}
        path = root / "deploy.yaml"
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        from deployctl.config import load_config

        nginx.start(load_config(path))
        pre_s, reached = _preflight(path, env)
        first, t1 = _cli(path, env, "deploy", "--yes")
        time.sleep(1.1)  # release ids carry the second
        cfg["engine"]["max_num_seqs"] = 4  # a new release
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        canary, t2 = _cli(path, env, "deploy", "--yes")
        rollback, t3 = _cli(path, env, "rollback")
        return {"hosts": n, "preflight_s": pre_s, "preflight_reached": reached, "first_deploy_s": first,
                "canary_deploy_s": canary, "rollback_s": rollback,
                "trace": {"first deploy": t1, "canary deploy": t2, "rollback": t3}}
    finally:
        for h in hosts:  # the stand-ins' supervisors, then sshd and nginx
            for pid_file in Path(h["deploy_root"], "shared", "run").glob("runtime*.pid"):
                try:
                    os.killpg(int(pid_file.read_text().split()[0]), 9)
                except (OSError, ValueError):
                    pass
        fleet.close()
        nginx.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", default="8,16,32")
    ap.add_argument("--parallel-hosts", type=int, default=8)
    ap.add_argument("--top", action="store_true", help="per step, the remote commands that took the most time")
    ap.add_argument("--one-sshd", metavar="MAXSTARTUPS", help="N host entries behind one sshd with this MaxStartups "
                    "(e.g. 10:30:60) instead of one sshd per host")
    args = ap.parse_args()
    sizes = sorted(int(x) for x in args.hosts.split(","))
    if os.geteuid() != 0 or not shutil.which("nginx") and not Path("/usr/sbin/nginx").exists():
        raise SystemExit("needs root (the sshd fleet) and nginx: run tests/setup.sh first")
    from deployctl.demo.localenv import overlay_venv
    from support.sshd import _keygen
    from support.standin_engine import standin_wheel

    work = Path(tempfile.mkdtemp(prefix="bench-fleet-", dir="/tmp"))
    os.chmod(work, 0o755)
    try:
        key = work / "id_ed25519"
        _keygen(key)
        python = str(overlay_venv(work / "hostenv"))
        model, wheel = _model(work / "model"), standin_wheel(work / "wheel")
        rows = []
        for n in sizes:
            rows.append(run_size(n, args.parallel_hosts, work, python, model, wheel, key, args.one_sshd))
            r = rows[-1]
            print(f"{n:3d} hosts: preflight {r['preflight_s']:5.1f} s ({r['preflight_reached']}/{n} reached), "
                  f"first deploy {r['first_deploy_s']:6.1f} s, canary deploy {r['canary_deploy_s']:6.1f} s,"
                  f" rollback {r['rollback_s']:6.1f} s; per host, remote commands (their seconds): " +
                  ", ".join(f"{k} {t['commands']:.0f} ({t['remote_s']:.1f} s)" for k, t in r["trace"].items()),
                  flush=True)
            if args.top:
                for k, t in r["trace"].items():
                    print(f"    {k}, per host: " + "; ".join(f"{c:.1f}x {t_:.2f} s `{cmd}`" for cmd, c, t_ in t["top"]))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    base = rows[0]
    where = f"one sshd, MaxStartups {args.one_sshd}" if args.one_sshd else "one sshd per host"
    big = rows[-1]
    print(f"\n{where}: {big['hosts']} hosts against {base['hosts']}: " + ", ".join(
        f"{name} {big[key] / base[key]:.1f}x" for name, key in (("preflight", "preflight_s"),
                                                               ("first deploy", "first_deploy_s"),
                                                               ("canary deploy", "canary_deploy_s"),
                                                               ("rollback", "rollback_s"))))
    print(f"growth against linear from {base['hosts']} hosts (time / (hosts/{base['hosts']} x its time); < 1.0: "
          f"less than linear), parallel_hosts {args.parallel_hosts}, max_unavailable unset (a quarter):")
    for r in rows[1:]:
        k = r["hosts"] / base["hosts"]
        print(f"{r['hosts']:3d} hosts: " + ", ".join(f"{name} {r[key] / (k * base[key]):.2f}x"
                                                   for name, key in (("preflight", "preflight_s"),
                                                                     ("first deploy", "first_deploy_s"),
                                                                     ("canary deploy", "canary_deploy_s"),
                                                                     ("rollback", "rollback_s"))))
    print(f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
