"""Helpers for the runbook tests: a deploy.yaml for fleet hosts, a release on a host, the CLI, the audit log.

A "stand-in" release serves /healthz and /readyz as static files with Python's http.server (a real process on a
real port, started through the runbook's own start action); the runtime-heavy tests use the real runtime.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from support.cli import deployctl
from support.paths import REPO as ROOT
from support.ports import free_port  # noqa: F401  (the runbook tests take it from here)


def write_deploy_yaml(path: Path, hosts: list[dict], *, port: int, model_path: str, engine: dict | None = None,
                      server: dict | None = None, slo: dict | None = None) -> Path:
    doc = {
        "service": {"name": "tiny"},
        "model": {"path": model_path, "served_name": "tiny"},
        "engine": {"device": "cpu", "max_model_len": 256, "max_num_seqs": 4, "max_num_batched_tokens": 256,
                   "kv_cache_memory": "4MiB",
                   **(engine or {})},
        "server": {"bind": "127.0.0.1", "port": port, **(server or {})},
        "hosts": hosts,
        # lenient objectives: a shared 2-core machine must not look like a fault (fault tests set strict ones)
        "slo": {"ttft_p99_s": 5.0, "tpot_p99_s": 0.5, **(slo or {})},
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def install_standin_release(deploy_root: str, port: int, release: str = "r1") -> Path:
    """A release whose launch.sh (start|stop, the rendered launcher's pidfile and log) serves static healthz and
    readyz files on ``port`` with http.server."""
    rel = Path(deploy_root) / "releases" / release
    rel.mkdir(parents=True, exist_ok=True)
    for name in ("healthz", "readyz"):
        (rel / name).write_text("ok\n")
    run = Path(deploy_root) / "shared" / "run"
    logs = Path(deploy_root) / "shared" / "logs"
    (rel / "launch.sh").write_text(f"""#!/usr/bin/env bash
mkdir -p {run} {logs}
case "$1" in
  start) cd {rel}
         setsid {sys.executable} -m http.server {port} --bind 127.0.0.1 </dev/null >>{logs}/runtime.log 2>&1 &
         echo $! > {run}/runtime.pid; echo $! ;;
  stop) pid=$(cat {run}/runtime.pid 2>/dev/null) && kill -TERM -- "-$pid" 2>/dev/null; rm -f {run}/runtime.pid ;;
esac
""")
    cur = Path(deploy_root) / "current"
    if cur.is_symlink():
        cur.unlink()
    cur.symlink_to(rel)
    return rel


def cli(*args: str, input: str | None = None, timeout: float = 240, env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m deployctl ARGS`` (support.cli.deployctl) with 200 columns, run from the repository."""
    return deployctl(*args, env={"COLUMNS": "200", **(env or {})}, input=input, cwd=ROOT, timeout=timeout)


def audit_records(deploy_root: str) -> list[dict]:
    path = Path(deploy_root) / "state" / "audit.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def pidfile_pid(deploy_root: str) -> int | None:
    p = Path(deploy_root) / "shared" / "run" / "runtime.pid"
    try:
        return int(p.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def kill_group(pid: int | None, sig: int = signal.SIGKILL) -> None:
    """Kill ``pid``'s process group (the runtime started with setsid) and wait until it is gone."""
    if not pid:
        return
    try:
        os.killpg(pid, sig)
    except OSError:
        try:
            os.kill(pid, sig)
        except OSError:
            return
    wait_until(lambda: not alive(pid), 10)


def wait_until(pred, timeout: float, interval: float = 0.1) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(interval)
    return pred()


def http_status(port: int, path: str, timeout: float = 5) -> int:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def make_tiny_model(path: Path) -> Path:
    """The runtime's tiny checkpoint (seeded random weights) at ``path``."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "runtime"), os.environ.get("PYTHONPATH", "")]))
    subprocess.run([sys.executable, "-m", "deployctl_runtime", "tiny-model", str(path)], check=True,
                   capture_output=True, env=env, timeout=120)
    return path


def install_release(cfg_path: Path, host_name: str, release: str = "r1", *, fault: str | None = None) -> Path:
    """Render the release for ``host_name`` from ``cfg_path`` (deployctl.render) and install it by hand under the
    host's deploy_root (what the rollout's install does): releases/<release>/ and the ``current`` link.
    ``fault``: DEPLOYCTL_RUNTIME_FAULT for the runtime (test-only fault injection), appended to runtime.env."""
    from deployctl.config import load_config
    from deployctl.render import render_release

    cfg = load_config(cfg_path)
    host = cfg.host(host_name)
    rel = Path(host.deploy_root) / "releases" / release
    rel.mkdir(parents=True, exist_ok=True)
    for f in render_release(cfg, host, release, api_key=None):
        p = rel / f.path
        text = f.content
        if f.path == "runtime.env":
            text += f"PYTHONPATH={ROOT / 'runtime'}\nDEPLOYCTL_LAUNCH_BACKOFF_S=0.5\n"
            if fault:
                text += f"DEPLOYCTL_RUNTIME_FAULT={fault}\n"
        p.write_text(text)
        p.chmod(f.mode)
    cur = Path(host.deploy_root) / "current"
    if cur.is_symlink():
        cur.unlink()
    cur.symlink_to(rel)
    return rel


def launch(deploy_root: str, command: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """``current/launch.sh start|stop|status`` on this machine (the rendered process launcher)."""
    return subprocess.run(["bash", f"{deploy_root}/current/launch.sh", command], capture_output=True, text=True,
                          timeout=timeout)


def start_runtime(deploy_root: str, port: int, timeout: float = 90) -> int:
    """Start the installed release with launch.sh and wait for /readyz 200; returns the supervisor pid."""
    r = launch(deploy_root, "start")
    assert r.returncode == 0, r.stderr
    assert wait_until(lambda: http_status(port, "/readyz") == 200, timeout, 0.2), log_tail(deploy_root)
    return pidfile_pid(deploy_root)


def stop_runtime(deploy_root: str) -> None:
    pid = pidfile_pid(deploy_root)
    if pid and alive(pid):
        launch(deploy_root, "stop")
    kill_group(pidfile_pid(deploy_root))


def log_tail(deploy_root: str, n: int = 30) -> str:
    p = Path(deploy_root) / "shared" / "logs" / "runtime.log"
    return "\n".join(p.read_text().splitlines()[-n:]) if p.exists() else "(no log)"


def hold_port(port: int) -> subprocess.Popen:
    """A foreign process listening on ``port`` (the fault "port held")."""
    code = f"""
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
for _ in range(100):  # a runtime killed a moment ago may still hold it
    try:
        s.bind(('127.0.0.1', {port})); break
    except OSError as e:
        err = e; time.sleep(0.1)
else:
    print(err, flush=True); sys.exit(1)
s.listen(); print('ok', flush=True); time.sleep(3600)
"""
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)
    line = p.stdout.readline().strip()
    assert line == "ok", f"cannot hold port {port}: {line}"
    return p


def complete(port: int, *, prompt: str = "Hello", max_tokens: int = 8, timeout: float = 120, **extra) -> int:
    """One /v1/completions request; returns the HTTP status (0: no answer)."""
    import httpx

    try:
        r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=timeout,
                       json={"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, **extra})
        return r.status_code
    except httpx.HTTPError:
        return 0


def histogram_count(port: int, name: str) -> int:
    """The runtime's observations of histogram ``name`` (e.g. "e2e_request_latency_seconds"); -1: no answer."""
    import httpx

    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    except httpx.HTTPError:
        return -1
    line = f"deployctl_runtime_{name}_count"
    return int(sum(float(l.split()[-1]) for l in text.splitlines() if l.startswith(line + " ") or l.startswith(line + "{")))


def judge_enough(port: int, n: int = 100) -> None:
    """Send short requests until the latency histograms hold ``n`` observations (100: what a P99 needs to be more
    than the slowest request, deployctl.promhist.min_samples_for_quantile). Eight tokens each (TPOT counts them): a
    request of a few ms sits low in the E2E histogram's lowest bucket, whose estimate is interpolated from 0 up to
    its 50 ms bound, so the P99/mean of very short requests reads as a tail."""
    while (have := min(histogram_count(port, h) for h in ("e2e_request_latency_seconds",
                                                           "time_per_output_token_seconds"))) < n:
        assert have >= 0, "the runtime's /metrics did not answer"
        for _ in range(n - have):
            assert complete(port, max_tokens=8, ignore_eos=True) == 200


def run_inproc(name: str, cfg_path: Path, **opts):
    """Run a shipped runbook in this process (the engine without the CLI): a RunReport."""
    from deployctl.config import load_config
    from deployctl.runbook.library import load_library
    from deployctl.runbook.runner import RunOptions, run_runbook

    cfg = load_config(cfg_path)
    return run_runbook(load_library().get(name), cfg, list(cfg.hosts), RunOptions(config_path=str(cfg_path), **opts))
