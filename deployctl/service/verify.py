"""Verify a runtime on a host: readiness (/readyz 200, on the device deploy.yaml asked for) and a sample
inference through /v1/chat/completions that returns at least one token, each within a timeout. Failures raise
HealthError (exit 5) naming the host, what failed, and the last lines of the runtime log."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from deployctl.config import DeployConfig
from deployctl.config.layout import log_file
from deployctl.engines import adapter
from deployctl.errors import HealthError
from deployctl.service import launcher
from deployctl.service.http import http

RELEASE_HEADER = "X-Deployctl-Release"


@dataclass(frozen=True)
class Verified:
    host: str
    ready_s: float  # seconds until /readyz answered 200
    tokens: int  # completion tokens of the sample inference
    release: Optional[str]  # X-Deployctl-Release of the answer
    timings: dict = field(default_factory=dict)  # seconds per phase when activated by hostops


def _fail(host, what: str) -> HealthError:
    tail = launcher.log_tail(host, 8)
    more = f"; last log lines: {tail[-600:]}" if tail else ""
    return HealthError(f"{host.name}: {what}{more}",
                       fix=f"see {log_file(host.config)} on {host.name}")


def _check_device(host, cfg: DeployConfig, ready) -> None:
    """The runtime's /readyz says where it runs (device, device_name, dtype; older runtimes say nothing and pass).
    Raises HealthError when it is not the engine.device deploy.yaml asked for (cuda asked, cpu running)."""
    if not adapter(cfg.engine.kind).config_file:
        return  # a foreign engine's readiness route says nothing about its device
    try:
        body = ready.json()
    except ValueError:
        return
    got = body.get("device") if isinstance(body, dict) else None
    if got is not None and got != cfg.engine.device:
        raise _fail(host, f"runs on {got} ({body.get('device_name') or 'unknown device'}, {body.get('dtype')}) "
                          f"but deploy.yaml asks for engine.device {cfg.engine.device}")


def _ready(host, cfg: DeployConfig):
    """GET the readiness route: the bundled runtime's /readyz first (a host may still run a release of another
    engine, e.g. while an engine switch is restored), the configured engine's route when that route is unknown
    (404): vLLM, SGLang and transformers serve /health, which the runtime answers 200 even while loading."""
    first = adapter("deployctl-runtime").ready_route
    r = http(host, cfg, "GET", first, timeout=3)
    route = adapter(cfg.engine.kind).ready_route
    if r.status == 404 and route != first:
        r = http(host, cfg, "GET", route, timeout=3)
    return r


def wait_ready(host, cfg: DeployConfig, *, timeout: float, should_stop: Callable[[], None] | None = None,
               log_offset: Optional[int] = None) -> float:
    """Poll the engine's readiness route (/readyz for the bundled runtime, deployctl.engines) until 200. Calls ``should_stop()`` between polls (it raises to interrupt). Returns the
    seconds waited. Raises HealthError on timeout, or when the runtime exits (its log since ``log_offset``
    shows an exit, or the process group is gone)."""
    t0 = time.monotonic()
    last = ""
    while True:
        if should_stop:
            should_stop()
        r = _ready(host, cfg)
        if r.status == 200:
            _check_device(host, cfg, r)
            return time.monotonic() - t0
        last = f"HTTP {r.status}" if r.status else (r.error or "no answer")
        if log_offset is not None:
            alive, crash = launcher.liveness(host, cfg, log_offset)
            if crash:
                raise _fail(host, f"the runtime exited while starting ({crash[:200]})")
            if not alive:
                raise _fail(host, f"the runtime is not running (last /readyz: {last})")
        if time.monotonic() - t0 > timeout:
            raise _fail(host, f"not ready after {timeout:.0f} s (last /readyz: {last})")
        time.sleep(0.3)


def sample_inference(host, cfg: DeployConfig, *, timeout: float = 30) -> tuple[int, Optional[str]]:
    """One short chat completion. Returns (completion tokens, release header). Raises HealthError."""
    body = adapter(cfg.engine.kind).sample_body(cfg.model.name)
    r = http(host, cfg, "POST", "/v1/chat/completions", body, timeout=timeout)
    if r.status != 200:
        detail = r.body[:300] if r.body else r.error
        raise _fail(host, f"sample inference failed: HTTP {r.status} {detail}")
    try:
        data = r.json()
        tokens = int((data.get("usage") or {}).get("completion_tokens") or 0)
        if not tokens and data["choices"][0]["message"].get("content"):
            tokens = 1
    except (ValueError, KeyError, IndexError, TypeError):
        raise _fail(host, f"sample inference answered 200 with an unexpected body: {r.body[:200]}") from None
    if tokens < 1:
        raise _fail(host, "sample inference returned no tokens")
    return tokens, r.header(RELEASE_HEADER)


def verify(host, cfg: DeployConfig, *, timeout: float = 120, expect_release: Optional[str] = None,
           should_stop: Callable[[], None] | None = None, log_offset: Optional[int] = None) -> Verified:
    """Readiness then a sample inference; with ``expect_release`` the answer's release header must match."""
    ready_s = wait_ready(host, cfg, timeout=timeout, should_stop=should_stop, log_offset=log_offset)
    tokens, release = sample_inference(host, cfg, timeout=min(60.0, timeout))
    if expect_release and release and release != expect_release:
        raise _fail(host, f"serves release {release}, expected {expect_release}")
    return Verified(host.name, ready_s, tokens, release)
