"""A light stand-in for the bundled runtime, for fleet tests where the engine is not the point (TEST ONLY).

It answers what deployctl asks a runtime (deployctl.service.verify, rollout.analysis, rollout.golden, probes,
standby) and nothing more: ``/healthz``, ``/readyz`` (503 while draining or asleep), ``/health``, ``/metrics``
(the deployctl_runtime_* series the analysis reads), ``/v1/models``, ``/v1/completions`` and
``/v1/chat/completions`` (plain and ``stream: true`` SSE; 404 for a model other than its served name), ``/sleep?level=1``, ``/wake_up``, ``/is_sleeping``, ``/identity``;
the ``X-Deployctl-Release`` header on every answer; ``Authorization: Bearer`` checked against
DEPLOYCTL_RUNTIME_API_KEY like the runtime's auth.py, or with DEPLOYCTL_STANDIN_KEY_SCOPE=v1 under /v1 only while
every other path answers 200 (an engine like vLLM, whose --api-key covers /v1 and which serves many more routes). SIGTERM drains as the runtime does (503 for new requests,
in-flight ones finish, up to drain_timeout_s), then exit 0. Standard library plus PyYAML (runtime.yaml); starts
in tens of milliseconds.

Answers are deterministic words chosen by a hash of the prompt (same prompt, same answer, whatever the release), so
golden-output comparisons between two stand-in releases agree. Per-token delay: DEPLOYCTL_STANDIN_TOKEN_S (default
0.002 s) from the release's runtime.env; DEPLOYCTL_STANDIN_KV_POOL="blocks:block_size:bytes_per_token" logs the
bundled runtime's "KV cache: ..." line with those figures (a pool smaller or larger than the plan).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

P = "deployctl_runtime_"
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo",
         "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango")
log = logging.getLogger("deployctl_runtime.standin")


class Hist:
    def __init__(self, name: str, buckets: tuple):
        self.name, self.buckets = name, buckets
        self.counts = [0] * len(buckets)
        self.sum, self.count = 0.0, 0

    def observe(self, v: float) -> None:
        for i, b in enumerate(self.buckets):
            if v <= b:
                self.counts[i] += 1
        self.sum += v
        self.count += 1

    def text(self) -> str:
        lines = [f"# TYPE {self.name} histogram"]
        lines += [f'{self.name}_bucket{{le="{b}"}} {c}' for b, c in zip(self.buckets, self.counts)]
        lines += [f'{self.name}_bucket{{le="+Inf"}} {self.count}', f"{self.name}_sum {self.sum}",
                  f"{self.name}_count {self.count}"]
        return "\n".join(lines)


class State:
    def __init__(self, cfg: dict):
        self.cfg = cfg
        self.lock = threading.Lock()
        self.phase = "ready"  # ready | draining | sleeping
        self.running = 0
        self.success: dict[str, int] = {}
        self.hists = {k: Hist(P + n, b) for k, n, b in (
            ("ttft", "time_to_first_token_seconds", TTFT_BUCKETS), ("tpot", "time_per_output_token_seconds",
                                                                    TPOT_BUCKETS),
            ("itl", "inter_token_latency_seconds", TPOT_BUCKETS), ("e2e", "e2e_request_latency_seconds", E2E_BUCKETS),
            ("queue", "request_queue_time_seconds", TPOT_BUCKETS))}
        self.started = time.time()
        self.instance = uuid.uuid4().hex  # this start (GET /identity, X-Deployctl-Instance)
        self.port = 0  # the bound port, set once listening
        self.keys = [k.strip() for k in os.environ.get("DEPLOYCTL_RUNTIME_API_KEY", "").split(",") if k.strip()]
        self.token_s = float(os.environ.get("DEPLOYCTL_STANDIN_TOKEN_S", "0.002"))
        # "v1": the key guards /v1 routes only and every other path answers 200 (as vLLM's --api-key, whose
        # server has many open routes); default "all": every route but health, identity and metrics needs it
        self.key_scope = os.environ.get("DEPLOYCTL_STANDIN_KEY_SCOPE", "all")

    def metrics(self) -> str:
        with self.lock:
            out = [h.text() for h in self.hists.values()]
            out.append(f"# TYPE {P}request_success_total counter")
            out += [f'{P}request_success_total{{finish_reason="{r}"}} {n}' for r, n in sorted(self.success.items())]
            out.append(f"# TYPE {P}request_rejected_total counter")
            out.append(f'{P}request_rejected_total{{reason="draining"}} 0')
            out.append(f"{P}num_preemptions_total 0")
            out.append(f"{P}num_requests_running {self.running}")
            # DEPLOYCTL_STANDIN_WAITING / DEPLOYCTL_STANDIN_KV_USAGE: a fault that reports a long queue / a full KV
            # cache (autoscale tests); default: nothing waits, usage follows the requests running
            out.append(f"{P}num_requests_waiting {os.environ.get('DEPLOYCTL_STANDIN_WAITING', '0')}")
            mx = int(self.cfg.get("max_num_seqs") or 8)
            kv = os.environ.get("DEPLOYCTL_STANDIN_KV_USAGE") or min(1.0, self.running / max(1, mx)) * 0.5
            out.append(f"{P}kv_cache_usage_ratio {kv}")
            out.append(f"{P}is_sleeping {1 if self.phase == 'sleeping' else 0}")
            out.append(f"process_start_time_seconds {self.started}")
        return "\n".join(out) + "\n"


def answer_words(prompt: str, n: int) -> list[str]:
    """``n`` words picked by sha256 of the prompt (deterministic, not repetitive)."""
    digest = hashlib.sha256(prompt.encode()).digest()
    return [(" " if i else "") + WORDS[(digest[i % 32] + i) % len(WORDS)] for i in range(n)]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "deployctl-standin"
    st: State  # set on the class by serve()

    def log_message(self, fmt, *args):  # quiet: one line per request is the runtime's opt-in, not needed here
        pass

    # ------------------------------------------------------------------ plumbing
    def _headers(self, code: int, ctype: str, length=None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        rel = self.st.cfg.get("release_id")
        if rel:
            self.send_header("X-Deployctl-Release", str(rel))
        self.send_header("X-Deployctl-Instance", self.st.instance)
        self.send_header("X-Request-Id", self.headers.get("X-Request-Id") or uuid.uuid4().hex)
        if length is None:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Length", str(length))
        self.end_headers()

    def _json(self, code: int, doc) -> None:
        data = json.dumps(doc).encode()
        self._headers(code, "application/json", len(data))
        self.wfile.write(data)

    def _error(self, code: int, message: str, kind: str, err_code: str) -> None:
        self._json(code, {"error": {"message": message, "type": kind, "param": None, "code": err_code}})

    def _authorized(self) -> bool:
        if not self.st.keys or (self.st.key_scope == "v1" and not urlparse(self.path).path.startswith("/v1/")):
            return True
        got = self.headers.get("Authorization", "")
        if got.startswith("Bearer ") and got[7:] in self.st.keys:
            return True
        self._error(401, "missing or wrong API key", "authentication_error", "invalid_api_key")
        return False

    def _chunk(self, text: str) -> None:
        data = text.encode()
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    # ------------------------------------------------------------------ routes
    def do_GET(self):  # noqa: N802 - http.server's name
        st, path = self.st, urlparse(self.path).path
        if path == "/healthz":
            return self._json(200, {"status": "ok", "phase": st.phase, "device": st.cfg.get("device", "cpu")})
        if path in ("/readyz", "/health"):
            body = {"status": st.phase, "device": st.cfg.get("device", "cpu"), "device_name": "stand-in",
                    "dtype": st.cfg.get("dtype", "float32")}
            if st.cfg.get("release_id"):
                body["release"] = st.cfg["release_id"]
            return self._json(200 if st.phase == "ready" else 503, body)
        if path == "/identity":  # open, as the runtime's: who this process is
            return self._json(200, {"release": st.cfg.get("release_id"), "replica": int(st.cfg.get("replica_index") or 0),
                                    "instance": st.instance, "pid": os.getpid(), "port": st.port,
                                    "started_at": st.started, "phase": st.phase})
        if path == "/metrics":
            if not st.cfg.get("metrics_public") and not self._authorized():
                return
            data = st.metrics().encode()
            self._headers(200, "text/plain; version=0.0.4", len(data))
            return self.wfile.write(data)
        if not self._authorized():
            return
        if path == "/is_sleeping":
            return self._json(200, {"is_sleeping": st.phase == "sleeping"})
        if path == "/v1/models":
            if st.phase == "sleeping":
                return self._error(503, "asleep", "service_unavailable", "sleeping")
            return self._json(200, {"object": "list", "data": [
                {"id": st.cfg["served_name"], "object": "model", "created": int(st.started), "owned_by": "deployctl",
                 "max_model_len": int(st.cfg.get("max_model_len") or 256)}]})
        return self._unrouted(path)

    def _unrouted(self, path: str):
        if self.st.key_scope == "v1" and not path.startswith("/v1/"):  # an engine with many open routes
            return self._json(200, {"reached": self.path})
        return self._error(404, f"no route {path}", "not_found_error", "not_found")

    def do_POST(self):  # noqa: N802
        st, url = self.st, urlparse(self.path)
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        if not self._authorized():
            return
        if url.path == "/sleep":
            level = parse_qs(url.query).get("level", ["1"])[0]
            if level != "1":
                return self._error(400, f"level {level!r} is not supported", "invalid_request_error", "invalid_value")
            with st.lock:
                if st.phase == "ready":
                    st.phase = "sleeping"
            return self._json(200, {"status": "sleeping", "level": 1, "sleep_s": 0.0})
        if url.path == "/wake_up":
            with st.lock:
                if st.phase == "sleeping":
                    st.phase = "ready"
            return self._json(200, {"status": "awake", "wake_s": 0.0})
        if url.path not in ("/v1/completions", "/v1/chat/completions"):
            return self._unrouted(url.path)
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            return self._error(400, "the body is not JSON", "invalid_request_error", "invalid_json")
        asked = body.get("model")
        if asked and asked != st.cfg["served_name"]:  # as the runtime's app.py and every OpenAI server: by name
            return self._error(404, f"The model '{asked}' does not exist; this server serves "
                                    f"'{st.cfg['served_name']}'", "invalid_request_error", "model_not_found")
        with st.lock:
            if st.phase != "ready":
                code = "sleeping" if st.phase == "sleeping" else "draining"
                return self._error(503, f"the server is {st.phase}", "service_unavailable", code)
            st.running += 1
        try:
            self._generate(url.path.endswith("chat/completions"), body)
        finally:
            with st.lock:
                st.running -= 1

    def _generate(self, chat: bool, body: dict) -> None:
        st = self.st
        t0 = time.monotonic()
        if chat:
            prompt = "\n".join(str(m.get("content", "")) for m in body.get("messages") or [])
        else:
            prompt = str(body.get("prompt", ""))
        max_tokens = int(body.get("max_tokens") or 16)
        words = answer_words(prompt, min(max_tokens, 12))
        finish = "length" if len(words) >= max_tokens else "stop"
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:16]
        model = st.cfg["served_name"]
        obj = "chat.completion" if chat else "text_completion"
        usage = {"prompt_tokens": max(1, len(prompt.split())), "completion_tokens": len(words),
                 "total_tokens": max(1, len(prompt.split())) + len(words)}
        first = None
        if body.get("stream"):
            self._headers(200, "text/event-stream", None)
            for i, w in enumerate(words):
                time.sleep(st.token_s)
                first = first or time.monotonic()
                delta = {"index": 0, "finish_reason": finish if i == len(words) - 1 else None}
                delta.update({"delta": {"content": w, **({"role": "assistant"} if i == 0 else {})}} if chat
                             else {"text": w})
                self._chunk("data: " + json.dumps({"id": rid, "object": obj + ".chunk" if chat else obj,
                                                   "model": model, "choices": [delta]}) + "\n\n")
            if (body.get("stream_options") or {}).get("include_usage"):
                self._chunk("data: " + json.dumps({"id": rid, "object": obj, "model": model, "choices": [],
                                                   "usage": usage}) + "\n\n")
            self._chunk("data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
        else:
            for _ in words:
                time.sleep(st.token_s)
                first = first or time.monotonic()
            text = "".join(words)
            choice = {"index": 0, "finish_reason": finish, "logprobs": None}
            choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
            self._json(200, {"id": rid, "object": obj, "created": int(time.time()), "model": model,
                             "choices": [choice], "usage": usage})
        end = time.monotonic()
        first = first or end
        with st.lock:
            st.hists["ttft"].observe(first - t0)
            st.hists["e2e"].observe(end - t0)
            st.hists["queue"].observe(0.0)
            if len(words) > 1:
                st.hists["tpot"].observe((end - first) / (len(words) - 1))
                for _ in words[1:]:
                    st.hists["itl"].observe((end - first) / (len(words) - 1))
            st.success[finish] = st.success.get(finish, 0) + 1


def load_settings(argv: list[str]) -> dict:
    """runtime.yaml (``--config``) under the flags given (``--port`` from launch.sh's DEPLOYCTL_LAUNCH_PORT)."""
    import argparse

    import yaml

    p = argparse.ArgumentParser(prog="deployctl-runtime serve (stand-in)")
    p.add_argument("--config")
    p.add_argument("--port", type=int)
    p.add_argument("--host")
    p.add_argument("--model")
    p.add_argument("--release-id")
    args, _unknown = p.parse_known_args(argv)
    cfg: dict = {}
    if args.config:
        with open(args.config, encoding="utf-8") as f:
            cfg.update(yaml.safe_load(f) or {})
    cfg.update({k: v for k, v in vars(args).items() if v is not None and k != "config"})
    model = cfg.get("model")
    if not model or not os.path.isdir(model):
        print(f"deployctl-runtime serve: model directory {model} does not exist", file=sys.stderr)
        raise SystemExit(2)
    cfg["served_name"] = cfg.get("served_model_name") or os.path.basename(str(model).rstrip("/"))
    return cfg


def serve(argv: list[str]) -> int:
    """``serve --config runtime.yaml [--port N]``: bind, log the runtime's ready line, serve until SIGTERM, drain,
    exit 0."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = load_settings(argv)
    st = State(cfg)
    handler = type("BoundHandler", (Handler,), {"st": st})
    ThreadingHTTPServer.daemon_threads = True
    ThreadingHTTPServer.allow_reuse_address = True
    httpd = ThreadingHTTPServer((str(cfg.get("host") or "127.0.0.1"), int(cfg.get("port") or 8000)), handler)
    st.port = httpd.server_address[1]
    done = threading.Event()

    def on_term(signum, frame):
        with st.lock:
            st.phase = "draining"
        log.info("SIGTERM received: draining (readyz 503, new requests 503), up to %.0f s for %d in-flight "
                 "request(s)", float(cfg.get("drain_timeout_s") or 30), st.running)
        done.set()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    log.info("Uvicorn running on http://%s:%s (stand-in)", cfg.get("host") or "127.0.0.1", httpd.server_address[1])
    pool = os.environ.get("DEPLOYCTL_STANDIN_KV_POOL")  # "blocks:block_size:bytes_per_token": the runtime's KV line
    if pool:
        blocks, size, per_token = (int(x) for x in pool.split(":"))
        mml = int(cfg.get("max_model_len") or 256)
        # the format of runtime/deployctl_runtime/kv_sizing.py KVPlan.summary
        log.info("KV cache: %d blocks x %d tokens = %d tokens (%d bytes/token, %d bytes); max concurrency at "
                 "max_model_len %d: %.2fx", blocks, size, blocks * size, per_token, blocks * size * per_token, mml,
                 blocks * size / mml)
    log.info("ready: serving model '%s' (max_model_len %d) in 0.0 s (stand-in engine)", cfg["served_name"],
             int(cfg.get("max_model_len") or 256))
    done.wait()
    end = time.monotonic() + float(cfg.get("drain_timeout_s") or 30)
    while st.running and time.monotonic() < end:
        time.sleep(0.02)
    httpd.shutdown()
    httpd.server_close()
    log.info("drained: exiting")
    return 0
