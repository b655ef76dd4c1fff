"""The rollout test environment: the sshd fleet (fleet_sshd) + a real nginx (nginx_fixture) + the runtime on CPU
with the tiny model, and a deploy.yaml tying them together (tests/conftest.py imports this).

``rollout_env(n, **rollout) -> RolloutEnv``: n sshd hosts, each with its own runtime port and deploy_root, the
host python an overlay venv (deployctl.demo.localenv) shared by the session into which releases install the runtime
wheel, one nginx router. ``env.cli("deploy", "--yes")`` runs ``python -m deployctl ... -c deploy.yaml``.
Everything is stopped after the test (runtimes killed by process group from their pidfiles).
"""
from __future__ import annotations

import json
import re
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from support.nginx import NginxRouter, free_port

__all__ = ["rollout_python", "rollout_model", "rollout_cache", "rollout_env", "RolloutEnv", "local_tiny_config",
           "standin_python", "standin_model", "standin_wheel"]


def local_tiny_config(root: Path, name: str, model: Path, python: str, hosts: list[str], *, api_key_env: str,
                      max_num_seqs: int = 4) -> dict:
    """A deploy.yaml (as a dict) for the tiny model on CPU on ``address: local`` hosts ``hosts`` (process launcher,
    deploy_root ``root/<host>``, a free server port each), the key in ``api_key_env``; add router/rollout to it."""
    return {
        "service": {"name": name},
        "model": {"path": str(model), "served_name": "tiny-chat", "dtype": "float32"},
        "engine": {"device": "cpu", "max_model_len": 256, "max_num_seqs": max_num_seqs, "max_num_batched_tokens": 256,
                   "kv_cache_memory": "8MiB"},
        "server": {"startup_timeout_s": 90, "drain_timeout_s": 2, "api_key_env": api_key_env},
        "hosts": [{"name": h, "address": "local", "deploy_root": str(root / h), "launcher": "process",
                   "python": python, "server_port": free_port()} for h in hosts],
    }


@pytest.fixture(scope="session")
def rollout_python(tmp_path_factory) -> str:
    from deployctl.demo.localenv import overlay_venv

    return str(overlay_venv(tmp_path_factory.mktemp("hostenv") / "venv"))


@pytest.fixture(scope="session")
def rollout_model(tmp_path_factory) -> Path:
    from deployctl.demo.localenv import tiny_model

    return tiny_model(tmp_path_factory.mktemp("model") / "tiny-chat")


@pytest.fixture(scope="session")
def rollout_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("deployctl-cache")


@pytest.fixture(scope="session")
def standin_python(tmp_path_factory) -> str:
    """A host python env of its own for stand-in releases (installing the stand-in wheel there never replaces the
    real runtime in rollout_python's env)."""
    from deployctl.demo.localenv import overlay_venv

    return str(overlay_venv(tmp_path_factory.mktemp("standin-hostenv") / "venv"))


@pytest.fixture(scope="session")
def standin_model(tmp_path_factory) -> Path:
    """A model directory the stand-in engine serves: the files deployctl hashes and reads (config.json,
    tokenizer_config.json with a chat template, manifest.sha256); no weights."""
    import hashlib

    d = tmp_path_factory.mktemp("model") / "standin-chat"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "standin", "max_position_embeddings": 256}) + "\n")
    (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{% for m in messages %}{{ m.content }}"
                                                                          "{% endfor %}"}) + "\n")
    lines = [f"{hashlib.sha256((d / n).read_bytes()).hexdigest()}  {n}\n" for n in ("config.json",
                                                                                     "tokenizer_config.json")]
    (d / "manifest.sha256").write_text("".join(lines))
    return d


@pytest.fixture(scope="session")
def standin_wheel(tmp_path_factory) -> Path:
    from support.standin_engine import standin_wheel as build

    return build(tmp_path_factory.mktemp("standin-wheel"))


class RolloutEnv:
    def __init__(self, root: Path, fleet, nginx: NginxRouter, cfg: dict):
        self.root, self.fleet, self.nginx, self.cfg = root, fleet, nginx, cfg
        self.path = root / "deploy.yaml"
        self.write()

    def write(self) -> None:
        self.path.write_text(yaml.safe_dump(self.cfg, sort_keys=False))

    @property
    def url(self) -> str:
        return self.nginx.url

    @property
    def names(self) -> list[str]:
        return [h["name"] for h in self.cfg["hosts"]]

    def host(self, name: str) -> dict:
        return next(h for h in self.cfg["hosts"] if h["name"] == name)

    def load(self):
        from deployctl.config import load_config

        return load_config(self.path)

    def cli(self, *args: str, env: dict | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
        argv = [sys.executable, "-m", "deployctl", *args, "-c", str(self.path)]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})

    def popen(self, *args: str, env: dict | None = None) -> subprocess.Popen:
        argv = [sys.executable, "-m", "deployctl", *args, "-c", str(self.path)]
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, **(env or {})})

    def current(self, name: str) -> str | None:
        link = Path(self.host(name)["deploy_root"]) / "current"
        return os.path.basename(os.readlink(link)) if link.is_symlink() else None

    def runtime_url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.host(name)['server_port']}"

    def release_served(self, name: str) -> str | None:
        r = httpx.get(self.runtime_url(name) + "/v1/models", timeout=10)
        return r.headers.get("x-deployctl-release")

    def upstream_conf(self) -> str:
        return self.nginx.upstream_conf.read_text()

    def status(self) -> dict:
        r = self.cli("status", "--json")
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    def history(self) -> list[dict]:
        r = self.cli("history", "--json")
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)["history"]

    def make_local(self) -> None:
        """Turn the fleet's hosts into ``address: local`` ones (the same deploy_roots, pythons and ports; commands
        run as subprocesses instead of over SSH): for tests of the step machine where the transport is not the
        point and the round trips of ~30 SSH commands a deploy are most of its time."""
        for h in self.cfg["hosts"]:
            for key in ("port", "user", "ssh_key", "connect_timeout_s"):
                h.pop(key, None)
            h["address"] = "local"
        self.write()

    def stop_runtimes(self) -> None:
        """SIGKILL every engine the fleet started: each pidfile's process group under any deploy_root (runtime.pid,
        the second port's runtime.<port>.pid, standbys', replicas' r<i>/), then any process left whose command line
        names a deploy_root (a supervisor whose pidfile was already replaced)."""
        roots = [str(Path(h["deploy_root"])) for h in self.cfg["hosts"]]
        for root in roots:
            for pidf in Path(root).glob("**/shared/run/*.pid"):
                try:
                    os.killpg(int(pidf.read_text().strip()), signal.SIGKILL)
                except (OSError, ValueError):
                    pass
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit() or int(proc.name) == os.getpid():
                continue
            try:
                argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue
            if any(root + "/" in arg for arg in argv for root in roots):
                try:
                    os.kill(int(proc.name), signal.SIGKILL)
                except OSError:
                    pass


@pytest.fixture
def rollout_env(ssh_fleet, tmp_path, rollout_cache, monkeypatch, request):
    """Factory ``rollout_env(n=2, engine="runtime", service="chat-tiny", **rollout_overrides) -> RolloutEnv`` (see module doc;
    ``service``: service.name, so that two fleets of one test keep apart journals under DEPLOYCTL_STATE).
    ``engine="standin"``: the hosts run the light stand-in engine (tests/support/standin_engine, deployed through
    DEPLOYCTL_RUNTIME_WHEEL) instead of the runtime with the tiny model: for tests of the fleet, the router and the
    state machine, where the engine is not the point; it starts in well under a second."""
    monkeypatch.setenv("DEPLOYCTL_CACHE", str(rollout_cache))
    monkeypatch.setenv("DEPLOYCTL_VERIFY_TIMEOUT_S", "90")
    monkeypatch.setenv("DEPLOYCTL_SKIP_PREFLIGHT", "1")
    monkeypatch.setenv("DEPLOYCTL_STATE", str(tmp_path / "control-state"))  # journals, detached runners' logs
    # detached runners as daemonized processes on any CI machine (a systemd-booted one would otherwise get units);
    # tests/deployctl/rollout/test_detach_systemd.py takes the systemd path
    monkeypatch.setenv("DEPLOYCTL_DETACH", "process")
    monkeypatch.delenv("DEPLOYCTL_TEST_KILL_AT", raising=False)
    monkeypatch.delenv("DEPLOYCTL_RUNTIME_FAULT", raising=False)
    envs: list[RolloutEnv] = []

    def factory(n: int = 2, engine: str = "runtime", service: str = "chat-tiny", **rollout) -> RolloutEnv:
        if engine == "standin":
            python, model = request.getfixturevalue("standin_python"), request.getfixturevalue("standin_model")
            monkeypatch.setenv("DEPLOYCTL_RUNTIME_WHEEL", str(request.getfixturevalue("standin_wheel")))
        else:
            assert engine == "runtime", engine
            python, model = request.getfixturevalue("rollout_python"), request.getfixturevalue("rollout_model")
        fleet = ssh_fleet(n)
        root = tmp_path / f"env{len(envs)}"
        root.mkdir()
        nginx = NginxRouter(root / "nginx")
        hosts = fleet.host_yaml(python=python)
        for h in hosts:
            h["server_port"] = free_port()
        cfg = {
            "service": {"name": service},
            "model": {"path": str(model), "served_name": "tiny-chat", "dtype": "float32"},
            "engine": {"device": "cpu", "max_model_len": 256, "max_num_seqs": 8, "max_num_batched_tokens": 256,
                       "kv_cache_memory": "8MiB", "enable_prefix_caching": True},
            "server": {"port": 18080, "drain_timeout_s": 5, "startup_timeout_s": 90, "request_timeout_s": 60},
            "hosts": hosts,
            "router": nginx.router_config(),
            "rollout": {"canary_hosts": 1, "steps": [5, 100], "pause_s": 0,
                        "analysis": {"interval_s": 2, "min_requests": 20}, "keep_releases": 3, **rollout},
        }
        # CPU runtimes on a shared 2-core machine: identical releases differ by 10+ ms of P99 TPOT under load
        # (a C20 run aborted on 14.2 vs 3.6 ms); latency faults the tests inject are hundreds of ms.
        # Windows are re-judged every 2 s here (30 s by default): the default inconclusive_limit of 5 would pause a
        # canary that is still collecting its first latency samples; tests that pause set it themselves.
        cfg["rollout"]["analysis"] = {"min_p99_delta_s": 0.1, "inconclusive_limit": 0, **cfg["rollout"]["analysis"]}
        # The SLO rule (the canary's own P99 over slo × max_slo_factor) with objectives a CPU runtime on a loaded
        # 2-core machine always meets: tests of the SLO rule set their own slo.
        cfg.setdefault("slo", {"ttft_p99_s": 30.0, "tpot_p99_s": 2.0})
        env = RolloutEnv(root, fleet, nginx, cfg)
        envs.append(env)
        nginx.start(env.load())
        return env

    try:
        yield factory
    finally:
        for env in envs:
            env.stop_runtimes()
            env.nginx.stop()


def rollout_state(env: RolloutEnv, host: int = 0) -> dict:
    """state/rollout.json on a host ({} when absent or being written)."""
    p = Path(env.cfg["hosts"][host]["deploy_root"]) / "state" / "rollout.json"
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return {}


def served(port: int) -> str | None:
    """The release the runtime on 127.0.0.1:``port`` answers with (its X-Deployctl-Release), None when nothing
    listens there."""
    try:
        return httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).headers.get("x-deployctl-release")
    except httpx.TransportError:
        return None


def pid_link(env: RolloutEnv, name: str) -> str | None:
    """Where ``runtime.pid`` on host ``name`` links to (``runtime.<port>.pid`` after a start on a second port), None
    when it is a plain file."""
    p = Path(env.host(name)["deploy_root"]) / "shared" / "run" / "runtime.pid"
    return os.readlink(p) if p.is_symlink() else None


def even_split(conf: str) -> bool:
    """Whether the rendered upstream ``conf`` sends traffic evenly to every server: no server line marked ``down``
    or weighted (the control-route refusal further down the file names routes such as /slow_down)."""
    servers = [ln.split("#")[0] for ln in conf.splitlines() if ln.strip().startswith("server ")]
    return bool(servers) and not any(" down" in ln or "weight=" in ln for ln in servers)


def runtime_facts(env: RolloutEnv, name: str) -> str:
    """What a failed check of host ``name``'s runtime needs: its pidfiles (and whether each process lives) and the
    tail of its runtime log."""
    root = Path(env.host(name)["deploy_root"])
    facts = []
    for pidf in sorted(root.glob("**/shared/run/*.pid")):
        try:
            pid = int(pidf.read_text().strip())
            os.kill(pid, 0)
            alive = "alive"
        except (OSError, ValueError) as e:
            pid, alive = pidf.read_text().strip()[:20], f"not alive ({type(e).__name__})"
        facts.append(f"{pidf.relative_to(root)} -> {pid} {alive}")
    log = root / "shared" / "logs" / "runtime.log"
    tail = log.read_text(errors="replace")[-2500:] if log.exists() else "(no runtime.log)"
    return f"pidfiles: {facts or 'none'}; runtime.log ends:\n{tail}"


def assert_consistent_on(env: RolloutEnv, release: str) -> None:
    """Every host's ``current`` is ``release``, every runtime answers as ``release``, and nginx splits evenly."""
    assert [env.current(n) for n in env.names] == [release] * len(env.names)
    served = {}
    for n in env.names:
        try:
            served[n] = env.release_served(n)
        except httpx.TransportError as e:
            raise AssertionError(f"{n}: nothing serves on {env.runtime_url(n)} ({e}); {runtime_facts(env, n)}")
    assert set(served.values()) == {release}, served
    assert even_split(env.upstream_conf()), env.upstream_conf()


def wait_for(pred, timeout: float, what: str, proc: subprocess.Popen | None = None):
    """Poll ``pred()`` until truthy; fail naming ``what`` (and the deploy's output when ``proc`` died)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        if proc is not None and proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"process exited {proc.returncode} before {what}:\n{err[-3000:]}")
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


__all__ += ["assert_consistent_on", "even_split", "pid_link", "rollout_state", "served", "wait_for"]


def upstream_weights(conf: str) -> dict[str, int]:
    """{port: nginx weight} of the upstream servers in ``conf`` (1 when not written, 0 when marked down)."""
    out = {}
    for m in re.finditer(r"server\s+[\d.]+:(\d+)([^;]*);", conf):
        w = re.search(r"weight=(\d+)", m.group(2))
        out[m.group(1)] = 0 if " down" in m.group(2) else int(w.group(1)) if w else 1
    return out
