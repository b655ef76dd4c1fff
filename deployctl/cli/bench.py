"""`deployctl bench`: the load ladder and the knee (deployctl.bench does the work; this module shows it)."""
from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Optional

import typer

from deployctl.cli._app import app, err_console, print_json
from deployctl.errors import CheckFailed, UsageError

DEFAULT_KEY_ENVS = ("DEPLOYCTL_API_KEY", "OPENAI_API_KEY")


_FD_MARGIN = 64  # files the process holds besides the connections (stdio, event loop, plot, dataset)


def _open_file_limit() -> Optional[int]:
    """RLIMIT_NOFILE's soft limit, or None when unlimited or unknown."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return None
    return None if soft == resource.RLIM_INFINITY else soft


def _concurrencies(text: str) -> tuple[int, ...]:
    try:
        values = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        values = []
    if not values or values[0] < 1:
        raise UsageError(f"--concurrency {text!r} is not a list of positive integers", fix="e.g. --concurrency 1,4,8,16,32")
    fds = _open_file_limit()
    if fds is not None and values[-1] + _FD_MARGIN > fds:
        raise UsageError(f"--concurrency {values[-1]} needs that many open connections; this process may open {fds} "
                         "files", fix=f"use at most {max(1, fds - _FD_MARGIN)} or raise `ulimit -n`")
    return tuple(values)


def _check_url(url: str, flag: str = "--url") -> None:
    """An http(s) URL with a host and a port in 1..65535, else UsageError (exit 2) naming ``flag``."""
    from urllib.parse import urlsplit

    fix = f"e.g. {flag} http://127.0.0.1:8000" + ("/metrics" if flag == "--metrics-url" else "")
    if not url.startswith(("http://", "https://")):
        raise UsageError(f"{flag} {url!r} is not an http(s) URL", fix=fix)
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError as exc:
        raise UsageError(f"{flag} {url!r} is not a valid URL ({exc})", fix=fix) from None
    if not parts.hostname:
        raise UsageError(f"{flag} {url!r} has no host", fix=fix)
    if port == 0:
        raise UsageError(f"{flag} {url!r}: port 0 cannot be connected to", fix=fix)


def _api_key(env_name: Optional[str]) -> Optional[str]:
    from deployctl import settings

    if env_name:
        key = settings.secret(env_name)
        if not key:
            raise UsageError(f"--api-key-env {env_name}: that environment variable is not set", fix=f"export {env_name}=...")
        return key
    return next((settings.secret(n) for n in DEFAULT_KEY_ENVS if settings.secret(n)), None)


def _positive(name: str, value: Optional[float]) -> None:
    if value is not None and not (value > 0 and math.isfinite(value)):
        raise UsageError(f"{name} {value} must be a positive finite number", fix=f"pass {name} > 0 or leave it out")


def _fmt(d: dict, q: str) -> str:
    v = d.get(q)
    return "-" if v is None else f"{v:.1f}"


def _table(report) -> None:
    from rich.table import Table

    t = Table(title="deployctl bench", title_justify="left")
    for col in ("conc", "ok", "err", "req/s", "out tok/s", "TTFT p50/p90/p99 ms", "TPOT p50/p99 ms",
                "ITL p50/p99 ms", "E2E p50/p99 ms", "goodput", "errors"):
        t.add_column(col, justify="left" if col == "errors" else "right")
    for s in report.levels:
        mark = " *" if s.concurrency == report.knee.concurrency else ""
        t.add_row(
            f"{s.concurrency}{mark}", str(s.num_ok), str(s.num_errors), f"{s.requests_per_s:.2f}",
            f"{s.output_tokens_per_s:.1f}",
            "/".join(_fmt(s.ttft_ms, q) for q in ("p50", "p90", "p99")),
            "/".join(_fmt(s.tpot_ms, q) for q in ("p50", "p99")),
            "/".join(_fmt(s.itl_ms, q) for q in ("p50", "p99")),
            "/".join(_fmt(s.e2e_ms, q) for q in ("p50", "p99")),
            f"{s.goodput['ratio']:.0%}" if s.goodput else "-",
            ", ".join(f"{k}: {v}" for k, v in s.errors.items()) or "-",
        )
    if not err_console.is_terminal:
        err_console.width = max(err_console.width, 180)  # a log file: do not fold the table
    err_console.print(t)
    for s in report.levels:
        if s.server and "error" in s.server:
            err_console.print(f"server metrics at concurrency {s.concurrency}: {s.server['error']}")
        elif s.server:
            parts = []
            for key, label in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("e2e_ms", "E2E")):
                h = s.server.get(key)
                if h:
                    parts.append(f"{label} P50/P99 {_fmt(h, 'p50')}/{_fmt(h, 'p99')} ms (n={h['count']})")
            err_console.print(f"server histograms at concurrency {s.concurrency}: " + ", ".join(parts))
        if s.errors:
            err_console.print(f"errors at concurrency {s.concurrency}: "
                              + ", ".join(f"{k}: {v} ({s.error_examples.get(k, '')[:80]})" for k, v in s.errors.items()))
    k = report.knee
    if k.concurrency is None:
        err_console.print(f"knee: none, even the first level broke the limits ({k.reason})")
    else:
        ttft = "-" if k.ttft_p99_limit_ms is None else f"{k.ttft_p99_limit_ms:.1f}"
        tpot = "-" if k.tpot_p99_limit_ms is None else f"{k.tpot_p99_limit_ms:.2f}"  # None: one-token outputs
        limits = f"P99 TTFT <= {ttft} ms, P99 TPOT <= {tpot} ms ({k.criterion})"
        err_console.print(
            f"knee: concurrency {k.concurrency} ({limits}); {k.reason}\n"
            f"recommended: max_num_seqs {k.recommended_max_num_seqs}, rate limit {k.rate_limit_rps} requests/s "
            f"({k.headroom:.0%} of the knee's throughput)"
        )
    o = report.overhead
    if o is not None:
        err_console.print(
            f"load generator (against a trivial local server): adds TTFT P50 {o.unloaded_ttft_p50_ms} ms "
            f"P99 {o.unloaded_ttft_p99_ms} ms, ITL P50 {o.unloaded_itl_p50_ms} ms; takes in up to "
            f"{o.capacity_chunks_per_s:.0f} chunks/s at concurrency {o.concurrency} ({o.per_chunk_ms} ms per chunk)"
        )
    for w in report.warnings:
        err_console.print(f"[yellow]warning:[/] {w}", markup=True)


@app.command("bench")
def bench(
    url: str = typer.Option(..., "--url", help="Base URL of an OpenAI-compatible server, e.g. http://127.0.0.1:8000"),
    concurrency: str = typer.Option("1,4,8,16,32", "--concurrency", help="Comma-separated ladder of concurrencies (run in increasing order)."),
    requests: int = typer.Option(64, "--requests", help="Requests per level (at least the level's concurrency)."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON document on stdout."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Write latency and throughput against concurrency to FILE.png."),
    route: str = typer.Option("chat", "--route", help="chat (/v1/chat/completions) or completions (/v1/completions)."),
    model: Optional[str] = typer.Option(None, "--model", help="Model name (default: the first of GET /v1/models)."),
    dataset: Optional[Path] = typer.Option(None, "--dataset", help="JSONL requests: {\"prompt\"|\"messages\", \"max_tokens\"}."),
    input_len: str = typer.Option("128", "--input-len", help="Synthetic prompt words: N, LO-HI, normal:MEAN,STD, lognormal:MEDIAN,SIGMA."),
    output_len: str = typer.Option("128", "--output-len", help="max_tokens per request (same forms as --input-len)."),
    seed: int = typer.Option(0, "--seed", help="Seed for synthetic lengths, dataset order and Poisson arrivals."),
    rate: Optional[float] = typer.Option(None, "--rate", help="Poisson arrivals at this many requests/s (capped at the level's concurrency)."),
    ttft_slo_ms: Optional[float] = typer.Option(None, "--ttft-slo-ms", help="P99 TTFT objective (ms) for the knee and goodput."),
    tpot_slo_ms: Optional[float] = typer.Option(None, "--tpot-slo-ms", help="P99 TPOT objective (ms) for the knee and goodput."),
    e2e_slo_ms: Optional[float] = typer.Option(None, "--e2e-slo-ms", help="End-to-end objective (ms) for goodput."),
    timeout: float = typer.Option(60.0, "--timeout", help="Seconds per request, whole stream included."),
    max_level_seconds: Optional[float] = typer.Option(None, "--max-level-seconds", help="Send no new request after this long in a level."),
    api_key_env: Optional[str] = typer.Option(None, "--api-key-env", help="Env var holding the API key (default DEPLOYCTL_API_KEY, then OPENAI_API_KEY)."),
    metrics_url: Optional[str] = typer.Option(None, "--metrics-url", help="Scrape this /metrics before and after each level and report the server's histograms."),
    metrics_prefix: str = typer.Option("deployctl_runtime_", "--metrics-prefix", help="Metric name prefix (vLLM: 'vllm:')."),
    ignore_eos: bool = typer.Option(False, "--ignore-eos", help="Send ignore_eos: true (vLLM extension) so outputs reach max_tokens."),
    max_error_rate: float = typer.Option(0.01, "--max-error-rate", help="A level with a larger error share (0-1) is past the knee."),
    loadgen_check: bool = typer.Option(True, "--loadgen-check/--no-loadgen-check", help="Measure the generator's own overhead first."),
) -> None:
    """Load ladder: TTFT, TPOT, ITL and E2E percentiles per concurrency, errors per reason, and the knee."""
    from deployctl.bench import workload
    from deployctl.bench.client import ROUTES, Target, normalize_base_url
    from deployctl.bench.ladder import POOL_MAX, LadderConfig
    from deployctl.bench.report import detect_model
    from deployctl.bench.stats import Objectives

    _check_url(url)
    if metrics_url is not None:
        _check_url(metrics_url, "--metrics-url")
    if route not in ROUTES:
        raise UsageError(f"--route {route!r} is not a route", fix="use --route chat or --route completions")
    if requests < 1:
        raise UsageError(f"--requests {requests} must be at least 1", fix="e.g. --requests 64")
    for name, value in (("--rate", rate), ("--timeout", timeout), ("--ttft-slo-ms", ttft_slo_ms),
                        ("--tpot-slo-ms", tpot_slo_ms), ("--e2e-slo-ms", e2e_slo_ms),
                        ("--max-level-seconds", max_level_seconds)):
        _positive(name, value)
    if plot is not None and (plot.suffix.lower() != ".png" or plot.is_dir()):
        raise UsageError(f"--plot {plot} is not a .png file name", fix="e.g. --plot bench.png")
    if plot is not None and not plot.resolve().parent.is_dir():
        raise UsageError(f"--plot {plot}: directory {plot.resolve().parent} does not exist", fix="create it or pick another path")
    if not 0 <= max_error_rate < 1:
        raise UsageError(f"--max-error-rate {max_error_rate} is not a fraction", fix="e.g. --max-error-rate 0.01 (1%)")
    levels = _concurrencies(concurrency)
    key = _api_key(api_key_env)
    base = normalize_base_url(url)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if model is None:
        model = detect_model(base, headers)
        if model is None:
            err_console.print(f"[yellow]warning:[/] no model from {base}/v1/models; sending requests without 'model'",
                              markup=True)
    cfg = LadderConfig(
        target=Target(base_url=base, route=route, model=model, api_key=key, ignore_eos=ignore_eos),
        concurrencies=levels, requests_per_level=requests, timeout=timeout, rate=rate, seed=seed,
        max_level_s=max_level_seconds, objectives=Objectives(ttft_slo_ms, tpot_slo_ms, e2e_slo_ms),
        metrics_url=metrics_url, metrics_prefix=metrics_prefix,
    )
    need = min(max(cfg.level_requests(c) for c in levels), POOL_MAX)  # the ladder cycles through the pool
    if dataset is not None:
        default_max_tokens = workload.parse_length_spec(output_len, "--output-len")(random.Random(seed))
        pool = workload.pick(workload.load_jsonl(dataset, default_max_tokens), need, seed)
    else:
        pool = workload.synthetic(need, input_len, output_len, seed)

    report = _run_with_progress(cfg, pool, loadgen_check, max_error_rate)
    _table(report)
    if plot is not None:
        from deployctl.bench.plot import write_plot

        written = write_plot(report.levels, report.knee, plot, title=f"deployctl bench {base} ({route})")
        err_console.print(f"plot written to {written}")
    if json_out:
        print_json(report.to_json())
    if report.num_ok == 0:
        totals: dict[str, int] = {}
        for s in report.levels:
            for k, v in s.errors.items():
                totals[k] = totals.get(k, 0) + v
        reasons = ", ".join(f"{k}: {v}" for k, v in totals.items())
        raise CheckFailed(f"no request to {base} succeeded ({reasons})", fix="check that the server is up and the URL, model and API key are right")


def _run_with_progress(cfg, pool, loadgen_check: bool, max_error_rate: float):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from deployctl.bench.report import run_bench

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
               TimeElapsedColumn())
    tasks: dict[int, int] = {}
    with Progress(*columns, console=err_console, transient=False) as progress:
        if loadgen_check:
            progress.console.print(f"measuring the load generator's overhead at concurrency {max(cfg.concurrencies)}")

        def on_progress(p) -> None:
            if p.index not in tasks:
                tasks[p.index] = progress.add_task(f"concurrency {p.concurrency:>4}", total=p.total, info="")
            info = f"ok {p.ok} err {p.errors}"
            if p.stats is not None and p.stats.ttft_ms["p99"] is not None:
                info += f"  P99 TTFT {p.stats.ttft_ms['p99']:.0f} ms  P99 TPOT {p.stats.tpot_ms['p99'] or 0:.1f} ms"
            progress.update(tasks[p.index], completed=p.done, info=info)

        return run_bench(cfg, pool, on_progress, measure_loadgen=loadgen_check, max_error_rate=max_error_rate)
