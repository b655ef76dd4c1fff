"""What the routes share: the lifecycle phase, the engine once loaded, counters for back-pressure and drain.

Phases: loading -> ready -> draining (SIGTERM) ; loading -> failed (load error: the process exits 1) ;
ready -> failed (the engine died: the process exits 3; or the watchdog found it stalled: exits 4, watchdog.py) ;
ready <-> sleeping (POST /sleep, POST /wake_up: sleep.py).
Only `ready` serves inference; the others answer 503 with Retry-After.
"""
from __future__ import annotations

import asyncio
import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from .config import ServeConfig
from .errors import APIError, queue_full, unavailable
from .faults import Faults
from .metrics import Metrics
from .sd_notify import Notifier

RETRY_AFTER_LOADING_S = 5
RETRY_AFTER_DRAINING_S = 10
RETRY_AFTER_QUEUE_FULL_S = 1


@dataclass
class ServerContext:
    cfg: ServeConfig
    faults: Faults
    phase: str = "loading"
    detail: str = "starting"
    started_at: float = field(default_factory=time.monotonic)
    engine: Any = None  # AsyncEngine once ready
    tokenizer: Any = None
    token_bytes: Any = None  # tokenizer.TokenBytes: logprob token text and bytes
    bos_token_id: int | None = None
    device: dict[str, Any] = field(default_factory=dict)  # device, device_name, dtype, kv_cache (once loaded)
    chat_template: Any = None  # ChatTemplate | None
    model_name: str = ""
    max_model_len: int = 0
    vocab_size: int = 0
    max_token_chars: int = 0  # longest vocabulary entry in characters: bounds how much text one token covers
    inflight_http: int = 0  # inference HTTP requests being answered (drain waits for 0)
    inflight_seqs: int = 0  # engine requests added and not finished (back-pressure)
    idle: asyncio.Event | None = None
    generations: set = field(default_factory=set)  # live Generation objects (drain timeout cuts them off)
    exit_code: int = 0
    metrics: Metrics = None  # type: ignore[assignment]
    ledger: Any = None  # gpu_ledger.Ledger with DEPLOYCTL_FAKE_GPU_MEMORY (a stand-in GPU for tests), else None
    instance_id: str = field(default_factory=lambda: uuid.uuid4().hex)  # new at every process start
    started_unix: float = field(default_factory=time.time)
    port: int | None = None  # the bound port, once uvicorn bound it
    stall: str | None = None  # the watchdog's message once it found the engine stalled (watchdog.py)
    notifier: Notifier = field(default_factory=Notifier.from_env)  # systemd notify (sd_notify.py)

    def __post_init__(self) -> None:
        if self.metrics is None:
            self.metrics = Metrics(lambda: self.engine.stats if self.engine else None)

    @property
    def served_name(self) -> str:
        return self.cfg.served_model_name or self.model_name

    @property
    def status(self) -> str:
        """The phase as /readyz reports it: `failed` as soon as the engine loop is dead, even before the phase
        changes, so /readyz's status code (200 only for `ready`) and its body always agree."""
        if self.phase == "ready" and (self.engine is None or not self.engine.is_alive):
            return "failed"
        return self.phase

    def identity(self) -> dict[str, Any]:
        """GET /identity: who this process is. release (--release-id, or None), replica (--replica-index),
        instance (uuid4 hex made at process start), pid, port (bound), started_at (Unix seconds), phase."""
        return {"release": self.cfg.release_id, "replica": self.cfg.replica_index, "instance": self.instance_id,
                "pid": os.getpid(), "port": self.port, "started_at": round(self.started_unix, 3),
                "phase": "stalled" if self.stall else self.status}

    def stalled_error(self) -> APIError | None:
        """503 engine_stalled (no Retry-After: the process is about to exit) once the watchdog tripped, else None."""
        if self.stall is None:
            return None
        return APIError(503, self.stall, "service_unavailable", None, "engine_stalled")

    def readiness(self) -> dict[str, Any]:
        status = self.status
        detail = self.detail if status == self.phase else f"the engine died: {getattr(self.engine, 'error', None)}"
        body: dict[str, Any] = {"status": status, "detail": detail,
                                "uptime_s": round(time.monotonic() - self.started_at, 3)}
        if self.cfg.release_id:
            body["release"] = self.cfg.release_id
        if status == "ready":
            body["model"] = self.served_name
        body.update(self.where())
        return body

    def where(self) -> dict[str, Any]:
        """Where the engine runs: device (cpu/cuda as configured until loaded), device_name, dtype, and the KV pool
        (blocks, block size, tokens, free blocks, usage) once loaded, so a deploy can check it got what it asked."""
        info = {"device": self.cfg.device, "device_name": None, "dtype": None, "kv_cache": None, **self.device}
        stats = self.engine.stats if self.engine is not None else None
        if info["kv_cache"] is not None and stats is not None:
            if self.phase == "sleeping":  # the pool is freed while asleep: nothing of it is present
                info["kv_cache"] = {**info["kv_cache"], "num_blocks": 0, "num_tokens": 0, "num_free_blocks": 0,
                                    "usage": 0.0, "released": True}
            else:
                info["kv_cache"] = {**info["kv_cache"], "num_free_blocks": stats.num_free_blocks,
                                    "usage": round(stats.kv_cache_usage, 4), "released": False}
        return info

    def check_serving(self) -> None:
        """Raise 503 unless ready (and the engine loop is alive); code engine_stalled once the watchdog tripped."""
        stalled = self.stalled_error()
        if stalled is not None:
            raise stalled
        if self.phase == "loading":
            self.metrics.request_rejected.labels(reason="not_ready").inc()
            raise unavailable(f"the model is still loading ({self.detail}); retry shortly", RETRY_AFTER_LOADING_S)
        if self.phase == "draining":
            self.metrics.request_rejected.labels(reason="draining").inc()
            raise unavailable("the server is draining for shutdown; send the request to another replica",
                              RETRY_AFTER_DRAINING_S, code="draining")
        if self.phase == "sleeping":
            self.metrics.request_rejected.labels(reason="sleeping").inc()
            raise unavailable("the server is asleep (a standby release); send the request to another replica",
                              RETRY_AFTER_LOADING_S, code="sleeping")
        if self.phase != "ready" or not self.engine.is_alive:
            raise APIError(503, f"the server cannot serve: {self.engine.error if self.engine else self.detail}",
                           "service_unavailable", None, "engine_dead", {"Retry-After": str(RETRY_AFTER_LOADING_S)})

    def admit(self, num_seqs: int) -> None:
        """Back-pressure: 429 when more than --max-queued-requests engine requests would wait."""
        stats = self.engine.stats
        # engine requests beyond the running limit wait; the engine's own count adds those its KV pool holds back
        waiting = max(self.inflight_seqs + num_seqs - self.cfg.max_num_seqs, getattr(stats, "num_waiting", 0))
        if waiting > self.cfg.max_queued_requests:
            self.metrics.request_rejected.labels(reason="queue_full").inc()
            raise queue_full(f"queue full: {waiting} requests would wait, --max-queued-requests is "
                             f"{self.cfg.max_queued_requests}; retry after a short wait", RETRY_AFTER_QUEUE_FULL_S)

    def http_started(self) -> None:
        self.inflight_http += 1
        if self.idle is not None:
            self.idle.clear()

    def http_finished(self) -> None:
        self.inflight_http -= 1
        if self.inflight_http == 0 and self.idle is not None:
            self.idle.set()
