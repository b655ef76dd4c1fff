"""Server-sent events response that stops (and so aborts generation) as soon as the client disconnects.

Starlette's StreamingResponse only notices a gone client on the next failed write under ASGI spec 2.4; this one
always listens for `http.disconnect` beside the writer and cancels the writer when it comes, then closes the body
iterator and calls `on_close` (always, even when the body never started) so the abort runs at once rather than
whenever the generator is garbage-collected.

Keep-alive: with ``keepalive_s`` > 0, a comment line ``: keep-alive`` goes out whenever that many seconds pass
without an event (a request waiting in the queue or in a long prefill), so a proxy's read timeout (nginx
``proxy_read_timeout``) does not cut a live stream. SSE clients ignore lines starting with ``:`` (WHATWG HTML,
"Server-sent events", event stream interpretation; the openai client's SSE decoder does the same).
"""
from __future__ import annotations

import asyncio
from typing import AsyncIterator, Awaitable, Callable

import anyio
from starlette.responses import Response

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
KEEPALIVE = b": keep-alive\n\n"


async def with_keepalive(body: AsyncIterator[bytes], interval_s: float) -> AsyncIterator[bytes]:
    """``body``'s chunks, with KEEPALIVE yielded after every ``interval_s`` seconds without one. The next chunk is
    awaited in one task across keep-alives (never cancelled by the wait), and that task is cancelled when the
    consumer stops early (client gone)."""
    it = body.__aiter__()
    pending: asyncio.Future | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(it.__anext__())
            done, _ = await asyncio.wait({pending}, timeout=interval_s)
            if not done:
                yield KEEPALIVE
                continue
            nxt, pending = pending, None
            try:
                chunk = nxt.result()
            except StopAsyncIteration:
                return
            yield chunk
    finally:
        if pending is not None and not pending.done():
            pending.cancel()
            await asyncio.gather(pending, return_exceptions=True)


class SSEResponse(Response):
    media_type = "text/event-stream"

    def __init__(self, body: AsyncIterator[bytes], headers: dict[str, str] | None = None,
                 on_close: Callable[[], Awaitable[None]] | None = None, keepalive_s: float = 0.0):
        self.source = body  # closed at the end (the keep-alive wrapper does not own it)
        self.body_iterator = with_keepalive(body, keepalive_s) if keepalive_s > 0 else body
        self.on_close = on_close
        self.status_code = 200
        self.background = None
        self.init_headers({**SSE_HEADERS, **(headers or {})})

    async def __call__(self, scope, receive, send) -> None:
        async def write() -> None:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            async for chunk in self.body_iterator:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        async def listen(cancel: anyio.CancelScope) -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            cancel.cancel()

        try:
            async with anyio.create_task_group() as tg:
                async def writer() -> None:
                    try:
                        await write()
                    except OSError:
                        pass  # the client went away mid-write
                    tg.cancel_scope.cancel()

                tg.start_soon(writer)
                await listen(tg.cancel_scope)
        finally:
            with anyio.CancelScope(shield=True):
                for it in {id(x): x for x in (self.body_iterator, self.source)}.values():
                    aclose = getattr(it, "aclose", None)
                    if aclose is not None:
                        await aclose()
                if self.on_close is not None:
                    await self.on_close()
