"""Sleep and wake (vLLM's sleep mode routes): park the loaded model without ending the process, so that a rollback
wakes it in seconds instead of a cold start. Behind the API key like every route but the open ones (auth.py).

- ``POST /sleep?level=1``: only level 1 (the weights move to pinned host memory on CUDA and stay in place on CPU;
  the KV cache is freed with the CUDA graphs that point at it; torch.cuda.empty_cache()). Refused with 409
  ``requests_in_flight`` while any inference request is being answered (deployctl drains the host out of the router
  first; a sleep never cuts a request). Answers ``{"status": "sleeping", "level": 1, "sleep_s", "resident_bytes":
  {"<gpu index>": bytes}, "resident_measured_by"}``: what the process still holds on its GPU once asleep
  (residency.py: torch's reserved memory and NVML's per-process figure on CUDA, the ledger's bytes for this pid on
  the stand-in GPU, ``{}`` on CPU), so a rollout can tell whether the next release fits beside the sleeper.
- ``POST /wake_up``: the weights back on the device, a new KV cache of the same size (the prefix cache starts
  empty), CUDA graphs captured again; ``{"status": "awake", "wake_s"}``. A wake that no longer fits on the GPU (a
  real CUDA OOM, or the fake GPU ledger of gpu_ledger.py full because another process took the memory) is 503
  ``gpu_memory_exhausted`` naming why; the process stays asleep and can be woken later or stopped.
- ``GET /is_sleeping``: ``{"is_sleeping": bool, "resident_bytes", "resident_measured_by"}`` (what it holds now).

While asleep the phase is ``sleeping``: /readyz 503 ``{"status": "sleeping"}``, inference and /v1/models 503 with
code ``sleeping``, /healthz 200 (the process is alive: nothing restarts it), the gauge
``deployctl_runtime_is_sleeping`` 1; the KV pool is reported released: /readyz's and /healthz's ``kv_cache`` has
``"released": true`` with its blocks, tokens, free blocks and usage 0, and the gauges
``deployctl_runtime_num_gpu_blocks`` and ``deployctl_runtime_num_free_blocks`` are 0 until the wake. Both calls are
idempotent (a second sleep or wake answers 200 at once) and serialised. Each logs its seconds.
"""
from __future__ import annotations

import asyncio
import logging
import time

from fastapi import FastAPI, Request

from .errors import APIError, invalid
from .residency import resident_bytes
from .state import ServerContext

log = logging.getLogger("deployctl_runtime.server")


def _exhausted(message: str) -> APIError:
    return APIError(503, message, "service_unavailable", None, "gpu_memory_exhausted", {"Retry-After": "10"})


def _resident(ctx: ServerContext) -> dict:
    held, measured_by = resident_bytes(ctx)
    return {"resident_bytes": held, "resident_measured_by": measured_by}


def add_sleep_routes(app: FastAPI, ctx: ServerContext) -> None:
    lock = asyncio.Lock()

    @app.post("/sleep")
    async def sleep(request: Request):
        level = request.query_params.get("level", "1")
        if level != "1":
            raise invalid(f"level {level!r} is not supported: this runtime sleeps at level 1 only (weights kept in "
                          "host memory, KV cache freed)", "level", "unsupported_parameter")
        async with lock:
            if ctx.phase == "sleeping":
                return {"status": "sleeping", "level": 1, "sleep_s": 0.0, **_resident(ctx)}
            ctx.check_serving()
            busy = max(ctx.inflight_http, ctx.inflight_seqs)
            if busy:
                raise APIError(409, f"{busy} request(s) in flight: a sleep would cut them; take the runtime out of "
                               "the router and retry once it is idle", "conflict_error", None, "requests_in_flight")
            ctx.phase, ctx.detail = "sleeping", "asleep: weights kept, KV cache freed (POST /wake_up)"
            t0 = time.monotonic()
            try:
                await ctx.engine.call(lambda e: e.sleep())
            except RuntimeError as exc:  # a request reached the engine meanwhile
                ctx.phase, ctx.detail = "ready", "serving"
                raise APIError(409, str(exc), "conflict_error", None, "requests_in_flight") from None
            if ctx.ledger is not None:
                ctx.ledger.set(ctx.ledger.residue_bytes, "sleeping residue", ctx.cfg.release_id or "")
            dt = time.monotonic() - t0
            ctx.metrics.is_sleeping.set(1)
            resident = _resident(ctx)
            log.info("sleep (level 1): KV cache freed%s in %.3f s; still resident: %s (%s)",
                     ", weights in pinned host memory" if ctx.cfg.device == "cuda" else "", dt,
                     resident["resident_bytes"] or "no device memory", resident["resident_measured_by"])
            return {"status": "sleeping", "level": 1, "sleep_s": round(dt, 4), **resident}

    @app.post("/wake_up")
    async def wake_up():
        async with lock:
            if ctx.phase != "sleeping":
                ctx.check_serving()
                return {"status": "awake", "wake_s": 0.0}
            t0 = time.monotonic()
            if ctx.faults.fail_wake:
                log.error("wake refused: fault injection: fail_wake")
                raise _exhausted("cannot wake: fault injection fail_wake (as if another process took the GPU memory); "
                                 "the runtime stays asleep")
            if ctx.ledger is not None:
                from deployctl_runtime.gpu_ledger import GpuMemoryExhausted

                try:
                    ctx.ledger.set(ctx.engine.engine.device_bytes(), "weights+kv", ctx.cfg.release_id or "")
                except GpuMemoryExhausted as exc:
                    log.error("wake refused: %s", exc)
                    raise _exhausted(f"cannot wake: {exc}; free GPU memory (stop the other process) or stop this "
                                     "one and start it cold") from None
            try:
                await ctx.engine.call(lambda e: e.wake_up())
            except Exception as exc:  # e.g. torch.cuda.OutOfMemoryError: back to a clean sleep, say why
                log.error("wake failed: %s: %s", type(exc).__name__, exc)

                def back_to_sleep(e):
                    e.runner.release_kv_cache()
                    e.runner.offload_weights()

                await ctx.engine.call(back_to_sleep)
                if ctx.ledger is not None:
                    ctx.ledger.set(ctx.ledger.residue_bytes, "sleeping residue", ctx.cfg.release_id or "")
                raise _exhausted(f"cannot wake: {type(exc).__name__}: {str(exc)[:300]}; the runtime stays asleep") \
                    from None
            ctx.phase, ctx.detail = "ready", "serving"
            dt = time.monotonic() - t0
            ctx.metrics.is_sleeping.set(0)
            log.info("wake: weights on %s, KV cache re-allocated (%d blocks, prefix cache empty) in %.3f s",
                     ctx.cfg.device, ctx.engine.engine.kv_plan.num_blocks, dt)
            return {"status": "awake", "wake_s": round(dt, 4)}

    @app.get("/is_sleeping")
    async def is_sleeping():
        return {"is_sleeping": ctx.phase == "sleeping", **_resident(ctx)}
