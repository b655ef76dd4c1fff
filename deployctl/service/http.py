"""HTTP to the runtime from the host itself: the stdlib-only HTTP_PROBE (deployctl/hostscripts/snippets.py) run with
the host's python over the Host layer, so rollout checks and runbooks work whatever the runtime binds (loopback
included) and need no port opened to us. The one HTTP probe of the runtime: everything that asks a running
runtime something goes through the engine handle's ``Engine(host, cfg, port).http(method, path, body=None,
timeout=10)`` (deployctl.service.engine), which calls ``request`` here -> ``HttpResult`` (status, headers, body
text, error, elapsed_s). The API key (``server.api_key_env`` from deployctl's environment) travels in the env file
of Host.run; without it the probe reads the key from the release's runtime.env on the host.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Optional

from deployctl import settings
from deployctl.config import DeployConfig
from deployctl.hostscripts.snippets import HTTP_PROBE


@dataclass(frozen=True)
class HttpResult:
    status: int  # 0 when no HTTP answer (connection refused, timeout)
    headers: dict[str, str] = field(default_factory=dict)
    body: str = ""
    error: str = ""  # in words ("Connection refused"), when no HTTP answer
    elapsed_s: float = 0.0  # the request's wall time on the host
    error_kind: str = ""  # refused | timeout | reset | dns | other (HTTP_PROBE), when no HTTP answer

    def describe(self, path: str) -> str:
        """The outcome in words for status lines: "/readyz 503", or why there was no answer ("connection refused")."""
        if self.status:
            return f"{path} {self.status}"
        text = self.error or "no answer"
        return text[:1].lower() + text[1:]

    def header(self, name: str) -> Optional[str]:
        for k, v in self.headers.items():
            if k.lower() == name.lower():
                return v
        return None

    def json(self) -> Any:
        return json.loads(self.body)


def api_key(cfg: DeployConfig) -> Optional[str]:
    return settings.secret(cfg.server.api_key_env) if cfg.server.api_key_env else None


def request(host, url: str, method: str, body: Any = None, *, timeout: float = 10, key: Optional[str] = None,
            env_file: str = "") -> HttpResult:
    """One HTTP request to ``url`` made on ``host`` (HTTP_PROBE run by the host's python), within ``timeout``
    seconds; ``key`` the bearer key (else the probe reads DEPLOYCTL_RUNTIME_API_KEY from ``env_file`` on the host).
    The engine handle's ``Engine.http`` is the one caller. Raises RemoteError (SSH trouble)."""
    h = host.config
    req = {"url": url, "method": method, "timeout": timeout, "json": body, "env_file": env_file}
    env = {"DEPLOYCTL_PROBE_KEY": key} if key else None
    r = host.run([h.python, "-S", "-c", HTTP_PROBE, json.dumps(req)], timeout=timeout + 20, env=env)
    try:
        d = json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return HttpResult(0, error=f"probe printed no result: {r.stdout[-200:]} {r.stderr[-200:]}")
    return HttpResult(int(d["status"]), d.get("headers") or {}, d.get("body") or "", d.get("error") or "",
                      float(d.get("elapsed_s") or 0.0), d.get("error_kind") or "")
