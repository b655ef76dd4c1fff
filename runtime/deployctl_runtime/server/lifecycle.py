"""Start, load in the background, serve, drain on SIGTERM, exit.

Order (C10): uvicorn binds the port first, then a loader thread verifies the model directory (manifest.sha256),
builds the engine (weights, KV pool, one warm-up forward pass whose logits must be finite; the engine logs the KV
pool size in blocks and tokens and the max concurrency at max_model_len) and starts the step loop; only then does
the phase become `ready`. A load failure logs one clear line and ends the process with exit code 1.
An engine that dies while serving (a sticky device error, repeated requests failed alone: see async_engine.py)
makes the phase `failed` and ends the process with exit code 3 after its open requests were answered 500.

An engine loop that stops making progress while requests are open (no step completed for
--engine-stall-timeout-s: watchdog.py) makes /healthz, /health and /readyz 503 `engine_stalled`, its open requests
503 `engine_stalled`, and ends the process with exit code 4 (EXIT_ENGINE_STALLED).

SIGTERM/SIGINT: the phase becomes `draining` at once (/readyz 503, new requests 503), in-flight requests finish
up to --drain-timeout-s; what is left is then cut off (finish_reason "abort", streams still end with [DONE]; a
request of which nothing was generated yet, still queued, gets 503 `draining` instead, or a stream that error as its
last event, so that it is retried elsewhere: generation.Generation.result), and
the process exits 0 once the engine loop has let go of them. A drain that finds the engine loop wedged (the cut-off
requests not released and no step completed for DRAIN_WEDGED_S) exits 4 instead: it did not drain. A second signal
exits at once.

systemd (sd_notify.py): READY=1 once ready, STOPPING=1 when a drain begins, WATCHDOG=1 from the engine loop.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
import time

import uvicorn

from .state import ServerContext

log = logging.getLogger("deployctl_runtime.server")
EXIT_LOAD_FAILED = 1
EXIT_ENGINE_DEAD = 3  # the engine died while serving (not 2: launch.sh and RestartPreventExitStatus never restart 2)
EXIT_ENGINE_STALLED = 4  # the engine loop made no progress with requests open (watchdog.py), or a drain found it so
FATAL_EXIT_WATCHDOG_S = 10.0
STALL_LINGER_S = 2.0  # a stalled runtime answers 503 engine_stalled this long (so probes see why), then exits
STALL_EXIT_WATCHDOG_S = 7.0  # ... and is ended with os._exit this long after the watchdog tripped, at the latest
DRAIN_WEDGED_S = 5.0  # after a drain: the engine must release the cut-off requests, or show a step, within this


def load_engine(ctx: ServerContext, server: "DrainingServer") -> None:
    """Loader thread body. Sets ctx.phase to ready, or to failed and asks the server to exit 1."""
    cfg, faults = ctx.cfg, ctx.faults
    try:
        if faults.load_delay_s:
            ctx.detail = f"fault injection: load delayed {faults.load_delay_s:g} s"
            log.warning("fault injection: delaying load by %.1f s", faults.load_delay_s)
            time.sleep(faults.load_delay_s)
        if faults.fail_start:
            raise RuntimeError("fault injection: fail_start (DEPLOYCTL_RUNTIME_FAULT)")
        if not cfg.skip_verify:
            from .verify import verify_model_dir

            ctx.detail = "verifying model files against manifest.sha256"
            t0 = time.monotonic()
            n = verify_model_dir(cfg.model, log=log.warning)
            if n:
                log.info("verified %d model file(s) against manifest.sha256 in %.2f s", n, time.monotonic() - t0)
            else:
                log.warning("no manifest.sha256 in %s: model files not verified", cfg.model)
        else:
            log.warning("--skip-verify: model files are not verified")
        ctx.detail = "loading weights, allocating the KV cache, warm-up forward pass"
        from deployctl_runtime.engine import LLMEngine
        from deployctl_runtime.engine_args import EngineArgs

        from .async_engine import AsyncEngine
        from .chat_template import ChatTemplate

        engine = LLMEngine.from_engine_args(EngineArgs(**cfg.engine_args()), log=log.info)
        from deployctl_runtime.gpu_ledger import Ledger

        ledger = Ledger.from_env()
        if ledger is not None:  # the stand-in GPU: refuse a start that would not fit, as CUDA would
            ledger.set(engine.device_bytes(), "weights+kv", cfg.release_id or "")
            ctx.ledger = ledger
            log.info("fake GPU %s: holding %d bytes (weights + KV cache)", ledger.path, engine.device_bytes())
        faults.install(engine)
        from deployctl_runtime.tokenizer import TokenBytes

        ctx.tokenizer = engine.tokenizer
        ctx.token_bytes = TokenBytes(engine.tokenizer)
        ctx.bos_token_id = engine.bos_token_id
        ctx.device = device_facts(engine)
        ctx.vocab_size = engine.tokenizer.get_vocab_size(with_added_tokens=True)
        ctx.max_token_chars = max(map(len, engine.tokenizer.get_vocab(with_added_tokens=True)), default=1)
        ctx.model_name = engine.model_name
        ctx.max_model_len = engine.max_model_len
        ctx.chat_template = (ChatTemplate(engine.chat_template, engine.bos_token, engine.eos_token)
                             if engine.chat_template else None)
        engine.fatal_markers = engine.fatal_markers + tuple(cfg.fatal_error_marker)
        engine.max_step_retries_per_min = cfg.max_step_retries_per_min
        notifier = ctx.notifier
        aeng = AsyncEngine(engine, step_delay_s=faults.token_delay_ms / 1000.0,
                           on_fatal=lambda message: engine_died(ctx, server, message),
                           on_error=lambda kind: ctx.metrics.engine_errors.labels(kind=kind).inc(),
                           max_isolated_errors=cfg.fatal_after_errors,
                           isolated_error_window_s=cfg.fatal_error_window_s,
                           on_progress=notifier.ping if notifier.watchdog_s else None,
                           idle_wait_s=min(0.5, notifier.ping_interval_s or 0.5, cfg.engine_stall_timeout_s / 4 or 0.5))
        aeng.start()
        ctx.engine = aeng
        ctx.detail = "serving"
        ctx.phase = "ready"
        log.info("ready: serving model '%s' (max_model_len %d) in %.1f s", ctx.served_name, ctx.max_model_len,
                 time.monotonic() - ctx.started_at)
        notifier.send("READY=1")
        from .watchdog import EngineWatchdog

        EngineWatchdog(ctx, cfg.engine_stall_timeout_s, lambda message: engine_stalled(ctx, server, message)).start()
    except BaseException as exc:  # noqa: BLE001 - any load failure ends the process with a clear line
        ctx.phase, ctx.detail, ctx.exit_code = "failed", str(exc), 1
        log.error("failed to start: %s", exc)
        if os.environ.get("DEPLOYCTL_RUNTIME_DEBUG"):
            log.exception("load traceback")
        server.should_exit = True


def engine_died(ctx: ServerContext, server: "DrainingServer", message: str) -> None:
    """The engine loop is dead (its open requests were already failed): readyz says so, and the process exits
    EXIT_ENGINE_DEAD so that systemd (Restart=on-failure) or launch.sh restart it. uvicorn's graceful shutdown lets
    the failed answers go out; a watchdog ends the process should that shutdown hang."""
    ctx.phase, ctx.detail, ctx.exit_code = "failed", f"the engine died: {message}", EXIT_ENGINE_DEAD
    log.error("the engine died: %s; exiting %d so that the supervisor restarts the runtime", message,
              EXIT_ENGINE_DEAD)
    _exit_soon(server, EXIT_ENGINE_DEAD, FATAL_EXIT_WATCHDOG_S)


def engine_stalled(ctx: ServerContext, server: "DrainingServer", message: str) -> None:
    """The watchdog found the engine loop wedged (its open requests were already failed 503 engine_stalled): the
    health routes answer 503 engine_stalled for STALL_LINGER_S, then the process exits EXIT_ENGINE_STALLED (at the
    latest STALL_EXIT_WATCHDOG_S after this call). uvicorn stops accepting connections as soon as it shuts down,
    hence the linger: a probe or deployctl's check sees why rather than a refused connection."""
    ctx.phase, ctx.detail, ctx.exit_code = "failed", message, EXIT_ENGINE_STALLED
    log.error("exiting %d in %.0f s so that the supervisor restarts the runtime", EXIT_ENGINE_STALLED,
              STALL_LINGER_S)
    linger = threading.Timer(STALL_LINGER_S, _exit_soon, (server, EXIT_ENGINE_STALLED,
                                                         STALL_EXIT_WATCHDOG_S - STALL_LINGER_S))
    linger.daemon = True
    linger.start()


def _exit_soon(server: "DrainingServer", code: int, backstop_s: float) -> None:
    """Ask uvicorn to shut down (the answers already given go out); os._exit(code) should that hang."""
    server.should_exit = True
    timer = threading.Timer(backstop_s, os._exit, (code,))
    timer.daemon = True
    timer.start()


def device_facts(engine) -> dict:
    """device, device_name (the GPU's name on cuda, the CPU model on cpu), dtype and the KV pool's fixed sizes."""
    device = engine.args.device
    name = None
    if device == "cuda":
        import torch

        name = torch.cuda.get_device_name(engine.runner.device)
    else:
        import platform

        try:
            with open("/proc/cpuinfo", encoding="utf-8") as f:
                name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
        except OSError:
            pass
        name = name or platform.processor() or platform.machine()
    plan = engine.kv_plan
    return {"device": device, "device_name": name, "dtype": engine.dtype,
            "kv_cache": {"num_blocks": plan.num_blocks, "block_size": plan.block_size,
                         "num_tokens": plan.pool_tokens}}


class DrainingServer(uvicorn.Server):
    """uvicorn.Server whose first SIGTERM/SIGINT drains instead of closing the listener at once."""

    def __init__(self, config: uvicorn.Config, ctx: ServerContext):
        super().__init__(config)
        self.ctx = ctx
        self._loop: asyncio.AbstractEventLoop | None = None
        self._draining = False

    async def startup(self, sockets=None) -> None:
        self._loop = asyncio.get_running_loop()
        self.ctx.idle = asyncio.Event()
        if self.ctx.inflight_http == 0:
            self.ctx.idle.set()
        await super().startup(sockets)
        for listener in getattr(self, "servers", []):  # the bound port (--port 0 picks one): GET /identity
            for sock in listener.sockets or ():
                self.ctx.port = sock.getsockname()[1]
        if self.started:
            threading.Thread(target=load_engine, args=(self.ctx, self), name="loader", daemon=True).start()

    @contextlib.contextmanager
    def capture_signals(self):
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        sigs = (signal.SIGINT, signal.SIGTERM)
        original = {s: signal.signal(s, self.handle_exit) for s in sigs}
        try:
            yield
        finally:
            for s, h in original.items():
                signal.signal(s, h)

    def handle_exit(self, sig, frame) -> None:  # signal handler, main thread
        if self._draining or self._loop is None or self.ctx.phase != "ready":
            self.force_exit = self._draining
            self.should_exit = True
            return
        self._draining = True
        self.ctx.phase, self.ctx.detail = "draining", f"draining after {signal.Signals(sig).name}"
        log.info("%s received: draining (readyz 503, new requests 503), up to %.0f s for %d in-flight request(s)",
                 signal.Signals(sig).name, self.ctx.cfg.drain_timeout_s, self.ctx.inflight_http)
        self.ctx.notifier.send("STOPPING=1")
        self._loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self._drain()))

    async def _drain(self) -> None:
        ctx = self.ctx
        try:
            await asyncio.wait_for(ctx.idle.wait(), ctx.cfg.drain_timeout_s)
            log.info("drain complete: all in-flight requests finished")
        except asyncio.TimeoutError:
            log.warning("drain timeout (%.0f s): %d request(s) still in flight are cut off", ctx.cfg.drain_timeout_s,
                        ctx.inflight_http)
            from .generation import CUT_OFF

            for gen in list(ctx.generations):  # end them well-formed: finish_reason "abort", then [DONE]
                gen.queue.put_nowait(CUT_OFF)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(ctx.idle.wait(), 2.0)
        await self._check_engine_let_go()
        self.should_exit = True

    async def _check_engine_let_go(self) -> None:
        """A drain ends with the engine holding no request. Wait while the loop still works on some and completes
        steps; if it completes none for DRAIN_WEDGED_S, it is wedged: exit EXIT_ENGINE_STALLED, not 0."""
        ctx, engine = self.ctx, self.ctx.engine
        if engine is None or ctx.exit_code:
            return
        while engine.error is None and engine.has_open_requests:
            stall = engine.stall(DRAIN_WEDGED_S)
            if stall is not None:
                message = f"drain: {stall.message()}"
                log.error("%s; exiting %d: the drain did not complete", message, EXIT_ENGINE_STALLED)
                if engine.fail_stalled(message):
                    ctx.stall, ctx.exit_code = message, EXIT_ENGINE_STALLED
                return
            await asyncio.sleep(0.1)


def serve(ctx: ServerContext, api_keys: list[str]) -> int:
    """Run until drained or failed; return the process exit code."""
    from .app import create_app

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        yield
        if ctx.engine is not None:
            ctx.engine.shutdown()
        if ctx.ledger is not None:
            ctx.ledger.release()

    app = create_app(ctx, api_keys, lifespan=lifespan)
    config = uvicorn.Config(app, host=ctx.cfg.host, port=ctx.cfg.port, log_config=None, access_log=False,
                            timeout_graceful_shutdown=3, lifespan="on",
                            timeout_keep_alive=ctx.cfg.keep_alive_timeout_s)
    server = DrainingServer(config, ctx)
    server.run()
    if not server.started and ctx.exit_code == 0:
        return 1  # could not bind (uvicorn logged why)
    return ctx.exit_code
