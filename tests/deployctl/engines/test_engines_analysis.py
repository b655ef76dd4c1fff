"""Canary analysis across engines: a stable that returns token ids and logprobs (the bundled runtime, vLLM) against
a canary that returns text only (transformers serve refuses the extras with 422) is compared on text pieces: the
same greedy text passes, a different one fails. And the probes' client takes transformers serve's stream ending
(the finish_reason chunk, no ``data: [DONE]``) as complete."""
from __future__ import annotations

import asyncio
import http.server
import threading

from deployctl.bench.client import Target, make_client, send
from deployctl.bench.workload import BenchRequest
from deployctl.engines import adapter
from deployctl.rollout.golden import Answer, Prompt, text_pieces
from deployctl.rollout.outputcheck import Rules, compare

PROMPTS = [Prompt(str(i), prompt=f"question {i}") for i in range(1, 4)]


def _token_level(tokens):
    return Answer(text="".join(tokens), tokens=list(tokens), token_ids=list(range(len(tokens))),
                  finish_reason="length", completion_tokens=len(tokens), level="token")


def _text_level(text):
    return Answer(text=text, tokens=text_pieces(text), finish_reason="length", completion_tokens=4, level="text")


def test_token_level_stable_vs_text_level_canary_compares_text():
    stable = [_token_level(["cy", "с", "\x91", "yone", f" {i}"]) for i in range(3)]
    same = [_text_level(a.text) for a in stable]
    rep = compare(PROMPTS, stable, same, Rules("exact", "engine switch"))
    assert rep.result == "pass" and rep.identical == 3 and rep.level == "text", rep.reason
    other = [_text_level("something else entirely") for _ in stable]
    rep = compare(PROMPTS, stable, other, Rules("exact", "engine switch"))
    assert rep.result == "fail" and rep.identical == 0


BODY = (b'data: {"choices":[{"delta":{"content":"hi"},"index":0}]}\n\n'
        b'data: {"choices":[{"delta":{},"index":0,"finish_reason":"length"}],'
        b'"usage":{"completion_tokens":1,"prompt_tokens":3}}\n\n')  # transformers serve's ending: no [DONE]


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("content-length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)

    def log_message(self, *args):
        pass


def _send(url: str):
    async def go():
        async with make_client(2, 10) as client:
            return await send(client, Target(url, model="m"),
                              BenchRequest(prompt="hello", messages=None, max_tokens=1), 10)
    return asyncio.run(go())


def test_stream_ending_without_done_like_transformers_is_complete():
    assert adapter("transformers").sse_done is False and adapter("vllm").sse_done is True
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        res = _send(url)
    finally:
        server.shutdown()
    assert res.error is None and res.ttft is not None and res.output_tokens == 1 and res.no_done
