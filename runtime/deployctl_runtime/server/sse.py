"""Server-sent events response that stops (and so aborts generation) as soon as the client disconnects.

Starlette's StreamingResponse only notices a gone client on the next failed write under ASGI spec 2.4; this one
always listens for `http.disconnect` beside the writer and cancels the writer when it comes, then closes the body
iterator and calls `on_close` (always, even when the body never started) so the abort runs at once rather than
whenever the generator is garbage-collected.
"""
from __future__ import annotations

from typing import AsyncIterator, Awaitable, Callable

import anyio
from starlette.responses import Response

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class SSEResponse(Response):
    media_type = "text/event-stream"

    def __init__(self, body: AsyncIterator[bytes], headers: dict[str, str] | None = None,
                 on_close: Callable[[], Awaitable[None]] | None = None):
        self.body_iterator = body
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
                aclose = getattr(self.body_iterator, "aclose", None)
                if aclose is not None:
                    await aclose()
                if self.on_close is not None:
                    await self.on_close()
