"""`deployctl preflight` against the real sshd test fleet (plus a local host) with the runtime's tiny
model: all pass; a port taken by `python3 -m http.server` fails naming its pid; a flipped byte fails
naming the file and both hashes; C01 A exits 1 before anything is touched; an unreachable host is a
failed "reach" check."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from support.paths import REPO
from support.ports import free_port
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "runtime"), os.environ.get("PYTHONPATH", "")])}


def preflight(cfg_path: Path, *args: str) -> tuple[int, dict, float]:
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "deployctl", "preflight", "-c", str(cfg_path), "--json", *args],
                          capture_output=True, text=True, env={**ENV, "DEPLOYCTL_KNOWN_HOSTS": os.environ["DEPLOYCTL_KNOWN_HOSTS"]},
                          timeout=120)
    elapsed = time.monotonic() - start
    assert proc.stdout.strip(), proc.stderr
    return proc.returncode, json.loads(proc.stdout), elapsed


def checks_of(doc: dict, host: str) -> dict:
    [h] = [h for h in doc["hosts"] if h["host"] == host]
    return {c["name"]: c for c in h["checks"]}


@pytest.mark.slow
def test_preflight_fleet_end_to_end(ssh_fleet, tmp_path):
    fleet = ssh_fleet(2)
    model = tmp_path / "tiny"
    subprocess.run([sys.executable, "-m", "deployctl_runtime", "tiny-model", str(model)], check=True, env=ENV,
                   capture_output=True, timeout=120)
    port = free_port()
    doc = {
        "service": {"name": "tiny"},
        "model": {"path": str(model)},
        "engine": {"device": "cpu", "max_model_len": 1024, "max_num_seqs": 4},
        "server": {"bind": "127.0.0.1", "port": port},
        "hosts": fleet.host_yaml(python=sys.executable)
        + [{"name": "here", "address": "local", "deploy_root": str(tmp_path / "local-root"), "python": sys.executable}],
    }
    cfg = tmp_path / "deploy.yaml"
    cfg.write_text(yaml.safe_dump(doc))

    # 1. everything passes on all three hosts
    code, out, _ = preflight(cfg)
    bad = [(h["host"], c) for h in out["hosts"] for c in h["checks"] if c["status"] != "pass"]
    assert code == 0 and out["ok"] is True and bad == []
    assert [h["host"] for h in out["hosts"]] == ["gpu-a", "gpu-b", "here"]
    facts = out["hosts"][0]["facts"]
    assert facts["torch"]["python"] == sys.executable and facts["weights"]["files_hashed"] == 5
    assert 0 < facts["login_shell"]["round_trip_s"] < facts["login_shell"]["command_s"]  # measured over SSH only
    assert checks_of(out, "gpu-a")["login_shell"]["status"] == "pass"
    assert "login_shell" not in out["hosts"][2]["facts"] and "login_shell" not in checks_of(out, "here")
    # the hash cache lives on each host under deploy_root/shared; a second run re-uses it
    assert (Path(fleet.hosts[0].deploy_root) / "shared" / "hash-cache.json").is_file()

    # 2. the port taken by a leftover process: fails in seconds naming its pid and process
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                              cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.05)
        code, out, elapsed = preflight(cfg, "--host", "gpu-a")
    finally:
        server.terminate()
        server.wait(10)
    c = checks_of(out, "gpu-a")["port"]
    assert code == 1 and c["status"] == "fail"
    assert f"pid {server.pid} (python" in c["message"] and "http.server" in c["message"] and str(port) in c["message"]
    assert f"kill {server.pid}" in c["fix"]
    # the second run on gpu-a re-used its hash cache: nothing hashed again
    w = out["hosts"][0]["facts"]["weights"]
    assert (w["files_hashed"], w["files_cached"]) == (0, 5) and checks_of(out, "gpu-a")["weights"]["status"] == "pass"
    print(f"port-taken preflight took {elapsed:.1f} s")

    # 3. one byte flipped inside model.safetensors: fails naming the file with both hashes
    shard = model / "model.safetensors"
    expected = next(line.split()[0] for line in (model / "manifest.sha256").read_text().splitlines() if line.endswith("model.safetensors"))
    with open(shard, "r+b") as f:
        f.seek(shard.stat().st_size // 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x01]))
    code, out, _ = preflight(cfg, "--host", "gpu-b")
    c = checks_of(out, "gpu-b")["weights"]
    assert code == 1 and c["status"] == "fail"
    assert "model.safetensors: sha256 mismatch" in c["message"] and f"expected {expected}" in c["message"]
    [issue] = out["hosts"][0]["facts"]["weights"]["issues"]
    assert issue["actual"] != expected and issue["actual"] in c["message"]

    # 4. C01 A: a KV pool smaller than one max_model_len request exits 1 naming the numbers, before
    #    anything is written on the host; 5. an unreachable host is one failed "reach" check
    doc["engine"] = {"device": "cpu", "max_model_len": 4096, "block_size": 16, "num_gpu_blocks_override": 229, "max_num_seqs": 8}
    cfg.write_text(yaml.safe_dump(doc))
    fleet.stop("gpu-b")
    code, out, _ = preflight(cfg, "--host", "gpu-a", "--host", "gpu-b", "--skip-weights")
    assert code == 4  # a host could not be reached: the remote/SSH exit code wins over a failed check
    c = checks_of(out, "gpu-a")["capacity"]
    assert c["status"] == "fail"
    for needle in ("max_model_len 4096", "3664 tokens", "229 blocks × 16", "512 bytes/token", "largest feasible max_model_len is 3664"):
        assert needle in c["message"], needle
    assert sorted(os.listdir(fleet.hosts[0].deploy_root)) == ["shared"]  # only the hash cache from step 1
    reach = checks_of(out, "gpu-b")
    assert list(reach) == ["reach"] and reach["reach"]["status"] == "fail" and "gpu-b" in reach["reach"]["message"]


def test_login_shell_start_up_is_measured_and_a_slow_rc_file_warned(ssh_fleet):
    """A host whose ~/.bashrc takes 0.4 s before every command (as an unguarded pyenv or conda init does) is
    warned with the measured time and the fix; a host with a bare shell passes. Real sshd: bash sources ~/.bashrc
    for commands that arrive over SSH."""
    from deployctl.hosts import Host
    from deployctl.preflight import shell

    fleet = ssh_fleet(2)
    slow = fleet.hosts[0]
    (slow.dir / "home" / ".bashrc").write_text("sleep 0.4\n")
    verdicts = {}
    for hc in fleet.host_configs():
        with Host.from_config(hc) as host:
            measured = shell.measure(host)
        verdicts[hc.name] = (shell.shell_seconds(measured), shell.check_login_shell(hc, {"login_shell": measured}))
    slow_s, slow_check = verdicts[slow.name]
    fast_s, fast_check = verdicts[fleet.hosts[1].name]
    assert 0.35 < slow_s < 2.0 and fast_s < shell.WARN_S, verdicts
    assert slow_check.status == "warn" and slow.name in slow_check.message and "~/.bashrc" in slow_check.fix
    assert f"~{slow_s * 1e3:.0f} ms" in slow_check.message and "case $- in *i*)" in slow_check.fix
    assert fast_check.status == "pass", fast_check
