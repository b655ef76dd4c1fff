"""A trivial OpenAI-style streaming server for measuring the load generator itself: it answers every POST at
once with ``max_tokens`` SSE chunks, usage and ``data: [DONE]`` (HTTP/1.1 keep-alive, chunked encoding).

Run as ``python -m deployctl.bench.trivial_server``: it binds 127.0.0.1 on a free port, prints the port on
stdout, and serves until its stdin closes. Standard library only (it starts in a fraction of a second).
"""
from __future__ import annotations

import asyncio
import json
import sys

_CHUNK = json.dumps({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "x"}, "text": "x"}]})


def _http_chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Serve one keep-alive connection until the client closes it."""
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.decode("latin-1").split("\r\n"):
                if line.lower().startswith("content-length:"):
                    length = int(line.split(":", 1)[1])
            body = json.loads(await reader.readexactly(length)) if length else {}
            n = int(body.get("max_tokens", 16))
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
            for _ in range(n):
                writer.write(_http_chunk(f"data: {_CHUNK}\n\n".encode()))
                await writer.drain()
            usage = {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1}}
            writer.write(_http_chunk(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode()) + b"0\r\n\r\n")
            await writer.drain()
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError):
        pass
    finally:
        writer.close()


async def _main() -> None:
    server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=1024)
    print(server.sockets[0].getsockname()[1], flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)  # returns when the parent closes our stdin
    server.close()


if __name__ == "__main__":
    asyncio.run(_main())
