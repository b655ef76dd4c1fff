"""The FastAPI app: routes, error handlers, middleware. See CONTRACTS.md "Runtime HTTP" for the contract."""
from __future__ import annotations

import asyncio
import logging
import time

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from .auth import APIKeyMiddleware
from .errors import APIError, error_body, invalid
from .generation import Generation
from .middleware import RequestContextMiddleware
from . import responses_api
from .responses import ResponseBuilder
from .responses_api import ResponseStore
from .responses_output import ResponsesBuilder, new_response_id
from .serving import RequestRecord, adopt_body_request_id, prepare
from .sse import SSEResponse
from .tokenize import detokenize_body, tokenize_body
from .state import RETRY_AFTER_LOADING_S, ServerContext

log = logging.getLogger("deployctl_runtime.server")


def create_app(ctx: ServerContext, api_keys: list[str], lifespan=None) -> FastAPI:
    # redirect_slashes off: a 307 to "/v1/completions" was built from the client's Host header (C27); the
    # outermost middleware answers "/v1/completions/" like its twin instead
    app = FastAPI(title="deployctl-runtime", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan,
                  redirect_slashes=False)
    app.state.ctx = ctx

    @app.exception_handler(APIError)
    async def _api_error(_req: Request, exc: APIError):
        if exc.status == 400 and exc.code == "context_length_exceeded":
            ctx.metrics.request_rejected.labels(reason="context_length_exceeded").inc()
        elif exc.status in (400, 404):
            ctx.metrics.request_rejected.labels(reason="invalid_request").inc()
        return JSONResponse(exc.body(), exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(req: Request, exc: RequestValidationError):
        err = exc.errors()[0]
        param = ".".join(str(p) for p in err["loc"] if p != "body") or None
        return await _api_error(req, invalid(f"'{param}': {err['msg']}", param))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_req: Request, exc: StarletteHTTPException):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse(error_body(str(exc.detail), kind, None, None), exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _internal(req: Request, exc: Exception):
        log.exception("internal error on %s", req.url.path)
        return JSONResponse(error_body(f"internal error: {type(exc).__name__}", "internal_error", None, None), 500)

    def _stalled():
        err = ctx.stalled_error()  # the engine loop is wedged (watchdog.py): every health route says so
        return None if err is None else JSONResponse(err.body(), err.status)

    @app.get("/identity")
    async def identity():
        # open like /healthz (auth.ALWAYS_OPEN), answered in every phase: loading, sleeping, draining, failed
        return ctx.identity()

    @app.get("/healthz")
    async def healthz():
        if (stalled := _stalled()) is not None:
            return stalled
        if ctx.engine is not None and not ctx.engine.is_alive:
            return JSONResponse({"status": "unhealthy", "detail": ctx.engine.error, **ctx.where()}, 503)
        return {"status": "ok", "phase": ctx.phase, **ctx.where()}

    @app.get("/health")
    async def health():
        # vLLM's: 200 (empty body) once the engine serves and while its loop is alive. vLLM binds its port only
        # after loading, so a probe or client copied from a vLLM deployment (guidellm's backend check) takes a 200
        # here to mean "ready": 503 while loading, as /v1/models says, and once the engine died.
        if (stalled := _stalled()) is not None:
            return stalled
        if ctx.engine is not None and not ctx.engine.is_alive:
            return JSONResponse(error_body(f"the engine loop is dead: {ctx.engine.error}", "service_unavailable",
                                           None, "engine_dead"), 503)
        if ctx.engine is None:
            return JSONResponse(error_body(f"the model is still loading ({ctx.detail})", "service_unavailable",
                                           None, "not_ready"), 503, headers={"Retry-After": str(RETRY_AFTER_LOADING_S)})
        return Response(status_code=200)

    @app.get("/readyz")
    async def readyz():
        if (stalled := _stalled()) is not None:
            return stalled
        body = ctx.readiness()
        if body["status"] == "ready":  # one source for the code and the body
            return body
        return JSONResponse(body, 503, headers={"Retry-After": str(RETRY_AFTER_LOADING_S)})

    @app.get("/metrics")
    async def metrics():
        return Response(ctx.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models():
        ctx.check_serving()
        return {"object": "list", "data": [_model_card(ctx)]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str):
        ctx.check_serving()
        if model_id != ctx.served_name:
            raise APIError(404, f"The model '{model_id}' does not exist; this server serves '{ctx.served_name}'",
                           "not_found_error", "model", "model_not_found")
        return _model_card(ctx)

    @app.post("/tokenize")
    async def tokenize(request: Request):
        ctx.check_serving()
        return tokenize_body(ctx, await request.body())

    @app.post("/detokenize")
    async def detokenize(request: Request):
        ctx.check_serving()
        return detokenize_body(ctx, await request.body())

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await _inference(ctx, request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await _inference(ctx, request, chat=True)

    store = ResponseStore()  # stored responses for previous_response_id (in memory, bounded)

    @app.post("/v1/responses")
    async def responses(request: Request):
        return await _responses(ctx, request, store)

    @app.get("/v1/responses/{response_id}")
    async def get_response(response_id: str):
        return store.response(response_id)

    @app.delete("/v1/responses/{response_id}")
    async def delete_response(response_id: str):
        return store.delete(response_id)

    from .sleep import add_sleep_routes

    add_sleep_routes(app, ctx)
    inner = APIKeyMiddleware(app, api_keys, ctx.cfg.metrics_public)
    return RequestContextMiddleware(inner, ctx.cfg.release_id, ctx.instance_id)  # type: ignore[return-value]


def _model_card(ctx: ServerContext) -> dict:
    created = int(time.time() - time.monotonic() + ctx.started_at)  # Unix time of start (started_at is monotonic)
    return {"id": ctx.served_name, "object": "model", "created": created, "owned_by": "deployctl",
            "max_model_len": ctx.max_model_len}


async def _wait_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _inference(ctx: ServerContext, request: Request, chat: bool):
    rec: RequestRecord = request.state.record
    _admit(ctx)
    prep = await prepare(ctx, await request.body(), chat, rec.request_id)
    adopt_body_request_id(rec, prep.request, chat)
    return await _serve(ctx, request, prep, rec, ResponseBuilder(prep, rec.request_id, ctx.served_name,
                                                                 ctx.token_bytes))


async def _responses(ctx: ServerContext, request: Request, store: ResponseStore):
    """POST /v1/responses: the Responses request as the chat request it means (responses_api.py), served by the
    same path, its answer shaped by responses_output.py; a completed response is stored when `store` is true."""
    rec: RequestRecord = request.state.record
    _admit(ctx)
    req = responses_api.parse(await request.body(), ctx.cfg.ignore_unknown_fields)
    conversation = responses_api.history(req, store) + responses_api.input_messages(req.input)
    body = responses_api.chat_body(req, conversation)
    try:
        prep = await prepare(ctx, responses_api.dumps(body), True, rec.request_id)
    except APIError as exc:
        raise responses_api.renamed(exc) from None
    response_id = new_response_id()

    def keep(done: dict) -> None:
        if req.store:
            store.put(response_id, conversation + responses_api.output_messages(done["output"]), done)

    return await _serve(ctx, request, prep, rec, ResponsesBuilder(req, prep, ctx.served_name, response_id, keep))


def _admit(ctx: ServerContext) -> None:
    ctx.check_serving()
    if ctx.faults.should_fail_request():
        raise APIError(500, "injected fault (DEPLOYCTL_RUNTIME_FAULT error_rate)", "internal_error", None,
                       "injected_fault")


async def _serve(ctx: ServerContext, request: Request, prep, rec: RequestRecord, builder):
    """Generate `prep` and answer with `builder`'s body (whole) or events (stream); the one home of the request's
    lifecycle: admission, the client going away (C07), errors, metrics."""
    if ctx.cfg.log_requests:
        log.info("request %s: prompt token ids %s params %s", rec.request_id, prep.prompts[0][:64], prep.params[0])
    gen = Generation(ctx, prep, rec)
    ctx.check_serving()  # again: a sleep or drain may have begun while the body was read (no await from here on)
    ctx.http_started()
    try:
        await gen.start()
    except BaseException:
        ctx.http_finished()
        raise
    if prep.request.stream:
        return _stream_response(ctx, gen, builder, rec)
    events = gen.events()
    consume = asyncio.ensure_future(_consume(events))
    watch = asyncio.ensure_future(_wait_disconnect(request))
    try:
        await asyncio.wait({consume, watch}, return_when=asyncio.FIRST_COMPLETED)
        if not consume.done():  # the client is gone: stop generating now (C07)
            rec.status_override = 499
            return Response(status_code=499)
        consume.result()
        gen.result()
        ctx.metrics.e2e.observe(time.monotonic() - rec.arrival)
        if ctx.cfg.log_requests:
            log.info("request %s: output %r", rec.request_id, [c.text for c in gen.choices])
        return JSONResponse(builder.full(gen.choices, rec))
    finally:  # also on cancellation: stop the consumer (which aborts what still runs), then close
        watch.cancel()
        if not consume.done():
            consume.cancel()
        await asyncio.gather(consume, watch, return_exceptions=True)
        await events.aclose()
        ctx.http_finished()


async def _consume(events) -> None:
    async for _ in events:
        pass


def _stream_response(ctx: ServerContext, gen: Generation, builder, rec: RequestRecord):
    events = gen.events()
    closed = False

    async def body():
        continuous = getattr(builder.prep.request, "continuous_usage", False)
        for chunk in builder.start():
            yield chunk
        async for batch in events:
            for chunk in builder.chunks(batch, rec if continuous else None):
                yield chunk
        error = None
        if gen.engine_error or gen.timed_out or gen.cut_before_start:
            try:
                gen.result()
            except APIError as exc:
                error = exc
        else:
            ctx.metrics.e2e.observe(time.monotonic() - rec.arrival)
        for chunk in builder.end(error, rec, gen.choices):
            yield chunk

    async def on_close() -> None:
        nonlocal closed
        if not closed:
            closed = True
            await events.aclose()
            ctx.http_finished()

    return SSEResponse(body(), on_close=on_close, keepalive_s=ctx.cfg.sse_keepalive_s)
