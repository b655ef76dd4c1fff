"""`deployctl-runtime serve`: argparse wiring (registered by deployctl_runtime/cli.py via add_serve_parser)."""
from __future__ import annotations

import argparse
import os
import logging
import sys

from .faults import HELP as FAULT_HELP

EPILOG = f"""\
Every flag can also be set in the YAML --config file under its name with underscores
(--max-model-len -> max_model_len); flags given on the command line win.
API keys: env DEPLOYCTL_RUNTIME_API_KEY (comma-separated) or --api-key-file PATH (one per line); never on the
command line. Binding a non-loopback --host without a key is refused. Every route except /healthz, /readyz,
/health and /identity needs 'Authorization: Bearer KEY' (/metrics too, unless --metrics-public).
GET /identity: {{release, replica, instance, pid, port, started_at, phase}}, in every phase; every response carries
X-Deployctl-Instance (an id made at each start) and, with --release-id, X-Deployctl-Release.
The port is bound first and the model loaded in the background: /healthz answers at once, /readyz and inference
answer 503 until weights are loaded, the KV cache allocated and a warm-up forward pass done.
Sleep mode (behind the key): POST /sleep?level=1, POST /wake_up, GET /is_sleeping; /sleep and /is_sleeping answer
resident_bytes {{"<gpu index>": bytes}} still held on the GPU; while asleep the KV pool is reported released.
SIGTERM drains: /readyz 503 at once, new requests 503, in-flight requests finish (up to --drain-timeout-s), exit 0.
Watchdog: with requests open and no engine step completed for --engine-stall-timeout-s, /healthz, /health and
/readyz answer 503 engine_stalled, open requests end 503 engine_stalled, and the process exits 4. Under systemd
(Type=notify, WatchdogSec=): READY=1 once serving, STOPPING=1 on a drain, WATCHDOG=1 from the engine loop.
Exit codes: 0 drained, 1 failed to start, 2 bad settings (never restarted), 3 the engine died while serving (a
poisoned device or repeated step errors; open requests were failed first; a supervisor restarts it), 4 the engine
loop stalled (the watchdog, or a drain that found it wedged; a supervisor restarts it).
{FAULT_HELP}
"""


def add_serve_parser(subparsers) -> argparse.ArgumentParser:
    """Add the `serve` subcommand to an argparse subparsers object; sets `func` to `run_serve`."""
    p = subparsers.add_parser(
        "serve", help="serve a model over an OpenAI-compatible HTTP API",
        description="Serve a model over an OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions).",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter, argument_default=argparse.SUPPRESS,
    )
    a = p.add_argument
    a("--model", help="HF-format checkpoint directory")
    a("--config", help="YAML file with serve settings (keys: flag names with underscores)")
    a("--host", help="address to bind (default 127.0.0.1)")
    a("--port", type=int, help="port to bind (default 8000; 0 picks a free one)")
    a("--served-model-name", help="model name clients send (default: the model directory's name)")
    a("--device", choices=["cpu", "cuda"], help="default cpu")
    a("--dtype", choices=["auto", "float32", "bfloat16", "float16"], help="default auto")
    a("--max-model-len", type=int, help="longest prompt + output in tokens")
    a("--max-num-seqs", type=int, help="most requests running at once (default 64)")
    a("--max-num-batched-tokens", type=int, help="token budget per engine step (default 2048)")
    a("--block-size", type=int, help="tokens per KV cache block (default 16)")
    a("--num-gpu-blocks-override", type=int, help="KV cache size in blocks (overrides the memory-based size)")
    a("--gpu-memory-utilization", type=float, help="share of GPU memory for weights + KV cache (default 0.9)")
    a("--kv-cache-memory", metavar="BYTES", help="KV pool budget on CPU, bytes or e.g. 512MiB")
    a("--enable-prefix-caching", action=argparse.BooleanOptionalAction, help="default on")
    a("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, help="default on")
    a("--enforce-eager", action=argparse.BooleanOptionalAction, help="CUDA: no decode CUDA graphs (default off)")
    a("--seed", type=int, help="engine seed (default 0)")
    a("--max-queued-requests", type=int, help="waiting requests beyond this get 429 + Retry-After (default 256)")
    a("--max-prompt-tokens", type=int, help="prompts longer than this get 400 (default: max_model_len - 1)")
    a("--max-completion-tokens", type=int,
      help="max_tokens above this gets 400; the default max_tokens when omitted (default: the remaining context)")
    a("--request-timeout-s", type=float, help="end a request with an error finish after this (default 600)")
    a("--drain-timeout-s", type=float, help="on SIGTERM, wait this long for in-flight requests (default 30)")
    a("--sse-keepalive-s", type=float, help="SSE comment after this many idle seconds in a stream (default 15; 0 off)")
    a("--keep-alive-timeout-s", type=float, help="close idle HTTP connections after this (default 75)")
    a("--api-key-file", help="file with API keys, one per line")
    a("--metrics-public", action=argparse.BooleanOptionalAction, help="serve /metrics without a key")
    a("--release-id", help="release id: header X-Deployctl-Release on every response, and in /readyz")
    a("--replica-index", type=int, metavar="N", help="this process's replica index within its release, in GET "
      "/identity (default 0)")
    a("--engine-stall-timeout-s", type=float, metavar="S",
      help="with requests open and no engine step completed for S seconds: /healthz and /readyz 503 engine_stalled, "
           "open requests failed, exit 4 (default 120; 0 off)")
    a("--skip-verify", action=argparse.BooleanOptionalAction, help="start even if manifest.sha256 does not match")
    a("--log-requests", action=argparse.BooleanOptionalAction, help="log prompts and outputs (off by default)")
    a("--log-level", choices=["debug", "info", "warning", "error"], help="default info")
    a("--log-file", help="also write the log to this file, rotated by size (stderr keeps it all too)")
    a("--log-max-bytes", metavar="BYTES", help="rotate the log file at this size, bytes or e.g. 100MiB (default)")
    a("--log-backup-count", type=int, help="rotated log files kept, runtime.log.1 newest (default 5)")
    a("--ignore-unknown-fields", action=argparse.BooleanOptionalAction,
      help="ignore request fields this server does not know, with a warning (vLLM's behaviour); default: 400")
    a("--fatal-error-marker", action="append", metavar="TEXT",
      help="a step exception whose message holds TEXT poisons the device: fail open requests, exit 3 (repeatable; "
           "CUDA errors always do)")
    a("--fatal-after-errors", type=int, metavar="K",
      help="exit 3 when K requests failed alone within --fatal-error-window-s (default 10; 0 never)")
    a("--fatal-error-window-s", type=float, help="the window of --fatal-after-errors (default 60)")
    a("--max-step-retries-per-min", type=int, metavar="N",
      help="extra forward passes failed engine steps may run per minute to isolate the request at fault (at most "
           "ceil(log2 n) + 1 per failed step of n; default 64; beyond it a failed step's unresolved requests fail)")
    p.set_defaults(func=run_serve)
    return p


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def _setup_logging(cfg) -> None:
    """stderr always; with log_file also a size-rotated file (log_max_bytes, log_backup_count files kept)."""
    level = cfg.log_level
    logging.basicConfig(level=level.upper(), stream=sys.stderr, format=LOG_FORMAT)
    if cfg.log_file:
        from logging.handlers import RotatingFileHandler

        os.makedirs(os.path.dirname(os.path.abspath(cfg.log_file)), exist_ok=True)
        handler = RotatingFileHandler(cfg.log_file, maxBytes=cfg.log_max_bytes, backupCount=cfg.log_backup_count,
                                      encoding="utf-8")
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        logging.getLogger().addHandler(handler)
    logging.getLogger("uvicorn.error").setLevel(max(logging.INFO, logging.getLevelName(level.upper())))


def run_serve(args: argparse.Namespace) -> int:
    """Entry point of `serve`. Returns the exit code: 0 after a drain, 1 on a failed start, 2 on bad settings, 3 when
    the engine died while serving, 4 when the engine loop stalled (watchdog.py)."""
    from .auth import is_loopback, load_api_keys
    from .config import load_config
    from .faults import Faults

    values = {k: v for k, v in vars(args).items() if k not in ("func", "config", "command")}
    try:
        cfg = load_config(values, getattr(args, "config", None))
        keys = load_api_keys(key_file=cfg.api_key_file)
        faults = Faults.from_env()
    except ValueError as exc:
        print(f"deployctl-runtime serve: {exc}", file=sys.stderr)
        return 2
    if not os.path.isfile(os.path.join(cfg.model, "config.json")):  # a configuration error (exit 2: never
        # restarted, every retry would fail the same way), not a failed load
        what = ("has no config.json: it is not a checkpoint" if os.path.isdir(cfg.model) else
                "is not a directory" if os.path.exists(cfg.model) else "does not exist")
        print(f"deployctl-runtime serve: model directory {cfg.model} {what}; pass --model DIR (an HF-format "
              "checkpoint directory)", file=sys.stderr)
        return 2
    try:
        _setup_logging(cfg)
    except OSError as exc:
        print(f"deployctl-runtime serve: log_file {cfg.log_file}: cannot open it ({exc.strerror})", file=sys.stderr)
        return 2
    log = logging.getLogger("deployctl_runtime.server")
    if not keys and not is_loopback(cfg.host):
        log.error("refusing to bind %s without an API key: set env DEPLOYCTL_RUNTIME_API_KEY or --api-key-file, "
                  "or bind 127.0.0.1", cfg.host)
        return 2
    if faults.active:
        log.warning("fault injection active (test only): %s", faults)
    if not keys:
        log.warning("no API key configured: every route is open (loopback only)")
    from .lifecycle import serve
    from .state import ServerContext

    from .gpu_metrics import open_visible_gpus

    ctx = ServerContext(cfg, faults)
    gpus, covered = open_visible_gpus()
    if gpus is not None:
        ctx.metrics.add_collector(gpus)
        log.info("GPU metrics from NVML for %s", covered)
    else:
        log.info("no GPU metrics: %s", covered)
    rc = serve(ctx, keys)
    # Drained and shut down: leave now. Interpreter teardown (torch, the engine and loader threads) took
    # another 5-6 s after "Finished server process", which a rollback spends waiting on a restart.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)

