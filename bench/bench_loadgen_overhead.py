"""The bench's load generator (httpx client, SSE parsing, timing) against a bare-minimum baseline client.

Both drive the same trivial streaming server (deployctl.bench.trivial_server, a child process that answers at
once), so what is measured is the client's own cost. The baseline is raw asyncio streams speaking HTTP/1.1
with keep-alive, splitting lines and nothing more: the floor for a Python client. Prints per-chunk cost and
unloaded TTFT for both, and the ratios (ours / baseline). A ratio near 1 means the generator adds little beyond
what any Python client must pay; the absolute capacity (chunks/s) is what `deployctl bench` compares a level's
token rate with.

    python bench/bench_loadgen_overhead.py [--concurrency 32] [--tokens 32] [--rounds 3]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from deployctl.bench.overhead import TrivialServer, _burst  # noqa: E402


async def _raw_one(reader, writer, host: str, tokens: int) -> tuple[float, int]:
    body = json.dumps({"model": "t", "messages": [{"role": "user", "content": "x"}], "max_tokens": tokens,
                       "stream": True}).encode()
    start = time.perf_counter()
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: " + host.encode() + b"\r\ncontent-type: "
                 b"application/json\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    await writer.drain()
    await reader.readuntil(b"\r\n\r\n")
    ttft, chunks = None, 0
    while True:
        size = int((await reader.readline()).strip(), 16)
        if size == 0:
            await reader.readline()
            break
        data = await reader.readexactly(size + 2)
        for line in data.split(b"\n"):
            if line.startswith(b"data: {") and b'"content"' in line:
                chunks += 1
                if ttft is None:
                    ttft = time.perf_counter() - start
    return ttft or 0.0, chunks


async def _raw_burst(port: int, concurrency: int, num: int, tokens: int) -> tuple[list[float], int, float]:
    conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(concurrency)]
    queue: asyncio.Queue = asyncio.Queue()
    for _ in range(num):
        queue.put_nowait(None)
    ttfts: list[float] = []
    total = 0

    async def worker(reader, writer):
        nonlocal total
        while not queue.empty():
            queue.get_nowait()
            ttft, n = await _raw_one(reader, writer, f"127.0.0.1:{port}", tokens)
            ttfts.append(ttft)
            total += n

    start = time.perf_counter()
    await asyncio.gather(*(worker(r, w) for r, w in conns))
    wall = time.perf_counter() - start
    for _, w in conns:
        w.close()
    return ttfts, total, wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    n = max(64, 4 * args.concurrency)
    ours_cost, base_cost, ours_ttft, base_ttft = [], [], [], []
    with TrivialServer() as srv:
        port = int(srv.url.rsplit(":", 1)[1])
        for _ in range(args.rounds):
            res, wall = asyncio.run(_burst(srv.url, args.concurrency, n, args.tokens))
            ours_cost.append(wall / sum(len(r.itl) + 1 for r in res if r.ok) * 1e3)
            res1, _ = asyncio.run(_burst(srv.url, 1, 32, args.tokens))
            ours_ttft.append(statistics.median(r.ttft for r in res1 if r.ok) * 1e3)
            _, chunks, wall = asyncio.run(_raw_burst(port, args.concurrency, n, args.tokens))
            base_cost.append(wall / chunks * 1e3)
            t1, _, _ = asyncio.run(_raw_burst(port, 1, 32, args.tokens))
            base_ttft.append(statistics.median(t1) * 1e3)
    oc, bc = statistics.median(ours_cost), statistics.median(base_cost)
    ot, bt = statistics.median(ours_ttft), statistics.median(base_ttft)
    print(f"concurrency {args.concurrency}, {args.tokens} chunks per request, {n} requests, {args.rounds} rounds")
    print(f"per-chunk cost   ours {oc:.4f} ms  baseline {bc:.4f} ms  ratio {oc / bc:.2f}  "
          f"(ours: {1e3 / oc:.0f} chunks/s)")
    print(f"unloaded TTFT    ours {ot:.3f} ms  baseline {bt:.3f} ms  ratio {ot / bt:.2f}")


if __name__ == "__main__":
    main()
