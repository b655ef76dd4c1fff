"""``deployctl demo``: the main job end to end on this machine, no GPU.

Creates the tiny model and its manifest, an overlay venv standing in for the hosts' python env, a deploy.yaml for
two local hosts (``address: local``, ``launcher: process``, device cpu) behind a local nginx started under its own
prefix and port; deploys release 1; deploys release 2 with ``--canary 5`` and a short analysis pause while a
traffic thread sends requests through nginx (counting which release answered, by the X-Deployctl-Release
header); promotes; then rolls back; ends with deployctl validate's functional layer through nginx. Progress goes
to ``progress`` (the CLI prints it). Stops the runtimes and nginx at the end unless ``keep``.
"""
from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import yaml

from deployctl.errors import CheckFailed
from deployctl.rollout.events import Progress, emitter


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _nginx() -> str:
    path = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if path is None:
        raise CheckFailed("nginx is not installed", fix="apt-get install -y nginx (or run tests/setup.sh)")
    return path


class Traffic:
    """Background clients sending requests through nginx; counts answers per release and failures."""

    def __init__(self, url: str, model: str, *, workers: int = 3, completion_workers: int = 2, max_tokens: int = 4):
        self.url, self.model, self.max_tokens = url, model, max_tokens
        self.workers, self.completion_workers = workers, completion_workers
        self.by_release: Counter = Counter()
        self.failures: Counter = Counter()
        self.retried = 0  # requests re-sent once because nginx closed an idle keep-alive connection first
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def _run(self, completions: bool) -> None:
        import httpx

        with httpx.Client(base_url=self.url, timeout=30) as client:
            while not self._stop.is_set():
                try:
                    try:
                        r = self._one(client, completions)
                    except (httpx.RemoteProtocolError, httpx.ReadError):
                        # nginx closed an idle keep-alive connection (old workers exit after a reload) just as the
                        # request went out on it; clients such as openai's retry a dropped connection, and so do we,
                        # once (counted in ``retried``)
                        with self._lock:
                            self.retried += 1
                        r = self._one(client, completions)
                    key = r.headers.get("x-deployctl-release") or "?"
                    with self._lock:
                        if r.status_code == 200:
                            self.by_release[key] += 1
                        else:
                            self.failures[f"HTTP {r.status_code} from {key}"] += 1
                except httpx.HTTPError as e:
                    with self._lock:
                        self.failures[type(e).__name__] += 1
                time.sleep(0.002)

    key: "str | None" = None  # the client's API key, sent as a bearer token when set (a rotation changes it live)

    def _one(self, client, completions: bool):
        headers = {"Authorization": f"Bearer {self.key}"} if self.key else None
        if completions:
            return client.post("/v1/chat/completions", headers=headers, json={
                "model": self.model, "max_tokens": self.max_tokens, "messages": [{"role": "user", "content": "hello"}]})
        return client.get("/v1/models", headers=headers)

    def start(self) -> "Traffic":
        self._stop.clear()
        self._threads = [threading.Thread(target=self._run, args=(i < self.completion_workers,), daemon=True)
                         for i in range(self.workers + self.completion_workers)]
        for t in self._threads:
            t.start()
        return self

    def snapshot(self) -> tuple[Counter, Counter]:
        with self._lock:
            return Counter(self.by_release), Counter(self.failures)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=35)


@dataclass
class DemoResult:
    workdir: Path
    release_1: str = ""
    release_2: str = ""
    canary_split: dict = field(default_factory=dict)  # release -> requests answered while at the first step
    failures: dict = field(default_factory=dict)
    rollback_s: float = 0.0
    nginx_url: str = ""
    validate: str = ""  # the functional layer's summary at the end


def write_config(work: Path, *, python: str, model: Path, nginx_port: int, pause_s: float) -> Path:
    prefix = work / "nginx"
    hosts = [{"name": name, "address": "local", "deploy_root": str(work / "hosts" / name), "python": python,
              "launcher": "process", "server_port": _free_port(), "spare_port": _free_port()}
             for name in ("host-a", "host-b")]
    cfg = {
        "service": {"name": "demo-chat"},
        "model": {"path": str(model), "served_name": "tiny-chat", "dtype": "float32"},
        "engine": {"device": "cpu", "max_model_len": 256, "max_num_seqs": 8, "max_num_batched_tokens": 256,
                   "kv_cache_memory": "8MiB"},
        "server": {"port": hosts[0]["server_port"], "drain_timeout_s": 5, "startup_timeout_s": 120},
        "hosts": hosts,
        "router": {"kind": "nginx", "host": "local", "listen": nginx_port, "listen_address": "127.0.0.1",
                   "upstream_conf": str(prefix / "conf.d" / "demo-chat.conf"), "nginx_conf": str(prefix / "nginx.conf"),
                   "nginx_prefix": str(prefix), "access_log": str(prefix / "logs" / "access.json")},
        "rollout": {"canary_hosts": 1, "steps": [5, 100], "pause_s": pause_s,
                    "analysis": {"interval_s": max(1.0, pause_s / 2), "min_requests": 5, "max_error_rate": 0.01,
                                 # CPU latency on a shared machine jitters by tens of ms between identical releases
                                 "min_p99_delta_s": 0.1},
                    "keep_releases": 3},
        # objectives for the tiny model on CPU (the analysis aborts a canary whose own P99 passes them)
        "slo": {"ttft_p99_s": 5.0, "tpot_p99_s": 0.5},
    }
    path = work / "deploy.yaml"
    path.write_text("# written by `deployctl demo`\n" + yaml.safe_dump(cfg, sort_keys=False))
    return path


def start_nginx(cfg, say) -> None:
    """Start nginx under router.nginx_prefix with a main conf from render_nginx_main and an all-stable upstream."""
    import os

    from deployctl.render import render_nginx, render_nginx_main

    r = cfg.router
    prefix = Path(r.nginx_prefix)
    for d in ("conf.d", "logs", "temp"):
        (prefix / d).mkdir(parents=True, exist_ok=True)
    user = "root" if os.geteuid() == 0 else None
    Path(r.nginx_conf).write_text(render_nginx_main(cfg, prefix=str(prefix), include_path=r.upstream_conf, user=user))
    Path(r.upstream_conf).write_text(render_nginx(cfg, stable=list(cfg.hosts), canary=[], canary_weight=0))
    run = subprocess.run([_nginx(), "-p", str(prefix), "-c", r.nginx_conf], capture_output=True, text=True)
    if run.returncode != 0:
        raise CheckFailed(f"nginx did not start: {run.stderr.strip()[-300:]}")
    say("info", f"nginx listening on 127.0.0.1:{r.listen} (prefix {prefix})")


def stop_nginx(cfg) -> None:
    r = cfg.router
    subprocess.run([_nginx(), "-p", r.nginx_prefix, "-c", r.nginx_conf, "-s", "quit"], capture_output=True)


def keep_stop_hint(cfg) -> str:
    """The shell commands that stop what ``--keep`` left running (C33: it never said): each host's launch.sh
    stop (drain, then the process group), then nginx -s quit."""
    import shlex

    from deployctl.config.layout import current_link

    cmds = [f"bash {shlex.quote(current_link(hc))}/launch.sh stop" for hc in cfg.hosts]
    r = cfg.router
    cmds.append(f"{_nginx()} -p {shlex.quote(r.nginx_prefix)} -c {shlex.quote(r.nginx_conf)} -s quit")
    return "; ".join(cmds)


def stop_runtimes(cfg) -> None:
    from deployctl.hosts import Host
    from deployctl.service.engine import Engine

    for hc in cfg.hosts:
        with Host.from_config(hc) as h:
            Engine(h, cfg).stop(timeout=10)


def _validate(res, cfg, say) -> None:
    """The go-live check that ends the demo: `deployctl validate`'s functional layer through nginx (a few seconds)."""
    from deployctl.validate.client import Endpoint
    from deployctl.validate.functional import run_functional

    say("step", "validate: the functional layer through nginx (deployctl validate --layers functional)")
    v = run_functional(Endpoint(res.nginx_url, cfg.model.name, cfg.engine.max_model_len))
    res.validate = v.summary
    say("info", v.summary)
    if v.verdict == "fail":
        raise CheckFailed(v.summary, fix=f"deployctl validate -c {res.workdir}/deploy.yaml --layers functional")


def run_demo(work: Path, *, progress: Optional[Progress] = None, keep: bool = False, pause_s: float = 10) -> DemoResult:
    """The demo (module doc). Raises DeployctlError subclasses like deploy and rollback do."""
    from deployctl.config import load_config
    from deployctl.demo.localenv import overlay_venv, tiny_model
    from deployctl.rollout.deploy import Deployment
    from deployctl.rollout.rollback import rollback

    say = emitter(progress)
    work = Path(work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    say("step", f"demo in {work}")
    say("info", "creating the tiny model and its manifest")
    model = tiny_model(work / "model" / "tiny-chat")
    say("info", "creating the hosts' python env (a venv over this one; releases install the runtime wheel into it)")
    python = overlay_venv(work / "hostenv")
    nginx_port = _free_port()
    path = write_config(work, python=str(python), model=model, nginx_port=nginx_port, pause_s=pause_s)
    cfg = load_config(path)
    say("info", f"wrote {path}: hosts host-a, host-b (local, process launcher, cpu) behind nginx")
    res = DemoResult(work, nginx_url=f"http://127.0.0.1:{nginx_port}")
    start_nginx(cfg, say)
    traffic = Traffic(res.nginx_url, cfg.model.name)
    try:
        say("step", "release 1: first deploy (nothing serves yet: all hosts at once)")
        res.release_1 = Deployment(cfg, progress=progress, skip_preflight=False).run().release
        traffic.start()
        say("step", f"release 2: canary at 5% for {pause_s:g} s with traffic, analysis, promote to 100%")
        seen = {}

        def watch(ev) -> None:
            if ev.kind == "step" and ev.data.get("weight") == 5:
                seen["start"] = traffic.snapshot()[0]
            elif ev.kind == "step" and "start" in seen and "end" not in seen:
                seen["end"] = traffic.snapshot()[0]
                split = seen["end"] - seen["start"]
                total = sum(split.values()) or 1
                say("info", "traffic while at 5%: " + ", ".join(
                    f"{rel}: {n} ({n / total:.1%})" for rel, n in split.most_common()), split=dict(split))
            if progress:
                progress(ev)

        res.release_2 = Deployment(cfg, canary_pct=5, progress=watch, skip_preflight=False).run().release
        if "start" in seen and "end" in seen:
            res.canary_split = dict(seen["end"] - seen["start"])
        say("step", "rollback to release 1")
        rb = rollback(cfg, progress=progress)
        res.rollback_s = rb.duration_s
        time.sleep(1)
        _validate(res, cfg, say)
    finally:
        traffic.stop()
        ok, bad = traffic.snapshot()
        res.failures = dict(bad)
        say("info", f"traffic through nginx: {sum(ok.values())} answered "
                    f"({', '.join(f'{k}: {v}' for k, v in ok.most_common())}); failed: {sum(bad.values())}"
                    + (f" ({dict(bad)})" if bad else ""))
        if keep:
            say("info", f"--keep: runtimes and nginx left running; `deployctl status -c {path}`")
            say("info", "to stop them: " + keep_stop_hint(cfg))
        else:
            stop_runtimes(cfg)
            stop_nginx(cfg)
            say("info", "stopped the runtimes and nginx")
    return res
