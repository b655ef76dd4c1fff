"""Verify a runtime on a host: readiness (/readyz 200, on the device deploy.yaml asked for) and a sample
inference through /v1/chat/completions that returns at least one token, each within a timeout. A model without a
chat template (the runtime answers 400 ``no_chat_template``, C29) is verified through /v1/completions instead, and
``Verified.endpoint`` says so. Failures raise HealthError (exit 5) naming the host, what failed, and the last lines
of the runtime log."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from deployctl.config import DeployConfig
from deployctl.config.layout import log_file
from deployctl.engines import adapter, of
from deployctl.errors import HealthError
from deployctl.service import launcher
from deployctl.service.http import http

RELEASE_HEADER = "X-Deployctl-Release"
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"


@dataclass(frozen=True)
class Verified:
    host: str
    ready_s: float  # seconds until /readyz answered 200
    tokens: int  # completion tokens of the sample inference
    release: Optional[str]  # X-Deployctl-Release of the answer
    timings: dict = field(default_factory=dict)  # seconds per phase when activated by hostops
    endpoint: str = CHAT  # the path the sample inference used

    def note(self) -> str:
        """'' for chat; a short phrase when the sample went through /v1/completions."""
        return "" if self.endpoint == CHAT else f" via {self.endpoint} (the model has no chat template)"


def _fail(host, what: str, fix: str = "") -> HealthError:
    tail = launcher.log_tail(host, 8)
    more = f"; last log lines: {tail[-600:]}" if tail else ""
    where = f"see {log_file(host.config)} on {host.name}"
    return HealthError(f"{host.name}: {what}{more}", fix=f"{where}; {fix.removeprefix('see the log; ')}" if fix else where)


def _check_device(host, cfg: DeployConfig, ready) -> None:
    """The runtime's /readyz says where it runs (device, device_name, dtype; older runtimes say nothing and pass).
    Raises HealthError when it is not the engine.device deploy.yaml asked for (cuda asked, cpu running)."""
    if not of(cfg).config_file:
        return  # a foreign engine's readiness route says nothing about its device
    try:
        body = ready.json()
    except ValueError:
        return
    got = body.get("device") if isinstance(body, dict) else None
    if got is not None and got != cfg.engine.device:
        raise _fail(host, f"runs on {got} ({body.get('device_name') or 'unknown device'}, {body.get('dtype')}) "
                          f"but deploy.yaml asks for engine.device {cfg.engine.device}")


def _ready(host, cfg: DeployConfig, port: Optional[int] = None):
    """GET the readiness route: the bundled runtime's /readyz first (a host may still run a release of another
    engine, e.g. while an engine switch is restored), the configured engine's route when that route is unknown
    (404): vLLM, SGLang and transformers serve /health (the runtime's /health, too, is 503 until it serves)."""
    first = adapter("deployctl-runtime").ready_route
    r = http(host, cfg, "GET", first, timeout=3, port=port)
    a = of(cfg)
    if r.status == 404 and a.ready_route != first:  # SGLang's /health runs a generation: its probe_timeout_s
        r = http(host, cfg, "GET", a.ready_route, timeout=max(3, a.probe_timeout_s), port=port)
    return r


def wait_ready(host, cfg: DeployConfig, *, timeout: float, should_stop: Callable[[], None] | None = None,
               log_offset: Optional[int] = None, deadline_why: str = "", port: Optional[int] = None) -> float:
    """Poll the engine's readiness route (/readyz for the bundled runtime, deployctl.engines) until 200, every
    0.15 s (the supervisor's liveness every third poll). Calls ``should_stop()`` between polls (it raises to
    interrupt). ``port``: a runtime started beside the serving one (launcher.start's ``port``). Returns the
    seconds waited. Raises HealthError on timeout (naming ``deadline_why``, the derivation of a multi-GPU start's
    deadline, when given), or when the runtime exits (its log since ``log_offset`` shows an exit, or the process
    group is gone)."""
    t0 = time.monotonic()
    last = ""
    polls = 0
    while True:
        if should_stop:
            should_stop()
        r = _ready(host, cfg, port)
        if r.status == 200:
            _check_device(host, cfg, r)
            return time.monotonic() - t0
        last = f"HTTP {r.status}" if r.status else (r.error or "no answer")
        polls += 1
        if log_offset is not None and polls % 3 == 1:
            alive, crash = launcher.liveness(host, cfg, log_offset, port=port)
            if crash:
                raise _fail(host, f"the runtime exited while starting ({crash[:200]})")
            if not alive:
                raise _fail(host, f"the runtime is not running (last /readyz: {last})")
        if time.monotonic() - t0 > timeout:
            if deadline_why:  # alive, silent, never ready: what a hung NCCL rendezvous looks like
                raise _fail(host, f"not ready after {timeout:.0f} s, {deadline_why}; the engine is still running "
                                  f"but never became ready (a hung NCCL init?; last readiness answer: {last})",
                            fix="see the log; run the engine with NCCL_DEBUG=INFO, check `nvidia-smi topo -m` "
                                "and that no earlier rank holds one of the GPUs")
            raise _fail(host, f"not ready after {timeout:.0f} s (last /readyz: {last})")
        time.sleep(0.15)


def _no_chat_template(r) -> bool:
    """The runtime's 400 for a model without a chat template (error code ``no_chat_template``)."""
    if r.status != 400:
        return False
    try:
        return (r.json().get("error") or {}).get("code") == "no_chat_template"
    except (ValueError, AttributeError):
        return False


def sample_inference(host, cfg: DeployConfig, *, timeout: float = 30,
                     port: Optional[int] = None) -> tuple[int, Optional[str], str]:
    """One short chat completion; /v1/completions when the model has no chat template. Returns (completion
    tokens, release header, endpoint path). Raises HealthError."""
    body = of(cfg).sample_body(cfg.model.name)
    path = CHAT
    r = http(host, cfg, "POST", path, body, timeout=timeout, port=port)
    if _no_chat_template(r):
        path = COMPLETIONS
        common = {k: v for k, v in body.items() if k != "messages"}
        r = http(host, cfg, "POST", path, {**common, "prompt": "Hello"}, timeout=timeout, port=port)
    if r.status != 200:
        detail = r.body[:300] if r.body else r.error
        raise _fail(host, f"sample inference ({path}) failed: HTTP {r.status} {detail}")
    try:
        data = r.json()
        tokens = int((data.get("usage") or {}).get("completion_tokens") or 0)
        choice = data["choices"][0]
        text = choice["message"].get("content") if path == CHAT else choice.get("text")
        if not tokens and text:
            tokens = 1
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        raise _fail(host, f"sample inference answered 200 with an unexpected body: {r.body[:200]}") from None
    if tokens < 1:
        raise _fail(host, "sample inference returned no tokens")
    return tokens, r.header(RELEASE_HEADER), path


def verify(host, cfg: DeployConfig, *, timeout: float = 120, expect_release: Optional[str] = None,
           should_stop: Callable[[], None] | None = None, log_offset: Optional[int] = None,
           deadline_why: str = "", port: Optional[int] = None) -> Verified:
    """Readiness then a sample inference; with ``expect_release`` the answer's release header must match.
    ``port``: verify a runtime started beside the serving one there."""
    ready_s = wait_ready(host, cfg, timeout=timeout, should_stop=should_stop, log_offset=log_offset,
                         deadline_why=deadline_why, port=port)
    tokens, release, path = sample_inference(host, cfg, timeout=min(60.0, timeout), port=port)
    if expect_release and release and release != expect_release:
        raise _fail(host, f"serves release {release}, expected {expect_release}")
    return Verified(host.name, ready_s, tokens, release, endpoint=path)
