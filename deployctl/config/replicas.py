"""``hosts[].replicas``: several copies of the engine on one machine (e.g. 4 × TP 2 on an 8-GPU host).

deploy.yaml's entry is expanded before validation into one host entry per replica, so that every other part of
deployctl (render, deploy, canary, rollback, status, the router) sees ordinary hosts: replica ``i`` (from 0) is
named ``<name>-r<i>``, lives under ``<deploy_root>/r<i>`` (its own releases, ``current``, pidfiles, logs and state),
listens on ``server_port + i`` (and ``spare_port + i``; a multi-GPU engine rendezvouses on ``dist_port + i``,
engines.command.dist_port), is the systemd unit ``<service>-r<i>.service``
(``replica``), and gets GPU ids ``gpus[i × TP:(i + 1) × TP]`` (its CUDA_VISIBLE_DEVICES; on engine.device cpu
there is nothing to split); ids listed beyond replicas × TP go to no replica and are recorded on replica 0 as
``idle_gpus`` (preflight's gpus check warns). nginx lists each replica
as an upstream server. Refused (ValueError: the key and the fix): fewer GPU ids than replicas × TP, or ports
that overlap another replica's.
"""
from __future__ import annotations

from typing import Any


def expand_replicas(data: Any) -> Any:
    """``data`` (deploy.yaml as parsed) with every host entry of ``replicas`` > 1 replaced by its replicas."""
    if not isinstance(data, dict) or not isinstance(data.get("hosts"), list):
        return data
    hosts = data["hosts"]
    if not any(isinstance(h, dict) and h.get("replicas", 1) not in (1, None) for h in hosts):
        return data
    engine = data.get("engine") if isinstance(data.get("engine"), dict) else {}
    tp = engine.get("tensor_parallel_size", 1)
    server = data.get("server") if isinstance(data.get("server"), dict) else {}
    out = []
    for i, h in enumerate(hosts):
        n = h.get("replicas", 1) if isinstance(h, dict) else 1
        if n in (1, None) or not isinstance(n, int) or isinstance(n, bool) or not isinstance(tp, int):
            out.append(h)  # the models report a bad value with its line
            continue
        if n < 1:
            raise ValueError(f"hosts[{i}].replicas {n}: at least 1")
        gpus = h.get("gpus") or [h.get("gpu", 0)]
        cpu = engine.get("device", "cuda") == "cpu"  # no GPU to split (stand-ins, CPU engines)
        if not cpu and len(gpus) < n * tp:
            raise ValueError(f"hosts[{i}].replicas {n} × engine.tensor_parallel_size {tp} needs {n * tp} GPU ids in "
                             f"hosts[{i}].gpus (it lists {len(gpus)}: {gpus}); list them, or lower replicas")
        port = h.get("server_port") or server.get("port", 8080)
        spare = h.get("spare_port")
        if spare is not None and port <= spare < port + n or spare is not None and spare <= port < spare + n:
            raise ValueError(f"hosts[{i}]: replicas {n} take ports {port}-{port + n - 1} and spare ports "
                             f"{spare}-{spare + n - 1}, which overlap; move spare_port at least {n} away")
        root = str(h.get("deploy_root", "")).rstrip("/")
        for r in range(n):
            rep = {k: v for k, v in h.items() if k not in ("replicas", "gpu")}
            rep.update(name=f"{h.get('name')}-r{r}", deploy_root=f"{root}/r{r}", server_port=port + r,
                       gpus=list(gpus) if cpu else list(gpus[r * tp:(r + 1) * tp]), replica=r)
            if spare is not None:
                rep["spare_port"] = spare + r
            if h.get("dist_port") is not None and isinstance(h.get("dist_port"), int):
                rep["dist_port"] = h["dist_port"] + r
            if r == 0 and not cpu and len(gpus) > n * tp:
                rep["idle_gpus"] = list(gpus[n * tp:])
            out.append(rep)
    return {**data, "hosts": out}


def allocated_ports(cfg, h) -> dict[int, str]:
    """Every port deployctl allocates for host entry ``h`` on its machine: {port: what} (``server_port``,
    ``spare_port``, ``dist_port``: the engine's rendezvous port, engines.command.dist_port)."""
    from deployctl.engines.command import dist_port

    out = {h.server_port or cfg.server.port: "server_port"}  # config.layout.configured_port's rule
    if h.spare_port is not None:
        out.setdefault(h.spare_port, "spare_port")
    dist = dist_port(cfg, h)
    if dist is not None:
        out.setdefault(dist, "dist_port")
    return out


def check_shared_machines(cfg) -> None:
    """Host entries on one machine (the same ``address`` and SSH port) must not share a port deployctl allocates
    (allocated_ports: server_port, spare_port, dist_port), nor, when one of them is a replica (``replica`` set), a
    deploy_root or, on cuda, a GPU id; one entry's own ports must differ too. Raises ValueError naming both owners
    and the fix. (Entries written out by hand on one machine may share deploy_root, GPUs and the server_port itself,
    which render refuses for routed hosts: tests run several on loopback with the default gpu 0.)"""
    seen: dict = {}
    for h in cfg.hosts:
        mine = allocated_ports(cfg, h)
        dist = _dist(cfg, h)
        if dist is not None and mine[dist] != "dist_port":
            raise ValueError(f"host {h.name!r}: its dist_port {dist} is also its {mine[dist]}; give "
                             f"hosts[{h.name}].dist_port a port of its own")
        machine = (h.address, h.port)
        for other in seen.get(machine, []):
            theirs = allocated_ports(cfg, other)
            both = sorted(p for p in set(theirs) & set(mine)
                          # two entries written out by hand on one server_port: left to render's check (tests run
                          # several on loopback; the router refuses one address:port twice)
                          if h.replica is not None or other.replica is not None
                          or (theirs[p], mine[p]) != ("server_port", "server_port"))
            if both:
                p = both[0]
                raise ValueError(f"hosts {other.name!r} and {h.name!r} run on one machine ({h.address}) and both use "
                                 f"port {p} ({other.name}'s {theirs[p]}, {h.name}'s {mine[p]}); give each its own "
                                 f"{mine[p]} (hosts[].server_port / spare_port / dist_port)")
            if h.replica is None and other.replica is None:
                continue
            if other.deploy_root.rstrip("/") == h.deploy_root.rstrip("/"):
                raise ValueError(f"hosts {other.name!r} and {h.name!r} share deploy_root {h.deploy_root} on "
                                 f"{h.address}; give each its own (hosts[].replicas does: <deploy_root>/r<i>)")
            gpus = sorted(set(other.gpu_ids) & set(h.gpu_ids))
            if cfg.engine.device == "cuda" and gpus:
                raise ValueError(f"hosts {other.name!r} and {h.name!r} run on one machine ({h.address}) and both "
                                 f"list GPU {gpus[0]}; give each its own hosts[].gpus")
        seen.setdefault(machine, []).append(h)


def _dist(cfg, h):
    from deployctl.engines.command import dist_port

    return dist_port(cfg, h)
