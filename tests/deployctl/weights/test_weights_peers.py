"""Peer copy (model.peer_copy, issue 43) on real parts: moto's S3 server and its access log, the sshd fleet (a
separate model store per host), the peer servers the host script starts on 127.0.0.1."""
from __future__ import annotations

import hashlib
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from deployctl.config.models import ModelConfig
from deployctl.hosts import Host
from deployctl.hostscripts.weights import write_manifest
from deployctl.weights import fetch as wfetch
from deployctl.weights import peers
from deployctl.weights.sources import plan
from support.s3store import CREDS


def version_dir(d: Path, seed: int) -> Path:
    d.mkdir(parents=True)
    for i, n in enumerate((700_000, 300_000)):
        (d / f"shard-{i}.bin").write_bytes(hashlib.sha256(f"{seed}-{i}".encode()).digest() * (n // 32))
    write_manifest(d)
    return d


def source_bytes(log, prefix: str, sizes: dict, since: int) -> int:
    """Bytes the source sent for object GETs under ``prefix``: full 200s count the object; 206s its rest."""
    return sum(sizes[p.rsplit("/", 1)[-1]] for m, p, st in log.lines[since:]
               if m == "GET" and p.startswith(f"/models/{prefix}/") and st == 200)


def test_peer_copy_source_sends_one_copy_and_a_bad_or_gone_peer_falls_back(s3, ssh_fleet, tmp_path, monkeypatch):
    endpoint, client, log = s3
    fleet = ssh_fleet(4)
    hosts = [Host.from_config(c) for c in fleet.host_configs()]
    stores = [Path(c.deploy_root) / "models" / "peer" for c in fleet.host_configs()]
    started: list = []
    real_start = peers.start_server
    monkeypatch.setattr(peers, "start_server", lambda h, p: started.append(real_start(h, p)) or started[-1])

    def put(version: str, seed: int) -> dict:
        d = version_dir(tmp_path / version, seed)
        for f in sorted(d.iterdir()):
            client.put_object(Bucket="models", Key=f"peer/{f.name}", Body=f.read_bytes())
        return {f.name: f.stat().st_size for f in d.iterdir()}

    # 1. four hosts, peer copy on: the source's access log shows one copy; every host verified its own
    sizes = put("v1", 1)
    m = ModelConfig(source="s3://models/peer", version="v1", store="models", peer_copy=True,
                    s3={"endpoint": endpoint, "access_key_env": "WX_KEY", "secret_key_env": "WX_SECRET"})
    p = plan(m, CREDS)
    n0 = len(log.lines)
    done = wfetch.fetch_to_hosts(hosts, m, p)
    served = source_bytes(log, "peer", sizes, n0)
    assert served <= 1.1 * p.total_bytes, f"source served {served / p.total_bytes:.2f} copies for 4 hosts"
    assert [d.bytes_fetched for d in done] == [p.total_bytes] * 4 and all(not d.fallbacks for d in done)
    assert len(started) == 2  # waves of 1, 1, 2 hosts: hosts 0 and 1 served; the last wave serves nobody
    for store in stores:
        assert subprocess.run(["sha256sum", "-c", "--quiet", "manifest.sha256"], cwd=store / "v1").returncode == 0
        assert not list(store.glob(".*partial"))
    with pytest.raises(urllib.error.URLError):  # the servers stopped when the fetch ended
        urllib.request.urlopen(started[0].base + "shard-0.bin", timeout=5)

    # 2. a peer URL with a wrong token: 404 from the peer, so that host takes every file from the source; verified
    sizes = put("v2", 2)
    m2 = m.model_copy(update={"version": "v2"})
    p2 = plan(m2, CREDS)
    probes: dict = {}

    def wrong_token(h, path):
        s = real_start(h, path)
        started.append(s)
        req = urllib.request.Request(s.base + "shard-0.bin", headers={"Range": "bytes=10-"})
        with urllib.request.urlopen(req, timeout=5) as r:  # the right token: 206 with the rest of the file
            probes["range"] = (r.status, len(r.read()))
        token = s.base.rstrip("/").rsplit("/", 1)[1]
        for bad in (s.base.replace(token, "x" * 32) + "shard-0.bin", s.base + "../v1/manifest.sha256",
                    s.base + ".deployctl-model.json"):  # wrong token, outside the version, a dot-file
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(bad, timeout=5)
            assert err.value.code == 404
        return peers.PeerServer(s.host, s.base.replace(token, "wrong-token-" + "y" * 20), s.pid)

    monkeypatch.setattr(peers, "start_server", wrong_token)
    n0 = len(log.lines)
    done2 = wfetch.fetch_to_hosts(hosts[:2], m2, p2)
    assert probes["range"] == (206, sizes["shard-0.bin"] - 10)
    assert set(done2[1].fallbacks) == {f["path"] for f in p2.files} and not done2[0].fallbacks
    assert source_bytes(log, "peer", sizes, n0) == 2 * p2.total_bytes  # host 1 fell back: two copies
    for store in stores[:2]:
        assert subprocess.run(["sha256sum", "-c", "--quiet", "manifest.sha256"], cwd=store / "v2").returncode == 0

    # 3. a peer server that is gone (stopped before its peer connects: refused): that host falls back and verifies
    sizes = put("v3", 3)
    m3 = m.model_copy(update={"version": "v3"})
    p3 = plan(m3, CREDS)

    def gone(h, path):
        s = real_start(h, path)
        peers.stop_server(s)
        return s

    monkeypatch.setattr(peers, "start_server", gone)
    n0 = len(log.lines)
    done3 = wfetch.fetch_to_hosts(hosts[2:], m3, p3)
    assert set(done3[1].fallbacks) == {f["path"] for f in p3.files}
    assert source_bytes(log, "peer", sizes, n0) == 2 * p3.total_bytes
    for store in stores[2:]:
        assert subprocess.run(["sha256sum", "-c", "--quiet", "manifest.sha256"], cwd=store / "v3").returncode == 0
