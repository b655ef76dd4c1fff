"""The router's API keys file: an nginx snippet (0600, on the router host beside the upstream conf:
``config.layout.router_keys_path``) included at ``http`` level by the rendered router conf. It holds two maps:

- ``$deployctl_<service>_key_id``: the id of the client's key (the first 12 hex digits of its SHA-256, as the bundled
  runtime logs ``key_id``), from the ``Authorization: Bearer <key>`` header, matched case-sensitively (a regex per
  key: nginx's string maps ignore case); empty for a missing or unknown key, which the router answers 401.
- ``$deployctl_<service>_engine_auth``: ``Bearer <engine key>`` for an accepted client, the header the router sends
  to the engines instead of the client's (the engine key is ``server.api_key_env``'s, the one in runtime.env), so a
  key added or retired at the router needs no engine restart.

nginx's master reads the file (as root on a host) when it loads or reloads its configuration; the key never appears
in the rendered conf, a command line or a log (the access log writes the id). Each key line carries its id, where
it came from (``deploy``: server.api_key_env / next_api_key_env at the last deploy; ``keys``: ``deployctl keys add``)
and when it was added, in a trailing comment this module parses back.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, replace
from typing import Optional

from deployctl.errors import ConfigError

# What a key may hold: written inside a double-quoted nginx regex, so no quote, backslash, space or $.
_KEY = re.compile(r"^[A-Za-z0-9._~+/=:,-]{8,512}$")
_LINE = re.compile(r'^\s*"~\^\[Bb\]earer (?P<rx>[^"]+)\$" (?P<id>[0-9a-f]{12});\s*# source=(?P<source>deploy|keys) '
                   r'added=(?P<added>\S+)\s*$')
_ENGINE = re.compile(r'^\s*default "Bearer (?P<key>[^"]+)";\s*$')
_RETIRED = re.compile(r"^# retired (?P<id>[0-9a-f]{12}) at=(?P<at>\S+)\s*$")
SOURCES = ("deploy", "keys")


def key_id(key: str) -> str:
    """The id of ``key`` in logs and listings: the first 12 hex digits of its SHA-256 (never the key)."""
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def check_key(key: str, what: str) -> str:
    """``key`` when it is 8-512 characters of letters, digits and ``._~+/=:,-``. Raises ConfigError naming
    ``what`` (the variable or option it came from) and how to make one."""
    if not _KEY.match(key or ""):
        raise ConfigError(f"the key in {what} ({len(key or '')} characters) is not 8-512 letters, digits or ._~+/=:,-",
                          fix="generate one with `python -c 'import secrets; print(secrets.token_urlsafe(32))'`")
    return key


@dataclass(frozen=True)
class Key:
    """One key the router accepts: ``id`` (key_id), ``source`` (deploy | keys), ``added`` (UTC ISO time)."""

    key: str
    source: str
    added: str

    @property
    def id(self) -> str:
        return key_id(self.key)


@dataclass(frozen=True)
class KeysFile:
    """The accepted keys, in order, the engine key the router sends upstream, and the retired ids ((id, time)
    pairs: a deploy never accepts them again; ``deployctl keys add`` does)."""

    keys: tuple[Key, ...]
    engine_key: Optional[str]
    retired: tuple[tuple[str, str], ...] = ()

    def ids(self) -> list[str]:
        return [k.id for k in self.keys]

    def with_key(self, key: Key) -> "KeysFile":
        """This file with ``key`` accepted (its source and time kept when it is already there)."""
        if key.id in self.ids():
            return self
        return replace(self, keys=self.keys + (key,), retired=tuple(r for r in self.retired if r[0] != key.id))

    def without(self, ids: set[str], now: str) -> "KeysFile":
        """This file with the keys ``ids`` retired at ``now``."""
        gone = tuple((k.id, now) for k in self.keys if k.id in ids)
        return replace(self, keys=tuple(k for k in self.keys if k.id not in ids), retired=self.retired + gone)


def _regex(key: str) -> str:
    return key.replace(".", r"\.").replace("+", r"\+")


def _unregex(rx: str) -> str:
    return rx.replace(r"\.", ".").replace(r"\+", "+")


def variables(base: str) -> tuple[str, str]:
    """(key id variable, engine Authorization variable) of service ``base`` (its nginx identifier)."""
    return f"$deployctl_{base}_key_id", f"$deployctl_{base}_engine_auth"


def render(base: str, keys: KeysFile) -> str:
    """The file's text for service ``base``. Raises ConfigError when no key is accepted or none reaches the
    engines (an empty allowlist would answer every client 401)."""
    if not keys.keys:
        raise ConfigError("the router would accept no API key", fix="keep at least one key (deployctl keys add)")
    if not keys.engine_key:
        raise ConfigError("the router has no engine key to send upstream",
                          fix="export the variable server.api_key_env names and run deployctl router reload")
    id_var, auth_var = variables(base)
    lines = ["# deployctl: the API keys the router accepts (0600; written by deploy and `deployctl keys`; do not "
             "edit)", f"map $http_authorization {id_var} {{", '    default "";']
    lines += [f'    "~^[Bb]earer {_regex(k.key)}$" {k.id};  # source={k.source} added={k.added}' for k in keys.keys]
    lines += ["}", f"map {id_var} {auth_var} {{", '    "" "";', f'    default "Bearer {keys.engine_key}";', "}"]
    lines += [f"# retired {rid} at={at}" for rid, at in keys.retired] + [""]
    return "\n".join(lines)


def parse(text: str) -> KeysFile:
    """The keys of a file ``render`` wrote (lines it did not write are ignored)."""
    keys, engine, retired = [], None, []
    for line in text.splitlines():
        r = _RETIRED.match(line)
        if r:
            retired.append((r["id"], r["at"]))
            continue
        m = _LINE.match(line)
        if m:
            keys.append(Key(_unregex(m["rx"]), m["source"], m["added"]))
            continue
        e = _ENGINE.match(line)
        if e:
            engine = e["key"]
    return KeysFile(tuple(keys), engine, tuple(retired))


def synced(current: Optional[KeysFile], env_keys: list[str], now: str) -> KeysFile:
    """The file after a deploy with ``env_keys`` (server.api_key_env's key first, then next_api_key_env's): those are
    accepted as ``deploy`` keys and the first is the engine key; ``deploy`` keys no longer in the environment are
    dropped (a rotation by deploy retires them), ``keys`` keys stay until ``deployctl keys retire``; a key retired
    there is not accepted again by a deploy (it may stay the engine key until server.api_key_env moves on)."""
    current = current or KeysFile((), None)
    ids = {key_id(k) for k in env_keys}
    retired = {rid for rid, _ in current.retired}
    kept = tuple(k for k in current.keys if k.source == "keys" or k.id in ids)
    out = KeysFile(kept, env_keys[0], current.retired)
    for k in env_keys:
        if key_id(k) not in retired:
            out = out.with_key(Key(k, "deploy", now))
    return out
