"""What a sleep or wake gives (``SleepResult``), and the engine's sleep mode: the engine handle sleeps, wakes and asks
a runtime whether it sleeps from its own host (``Engine.sleep`` / ``wake`` / ``is_sleeping`` in
deployctl.service.engine, over the adapter's ``Adapter.sleep`` routes): the router never proxies these routes, so
deployctl reaches them host-side only.

``Engine.sleep()`` / ``wake()`` -> ``SleepResult``; ``is_sleeping()`` -> True / False / None (the engine has no
state route, e.g. SGLang). An engine without a sleep mode (``Adapter.sleep`` None: transformers serve) raises
ConfigError (exit 3): callers check ``deployctl.engines.standby_enabled(cfg)`` first and fall back to a cold start.
Neither call raises on an HTTP refusal: ``SleepResult.ok`` is False and ``reason`` says why (e.g. the bundled
runtime's 409 ``requests_in_flight``, or a wake's 503 ``gpu_memory_exhausted`` naming who holds the memory).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from deployctl.config import DeployConfig
from deployctl.engines import Sleep, of
from deployctl.errors import ConfigError
from deployctl.service.http import HttpResult

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


def sleep_mode(cfg: DeployConfig) -> Sleep:
    """The engine's sleep mode (its adapter's routes). Raises ConfigError for an engine without one."""
    mode = of(cfg).sleep
    if mode is None:
        raise ConfigError(f"engine {cfg.engine.kind} has no sleep mode: its standby is a stopped release",
                          fix="roll back by a cold start (rollout.standby_s applies to engines with a sleep mode)")
    return mode


def sleep_result(action: str, r: HttpResult, path: str) -> SleepResult:
    """The SleepResult of the engine's answer ``r`` to ``path``."""
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
