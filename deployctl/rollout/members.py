"""Which configured hosts take part in deploys (issue 42): the cordoned ones and the ones not serving are left out.

Two records under every host's ``state/`` (``state.read_doc`` / ``write_doc``: newest copy wins):
- ``cordon.json``: ``{"hosts": {NAME: {"by", "reason", "since", "stopped"}}}``, written by ``hosts cordon`` and
  cleared by ``hosts uncordon`` (deployctl.rollout.cordon).
- ``members.json``: ``{"joined": [NAME], "left": [NAME]}``: warm-pool hosts (``hosts[].pool: warm``) that
  ``scale out`` put into service, and hosts ``scale in`` took out (deployctl.rollout.scale).

A host serves when it is not in ``left`` and either has no ``pool`` or is in ``joined``. ``deploy`` and
``rollback`` work on the serving, uncordoned hosts only, and say which ones they leave out and why.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from deployctl.config import DeployConfig
from deployctl.errors import CheckFailed
from deployctl.rollout.state import StateStore, read_doc, write_doc

CORDON = "cordon.json"
MEMBERS = "members.json"


def serving_names(cfg: DeployConfig, members: dict[str, Any]) -> list[str]:
    """The hosts of deploy.yaml that serve, given the ``members.json`` document (module doc), in config order."""
    joined, left = set(members.get("joined", [])), set(members.get("left", []))
    return [h.name for h in cfg.hosts if h.name not in left and (h.pool != "warm" or h.name in joined)]


def read(store: StateStore) -> tuple[dict[str, dict], dict[str, Any]]:
    """(cordoned hosts {name: record}, members document) as the hosts of ``store`` hold them."""
    return read_doc(store, CORDON).get("hosts", {}), read_doc(store, MEMBERS)


def view(cfg: DeployConfig, store: StateStore) -> tuple[dict[str, dict], list[str], list[str]]:
    """One read of both records: (cordoned hosts {name: record}, serving host names, the serving ones not cordoned),
    names in deploy.yaml's order."""
    cordoned, mem = read(store)
    on = serving_names(cfg, mem)
    return cordoned, on, [n for n in on if n not in cordoned]


def set_cordon(store: StateStore, name: str, record: Optional[dict]) -> None:
    """Record ``name`` as cordoned (``record``: by, reason, since, stopped) or, with None, as not cordoned."""
    doc = read_doc(store, CORDON)
    hosts = dict(doc.get("hosts", {}))
    if record is None:
        hosts.pop(name, None)
    else:
        hosts[name] = record
    write_doc(store, CORDON, {"hosts": hosts})


def set_member(store: StateStore, name: str, serving: bool) -> None:
    """Record that ``name`` joined (``serving``) or left the serving fleet."""
    doc = read_doc(store, MEMBERS)
    joined = [n for n in doc.get("joined", []) if n != name]
    left = [n for n in doc.get("left", []) if n != name]
    (joined if serving else left).append(name)
    write_doc(store, MEMBERS, {"joined": joined, "left": left})


def leave_out(cfg: DeployConfig, say: Callable[..., None], *, store: Optional[StateStore] = None) -> DeployConfig:
    """``cfg`` with only the serving, uncordoned hosts (module doc); each host left out is said (``say("warn",
    ...)``) with who cordoned it, when and why, or that it does not serve. Reads the state of every configured host
    through ``store`` (a connected fleet's), else over connections of its own (one SSH round trip each, in
    parallel). Raises CheckFailed when no host is left."""
    if store is not None:
        cordoned, members = read(store)
    else:
        from deployctl.hosts import Host

        hosts = [Host.from_config(h) for h in cfg.hosts]
        try:
            cordoned, members = read(StateStore(hosts, workers=cfg.rollout.parallel_hosts))
        finally:
            for h in hosts:
                h.close()
    serving = set(serving_names(cfg, members))
    keep = []
    for h in cfg.hosts:
        if h.name in cordoned:
            c = cordoned[h.name]
            say("warn", f"leaving out {h.name}: cordoned by {c.get('by')} since {c.get('since')} "
                        f"({c.get('reason') or 'no reason given'}); `deployctl hosts uncordon {h.name}` puts it back",
                host=h.name)
        elif h.name not in serving:
            why = "in the warm pool" if h.pool == "warm" and h.name not in members.get("left", []) else "scaled in"
            say("info", f"leaving out {h.name}: not serving ({why}); `deployctl scale out {h.name}` adds it",
                host=h.name)
        else:
            keep.append(h)
    if not keep:
        raise CheckFailed("every host in deploy.yaml is cordoned or not serving: nothing to work on",
                          fix="`deployctl hosts uncordon NAME` or `deployctl scale out NAME` first")
    return cfg if len(keep) == len(cfg.hosts) else cfg.model_copy(update={"hosts": keep})
