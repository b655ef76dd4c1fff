"""The router's API keys on the router host (the file: deployctl.render.keys; its path: config.layout.router_keys_path).

- ``sync_for_deploy``: every router apply (each deploy step, ``router reload``) accepts the keys in deployctl's
  environment (server.api_key_env's, the engine key, and next_api_key_env's) and drops deploy keys that left it.
- ``add`` / ``retire``: accept a key beside the others, or stop accepting some; each writes the file and reloads
  nginx (``Router.reload``: nginx -t, a reload; open streams finish on the old workers; no engine restarts).
- ``usage``: each key's last use and request count from the router's JSON access log (``key_id``), the current
  file and the one logrotate moved aside (``.1``).
"""
from __future__ import annotations

import shlex
import time
from dataclasses import dataclass
from typing import Mapping, Optional

from deployctl.config import DeployConfig, layout
from deployctl.errors import CheckFailed, ConfigError, UsageError
from deployctl.render import keys as keyfile
from deployctl.render.release import access_log_path


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _require_keys(cfg: DeployConfig) -> None:
    if cfg.router is None:
        raise ConfigError("deploy.yaml has no router: section: no router holds keys",
                          fix="add router: (kind nginx, host, listen, upstream_conf)")
    if not cfg.server.api_key_env:
        raise ConfigError("server.api_key_env is not set: the router checks no key",
                          fix="set server.api_key_env to the variable holding the engine's key and deploy")


def read(host, cfg: DeployConfig) -> Optional[keyfile.KeysFile]:
    """The keys file on the router host, parsed, or None when there is none yet."""
    path = layout.router_keys_path(cfg)
    r = host.run(f"cat {shlex.quote(path)} 2>/dev/null || true", timeout=15)
    return keyfile.parse(r.stdout) if r.stdout.strip() else None


def write(host, cfg: DeployConfig, keys: keyfile.KeysFile) -> None:
    """Write the keys file (0600 from creation, atomically)."""
    base = cfg.service.name.replace("-", "_")
    host.put_text(keyfile.render(base, keys), layout.router_keys_path(cfg), mode=0o600)


def sync_for_deploy(host, cfg: DeployConfig, environ: Mapping[str, str]) -> None:
    """Before a router apply: the keys file accepts the environment's keys (deployctl.render.keys.synced). Without
    server.api_key_env nothing is done; without its variable set the file is left as it is, and a missing one is
    CheckFailed naming the variable (nginx could not load the conf that includes it)."""
    if cfg.router is None or not cfg.server.api_key_env:
        return
    var = cfg.server.api_key_env
    current = read(host, cfg)
    if not environ.get(var):
        if current is None or not current.keys:
            raise CheckFailed(f"the router on {host.name} has no API keys file yet and ${var} is not set",
                              fix=f"export {var}=<key> (server.api_key_env) and run the command again")
        return
    names = [(n, w) for n, w in ((var, "server.api_key_env"), (cfg.server.next_api_key_env, "server.next_api_key_env"))
             if n and environ.get(n)]
    values = [keyfile.check_key(environ[n], f"${n} ({w})") for n, w in names]
    new = keyfile.synced(current, values, _now())
    if new != current:
        write(host, cfg, new)


def _reload(router, before: keyfile.KeysFile, after: keyfile.KeysFile) -> None:
    write(router.host, router.cfg, after)
    try:
        router.reload(sync_keys=False)
    except CheckFailed:
        write(router.host, router.cfg, before)  # nginx kept the old conf: keep the file that matches it
        raise


def add(router, key: str, what: str) -> keyfile.Key:
    """Accept ``key`` (from ``what``: the variable or option named in errors) beside the keys accepted now, then
    reload nginx (``router``: a deployctl.rollout.router.Router). Raises UsageError when it is accepted already,
    ConfigError for a malformed key, CheckFailed when nginx -t fails (the old file is put back)."""
    host, cfg = router.host, router.cfg
    _require_keys(cfg)
    keyfile.check_key(key, what)
    current = read(host, cfg)
    if current is None:
        raise CheckFailed(f"the router on {host.name} has no API keys file yet",
                          fix="deploy first (it writes the keys of server.api_key_env), or run deployctl router reload")
    entry = keyfile.Key(key, "keys", _now())
    if entry.id in current.ids():
        raise UsageError(f"key {entry.id} is accepted already", fix="deployctl keys list")
    _reload(router, current, current.with_key(entry))
    return entry


def retire(router, ids: list[str]) -> list[str]:
    """Stop accepting the keys whose id starts with each of ``ids``, then reload nginx (``router``: a Router).
    Returns the full ids. Raises UsageError for an id matching no key or several, or when no key would be left."""
    host, cfg = router.host, router.cfg
    _require_keys(cfg)
    current = read(host, cfg)
    have = current.ids() if current else []
    full = []
    for prefix in ids:
        match = [i for i in have if i.startswith(prefix.lower())]
        if len(match) != 1:
            raise UsageError(f"key id {prefix!r} matches {len(match)} accepted key(s)",
                             fix=f"use one of: {', '.join(have) or '(none)'} (deployctl keys list)")
        full.append(match[0])
    if set(have) <= set(full):
        raise UsageError("retiring every key would leave the router answering every client 401",
                         fix="add the new key first (deployctl keys add), then retire the old one")
    _reload(router, current, current.without(set(full), _now()))
    return full


@dataclass(frozen=True)
class KeyUse:
    """One key as ``deployctl keys list`` shows it: id, ``state`` (accepted | retired), ``source`` (deploy | keys;
    None once retired), ``added`` / ``retired_at`` (UTC ISO times), its last request in the router's access log
    (``last_used``: the log's ISO time, None when none is logged), how many requests it made there, and whether it
    is the engine key the router sends upstream."""

    id: str
    state: str
    source: Optional[str]
    added: Optional[str]
    retired_at: Optional[str]
    last_used: Optional[str]
    requests: int
    engine_key: bool

    def to_json(self) -> dict:
        return {"id": self.id, "state": self.state, "source": self.source, "added": self.added,
                "retired_at": self.retired_at, "last_used": self.last_used, "requests": self.requests,
                "engine_key": self.engine_key}


def usage(host, cfg: DeployConfig) -> list[KeyUse]:
    """Every accepted key, then every retired one, with its use from the router's access log(s)."""
    _require_keys(cfg)
    current = read(host, cfg) or keyfile.KeysFile((), None)
    log = shlex.quote(access_log_path(cfg))
    # "time" comes first and "key_id" last on every line of the rendered log_format: id, last time, count per key
    script = (f"for f in {log}.1 {log}; do [ -r \"$f\" ] && cat \"$f\"; done | "
              "sed -n 's/^.*\"time\":\"\\([^\"]*\\)\".*\"key_id\":\"\\([0-9a-f]\\{12\\}\\)\".*$/\\2 \\1/p' | "
              "awk '{last[$1]=$2; n[$1]++} END {for (k in last) print k, last[k], n[k]}'")
    r = host.run(["bash", "-c", script], timeout=120, check=False)
    seen: dict[str, tuple[str, int]] = {}
    for line in r.stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2].isdigit():
            seen[parts[0]] = (parts[1], int(parts[2]))
    engine = keyfile.key_id(current.engine_key) if current.engine_key else None
    out = [KeyUse(k.id, "accepted", k.source, k.added, None, *seen.get(k.id, (None, 0)), k.id == engine)
           for k in current.keys]
    out += [KeyUse(rid, "retired", None, None, at, *seen.get(rid, (None, 0)), rid == engine)
            for rid, at in current.retired]
    return out
