"""A model version fetched onto the loopback fleet from an S3-compatible store (issue 43).

Each host is a real OpenSSH server on 127.0.0.1 (tests/support/sshd.py); the store is moto's S3 server on
127.0.0.1 (the S3 wire protocol; presigned GETs). The checkpoint is real safetensors of seeded float32 tensors
(``--mb`` MiB in 4 shards). The fetch is deployctl.weights.fetch.fetch_to_hosts, as `deployctl models fetch` runs
it: ``--parallel`` hosts at a time, each GETting every file itself, checking its sha256 and publishing with one
rename. Printed: bytes per host, seconds, per-host rate (bytes / that host's own seconds), aggregate rate, and the
bytes the source served (summed from its access log's object GETs x object sizes).

    python bench/bench_weights.py [--hosts 4] [--mb 64] [--parallel 4] [--peer-copy]

``--peer-copy`` fetches twice onto fresh stores (model.peer_copy off, then on: deployctl/weights/peers.py) and
prints both lines, so the source bytes with and without peer copy sit side by side.

Needs root (the sshd fleet); moto[server] and boto3 (tests/setup.sh installs them).
"""
from __future__ import annotations

import argparse
import logging
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.append(str(ROOT / "tests"))


def _checkpoint(d: Path, mb: int) -> Path:
    import torch
    from safetensors.torch import save_file

    from deployctl.hostscripts.weights import write_manifest

    d.mkdir(parents=True)
    g = torch.Generator().manual_seed(0)
    per = mb * 2**20 // 4 // 4  # float32 elements per shard
    for i in range(4):
        save_file({f"layers.{i}.weight": torch.randn(per // 1024, 1024, generator=g)},
                  str(d / f"model-0000{i + 1}-of-00004.safetensors"))
    (d / "config.json").write_text('{"model_type": "llama"}\n')
    write_manifest(d)
    return d


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--mb", type=int, default=64)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--peer-copy", action="store_true", help="also fetch with model.peer_copy on and compare")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root (the sshd fleet)")
    import boto3
    from moto.server import ThreadedMotoServer

    from deployctl.config.models import ModelConfig
    from deployctl.hosts import Host
    from deployctl.weights.fetch import fetch_to_hosts
    from deployctl.weights.sources import plan as make_plan
    from support.ports import free_port
    from support.sshd import Fleet, _keygen

    served: list[str] = []

    class Log(logging.Handler):
        def emit(self, record):
            m = re.search(r'"GET (/models/[^?\s]+)\S* HTTP', re.sub(r"\x1b\[[0-9;]*m", "", record.getMessage()))
            if m:
                served.append(m.group(1))

    logging.getLogger("werkzeug").addHandler(Log())
    logging.getLogger("werkzeug").setLevel(logging.INFO)
    logging.getLogger("werkzeug").propagate = False
    work = Path(tempfile.mkdtemp(prefix="bench-weights-", dir="/tmp"))
    os.chmod(work, 0o755)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=True)
    server.start()
    fleet = None
    try:
        creds = {"AWS_ACCESS_KEY_ID": "AKIABENCH", "AWS_SECRET_ACCESS_KEY": "bench-secret"}
        s3 = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", region_name="us-east-1",
                          aws_access_key_id=creds["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=creds["AWS_SECRET_ACCESS_KEY"])
        s3.create_bucket(Bucket="models")
        ckpt = _checkpoint(work / "ckpt", args.mb)
        sizes = {}
        for f in sorted(ckpt.iterdir()):
            s3.upload_file(str(f), "models", f"bench/{f.name}")
            sizes[f"/models/bench/{f.name}"] = f.stat().st_size
        key = work / "id_ed25519"
        _keygen(key)
        known = work / "known_hosts"
        known.touch()
        os.environ["DEPLOYCTL_KNOWN_HOSTS"] = str(known)
        (work / "fleet").mkdir()
        os.chmod(work / "fleet", 0o755)
        fleet = Fleet(work / "fleet", key, known)
        for _ in range(args.hosts):
            fleet.add_host(None, False, True)
        hosts = [Host.from_config(c) for c in fleet.host_configs()]
        for peer in ([False, True] if args.peer_copy else [False]):
            for c in fleet.host_configs():  # a fresh store on every host for each run
                shutil.rmtree(Path(c.deploy_root) / "models", ignore_errors=True)
            model = ModelConfig(source="s3://models/bench", version="v1", store="models", peer_copy=peer,
                                fetch_parallel_hosts=args.parallel, s3={"endpoint": f"http://127.0.0.1:{port}"})
            plan = make_plan(model, creds)
            served.clear()
            t0 = time.monotonic()
            done = fetch_to_hosts(hosts, model, plan)
            wall = time.monotonic() - t0
            source_bytes = sum(sizes.get(p, 0) for p in served)
            per_host = [d.bytes_fetched / d.seconds / 1e6 for d in done if d.seconds]
            print(f"peer_copy {'on ' if peer else 'off'}: {args.hosts} hosts x {plan.total_bytes} bytes "
                  f"({len(plan.files)} files), {args.parallel} at a time: {wall:.2f} s wall; per host "
                  f"{min(per_host):.0f}-{max(per_host):.0f} MB/s (own fetch, hashing included); aggregate "
                  f"{args.hosts * plan.total_bytes / wall / 1e6:.0f} MB/s; source served {source_bytes} bytes = "
                  f"{source_bytes / plan.total_bytes:.2f} copies", flush=True)
    finally:
        if fleet is not None:
            fleet.close()
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
