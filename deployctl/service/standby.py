"""Sleep, wake and ask a runtime whether it sleeps, from its own host (the engine adapter's ``Adapter.sleep`` routes
over ``service.http``): the router never proxies these routes, so deployctl reaches them host-side only.

``sleep(host, cfg, port)`` / ``wake(host, cfg, port)`` -> ``SleepResult``; ``is_sleeping(host, cfg, port)`` ->
True / False / None (the engine has no state route, e.g. SGLang). ``port``: the port that runtime serves on (None:
the host's active port). An engine without a sleep mode (``Adapter.sleep`` None: transformers serve) raises
ConfigError (exit 3): callers check ``deployctl.engines.standby_enabled(cfg)`` first and fall back to a cold start.
Neither call raises on an HTTP refusal: ``SleepResult.ok`` is False and ``reason`` says why (e.g. the bundled
runtime's 409 ``requests_in_flight``, or a wake's 503 ``gpu_memory_exhausted`` naming who holds the memory).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Optional

from deployctl.config import DeployConfig
from deployctl.engines import Sleep, of
from deployctl.errors import ConfigError
from deployctl.service.http import HttpResult, http

SLEEP_TIMEOUT_S = 120.0  # copying the weights of a large model to host RAM takes tens of seconds
WAKE_TIMEOUT_S = 300.0  # host RAM -> GPU plus a KV pool re-allocation (and CUDA graph capture)


@dataclass(frozen=True)
class SleepResult:
    """One sleep or wake: ``ok`` (the engine answered 2xx), ``status`` (HTTP status, 0: no answer), ``seconds`` (the
    engine's own figure, ``sleep_s`` / ``wake_s`` in the bundled runtime's answer, else the request's wall time on
    the host), ``reason`` (why not, in words, with the engine's error code when it gave one), ``code`` (the
    engine's error code: ``requests_in_flight``, ``gpu_memory_exhausted``, ``already_sleeping``, ``not_sleeping``...),
    ``body`` (the answer's JSON, {} when none)."""

    action: str  # "sleep" | "wake"
    ok: bool
    status: int
    seconds: float
    reason: str = ""
    code: str = ""
    body: Optional[dict] = None


def _sleep_mode(cfg: DeployConfig) -> Sleep:
    mode = of(cfg).sleep
    if mode is None:
        raise ConfigError(f"engine {cfg.engine.kind} has no sleep mode: its standby is a stopped release",
                          fix="roll back by a cold start (rollout.standby_s applies to engines with a sleep mode)")
    return mode


def _result(action: str, r: HttpResult, path: str) -> SleepResult:
    try:
        body = r.json() if r.body else {}
    except ValueError:
        body = {}
    body = body if isinstance(body, dict) else {}
    seconds = body.get(f"{action}_s")
    seconds = float(seconds) if isinstance(seconds, (int, float)) else r.elapsed_s
    if 200 <= r.status < 300:
        return SleepResult(action, True, r.status, seconds, body=body)
    err = body.get("error") if isinstance(body.get("error"), dict) else {}
    code = str(err.get("code") or "")
    message = err.get("message") or (r.body[:300] if r.status else "")
    reason = f"{path} {r.status}: {message}" if r.status else r.describe(path)
    return SleepResult(action, False, r.status, seconds, reason + (f" ({code})" if code else ""), code, body)


def _call(host, cfg: DeployConfig, route: tuple[str, str], action: str, port: Optional[int],
          timeout: float, release: Optional[str]) -> SleepResult:
    from deployctl.config.layout import service_port
    from deployctl.service import identity

    # the engine on that port must be this host's (replica) and run ``release``: else nothing is sent (identity.py)
    identity.expect(host, cfg, port or service_port(cfg, host.config), release=release, action=action)
    method, path = route
    # SGLang's release/resume routes read a JSON body (tags optional); the others take none
    body = {} if cfg.engine.kind == "sglang" else None
    return _result(action, http(host, cfg, method, path, body, timeout=timeout, port=port), path)


def sleep(host, cfg: DeployConfig, port: Optional[int] = None, *, timeout: float = SLEEP_TIMEOUT_S,
          release: Optional[str] = None) -> SleepResult:
    """Put the runtime on ``host`` (at ``port``) to sleep: level 1 (weights to host RAM, KV cache discarded).
    ``release``: the release that engine must run (identity.expect, checked first with the host's replica index).
    Raises ConfigError for an engine without a sleep mode, identity.IdentityMismatch (5) when another engine
    holds the port (nothing sent), RemoteError on SSH trouble."""
    return _call(host, cfg, _sleep_mode(cfg).sleep, "sleep", port, timeout, release)


def wake(host, cfg: DeployConfig, port: Optional[int] = None, *, timeout: float = WAKE_TIMEOUT_S,
         release: Optional[str] = None) -> SleepResult:
    """Wake the runtime on ``host`` (at ``port``): weights back on the GPU, a new (empty) KV pool. A wake that no
    longer fits (another process took the memory) is ``ok`` False with the engine's reason. Raises as sleep()."""
    return _call(host, cfg, _sleep_mode(cfg).wake, "wake", port, timeout, release)


def is_sleeping(host, cfg: DeployConfig, port: Optional[int] = None, *, timeout: float = 10) -> Optional[bool]:
    """True / False from the engine's state route; None when it has none or gave no usable answer. Raises
    ConfigError for an engine without a sleep mode, RemoteError on SSH trouble."""
    route = _sleep_mode(cfg).state
    if route is None:
        return None
    r = http(host, cfg, route[0], route[1], timeout=timeout, port=port)
    if r.status != 200:
        return None
    try:
        value = json.loads(r.body).get("is_sleeping")
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, bool) else None
