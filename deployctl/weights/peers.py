"""Peer copy (model.peer_copy, issue 43): the source sends about one copy, the hosts pass it on.

Waves: the first host fetches from the source; each host that has then published (verified) the version starts a
one-shot HTTP server on its own address (deployctl/hostscripts/peerserve.py: a random token in the URL path,
read-only, Range, ends after SERVE_TIMEOUT_S or when this fetch ends). Each next wave has as many hosts as there
are serving hosts (at most ``model.fetch_parallel_hosts``), each given one server's URLs and the source's URL as
``fallback``: the host script's same download path (.partial, Range resume, sha256, rename), and a failed or
mismatched peer file continues from the source. So 1, 1, 2, 4, ... hosts per wave: log2(N)+1 waves.

The hosts must reach each other at ``address`` (the deploy.yaml host address; ``local`` -> 127.0.0.1) on an
ephemeral TCP port. A host whose server cannot start just serves nobody (with no server at all, the next wave
fetches from the source). A wave that fails raises WeightsFetchFailed (from the wave's fetch) after every server stopped.
"""
from __future__ import annotations

import dataclasses
import json
import secrets
import urllib.parse
from typing import Callable

from deployctl.config.models import ModelConfig
from deployctl.hosts import Host
from deployctl.hostscripts import peerserve
from deployctl.hostscripts.snippets import module_argv
from deployctl.weights.sources import FetchPlan

SERVE_TIMEOUT_S = 6 * 3600 + 600  # a server outlives the slowest fetch even when this process dies
WaveFn = Callable[[list, dict], list]  # (hosts, {host name: FetchPlan}) -> [HostFetch]


@dataclasses.dataclass(frozen=True)
class PeerServer:
    """A running peerserve on ``host``: ``base`` URL (token included, ends with /) and its ``pid`` there."""

    host: Host
    base: str
    pid: int


def peer_address(host: Host) -> str:
    """The address the other hosts reach this one at: deploy.yaml's address (``local``: 127.0.0.1)."""
    return "127.0.0.1" if host.config.address == "local" else host.config.address


def start_server(host: Host, path: str) -> PeerServer:
    """Serve the published version directory ``path`` from ``host``. Raises RemoteError when it cannot start."""
    token = secrets.token_urlsafe(24)
    addr = peer_address(host)
    res = host.run(module_argv(host.config.python, peerserve, "start", path, addr, str(SERVE_TIMEOUT_S)),
                   timeout=60, env={"DEPLOYCTL_PEER_TOKEN": token})
    port = json.loads(res.stdout.strip().splitlines()[-1])["port"]
    pid = json.loads(res.stdout.strip().splitlines()[-1])["pid"]
    shown = f"[{addr}]" if ":" in addr else addr
    return PeerServer(host, f"http://{shown}:{port}/{token}/", pid)


def stop_server(server: PeerServer) -> None:
    """Stop it; errors are ignored (it ends by itself after SERVE_TIMEOUT_S)."""
    try:
        server.host.run(module_argv(server.host.config.python, peerserve, "stop", str(server.pid)), timeout=30,
                        check=False)
    except Exception:  # noqa: BLE001 - best effort: the server's own timer ends it
        pass


def peer_plan(plan: FetchPlan, server: PeerServer) -> FetchPlan:
    """``plan`` with each file's URL on ``server`` and the source's URL kept as ``fallback``."""
    files = [dict(f, url=server.base + urllib.parse.quote(f["path"]), fallback=f["url"]) for f in plan.files]
    return dataclasses.replace(plan, files=files)


def in_waves(hosts: list[Host], model: ModelConfig, plan: FetchPlan, fetch_wave: WaveFn) -> list:
    """Fetch ``plan`` onto ``hosts`` in waves (see the module docstring); returns one HostFetch per host, in order."""
    results: dict = {}
    servers: list[PeerServer] = []
    pending = list(hosts)
    try:
        while pending:
            n = max(1, min(len(servers), model.fetch_parallel_hosts))
            wave, pending = pending[:n], pending[n:]
            plans = {h.name: peer_plan(plan, servers[i % len(servers)]) for i, h in enumerate(wave)} if servers \
                else {}
            for h, done in zip(wave, fetch_wave(wave, plans)):
                results[h.name] = done
                if pending:
                    try:
                        servers.append(start_server(h, done.path))
                    except Exception:  # noqa: BLE001 - a host that cannot serve keeps its copy; others serve
                        pass
    finally:
        for s in servers:
            stop_server(s)
    return [results[h.name] for h in hosts]
