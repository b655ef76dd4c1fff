"""HTTP to the runtime from the host itself: a stdlib-only Python snippet run with the host's python over the
Host layer, so checks work whatever the runtime binds (loopback included) and need no port opened to us.

``http(host, cfg, method, path, body=None, timeout=10)`` -> ``HttpResult`` (status, headers, body text).
The API key (``server.api_key_env`` from deployctl's environment) travels in the env file of Host.run.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Optional

from deployctl.config import DeployConfig
from deployctl.config.layout import service_port

_SNIPPET = r"""
import json, os, sys, urllib.request, urllib.error
req = json.loads(sys.argv[1])
data = req["body"].encode() if req["body"] is not None else None
r = urllib.request.Request(req["url"], data=data, method=req["method"])
if data is not None:
    r.add_header("Content-Type", "application/json")
key = os.environ.get("DEPLOYCTL_PROBE_KEY")
if key:
    r.add_header("Authorization", "Bearer " + key.split(",")[0])
out = {"status": 0, "headers": {}, "body": "", "error": ""}
try:
    with urllib.request.urlopen(r, timeout=req["timeout"]) as resp:
        out.update(status=resp.status, headers=dict(resp.headers), body=resp.read().decode("utf-8", "replace"))
except urllib.error.HTTPError as e:
    out.update(status=e.code, headers=dict(e.headers or {}), body=e.read().decode("utf-8", "replace"))
except Exception as e:
    out["error"] = type(e).__name__ + ": " + str(e)
print(json.dumps(out))
"""


@dataclass(frozen=True)
class HttpResult:
    status: int  # 0 when no HTTP answer (connection refused, timeout)
    headers: dict[str, str] = field(default_factory=dict)
    body: str = ""
    error: str = ""

    def header(self, name: str) -> Optional[str]:
        for k, v in self.headers.items():
            if k.lower() == name.lower():
                return v
        return None

    def json(self) -> Any:
        return json.loads(self.body)


def base_url(cfg: DeployConfig, h) -> str:
    bind = cfg.server.bind
    addr = "127.0.0.1" if bind in ("0.0.0.0", "::", "") else bind
    if ":" in addr:
        addr = f"[{addr}]"
    return f"http://{addr}:{service_port(cfg, h)}"


def api_key(cfg: DeployConfig) -> Optional[str]:
    return os.environ.get(cfg.server.api_key_env) if cfg.server.api_key_env else None


def http(host, cfg: DeployConfig, method: str, path: str, body: Any = None, *, timeout: float = 10) -> HttpResult:
    """One HTTP request to the runtime on ``host``, made on that host. Raises RemoteError (SSH trouble)."""
    req = {"url": base_url(cfg, host.config) + path, "method": method, "timeout": timeout,
           "body": json.dumps(body) if body is not None else None}
    key = api_key(cfg)
    env = {"DEPLOYCTL_PROBE_KEY": key} if key else None
    r = host.run([host.config.python, "-S", "-c", _SNIPPET, json.dumps(req)], timeout=timeout + 20, env=env)
    try:
        d = json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return HttpResult(0, error=f"probe printed no result: {r.stdout[-200:]} {r.stderr[-200:]}")
    return HttpResult(int(d["status"]), d.get("headers") or {}, d.get("body") or "", d.get("error") or "")
