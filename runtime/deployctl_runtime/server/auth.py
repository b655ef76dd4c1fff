"""API keys: loading, constant-time checking, and a deny-by-default ASGI middleware.

Keys come from env `DEPLOYCTL_RUNTIME_API_KEY` (comma-separated) and/or `--api-key-file PATH` (one key per line,
`#` comments); never from the command line. Every HTTP route needs `Authorization: Bearer KEY` except the open
ones (/healthz, /readyz, /health, /identity, and /metrics when `--metrics-public`), so a route added later is
protected by default. /identity is open as the probes are: it says who the process is (release, replica, instance
id, pid, port, start time, phase), no secret and no model output (the release is in /readyz and in every response's
X-Deployctl-Release already), and deployctl's host-side check before a sleep, wake, drain or stop must reach it in
every phase.
Keys are compared with `hmac.compare_digest` against every configured key, and never logged: the access log names
the key a request used by `key_id` (`key_id()`: the first 12 hex digits of its SHA-256), so clients and a key
rotation (old and new key accepted at once) can be followed without the key itself.
"""
from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import os
from pathlib import Path
from typing import Iterable

from .errors import error_body

ENV_VAR = "DEPLOYCTL_RUNTIME_API_KEY"
# /health: vLLM's liveness route, open there too; /identity: who this process is (module doc)
ALWAYS_OPEN = frozenset({"/healthz", "/readyz", "/health", "/identity"})


def load_api_keys(env: dict[str, str] | None = None, key_file: str | None = None) -> list[str]:
    """Return the configured keys. Raises ValueError naming the file when it cannot be read or holds no key."""
    env = os.environ if env is None else env
    keys = [k.strip() for k in env.get(ENV_VAR, "").split(",") if k.strip()]
    if key_file:
        try:
            lines = Path(key_file).read_text().splitlines()
        except OSError as exc:
            raise ValueError(f"--api-key-file {key_file}: cannot read it ({exc.strerror}); fix the path or permissions")
        file_keys = [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("#")]
        if not file_keys:
            raise ValueError(f"--api-key-file {key_file}: holds no key; write one key per line")
        keys += file_keys
    return keys


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def key_id(key: str) -> str:
    """The key's id in logs: the first 12 hex digits of SHA-256 of the key (not reversible to the key)."""
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def matching_key(presented: str, keys: Iterable[str]) -> int:
    """Index of the key ``presented`` equals, or -1; every key compared in constant time (no early exit that would
    leak which key matched)."""
    found = -1
    for i, k in enumerate(keys):
        if hmac.compare_digest(presented.encode(), k.encode()):
            found = i
    return found


def key_matches(presented: str, keys: Iterable[str]) -> bool:
    """Constant-time check against every key."""
    return matching_key(presented, keys) >= 0


class APIKeyMiddleware:
    """Pure ASGI middleware: 401 in OpenAI's error shape unless the route is open or the bearer key is valid."""

    def __init__(self, app, keys: list[str], metrics_public: bool = False):
        self.app = app
        self.keys = list(keys)
        self.ids = [key_id(k) for k in self.keys]
        self.open_paths = ALWAYS_OPEN | ({"/metrics"} if metrics_public else set())

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not self.keys or scope["path"] in self.open_paths:
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        auth = headers.get(b"authorization", b"").decode("latin-1")
        scheme, _, token = auth.partition(" ")
        found = matching_key(token.strip(), self.keys) if scheme.lower() == "bearer" and token else -1
        if found >= 0:
            rec = (scope.get("state") or {}).get("record")
            if rec is not None:
                rec.key_id = self.ids[found]
            return await self.app(scope, receive, send)
        message = "missing API key: send 'Authorization: Bearer <key>'" if not auth else "invalid API key"
        body = json.dumps(error_body(message, "authentication_error", None, "invalid_api_key")).encode()
        await send({
            "type": "http.response.start",
            "status": 401,
            "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer"),
                        (b"content-length", str(len(body)).encode())],
        })
        await send({"type": "http.response.body", "body": body})
