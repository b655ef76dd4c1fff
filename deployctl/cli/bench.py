"""`deployctl bench`: the load ladder and the knee (deployctl.bench does the work; this module shows it)."""
from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import List, Optional

import typer

from deployctl.cli._app import app, err_console, print_json
from deployctl.engines import adapter
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


@app.command("bench", epilog="Example: deployctl bench --url http://gpu-a:8000 --concurrency 1,4 --requests 16")
def bench(
    url: Optional[List[str]] = typer.Option(None, "--url", help="Base URL of an OpenAI-compatible server, e.g. http://127.0.0.1:8000; twice to compare A and B side by side."),
    config: Optional[Path] = typer.Option(None, "-c", "--config", help="deploy.yaml to resolve --hosts from."),
    hosts: Optional[str] = typer.Option(None, "--hosts", help="With -c: host names (or canary,stable) to bench; two to compare."),
    concurrency: str = typer.Option("1,4,8,16,32", "--concurrency", help="Comma-separated ladder of concurrencies (run in increasing order)."),
    requests: int = typer.Option(64, "--requests", help="Requests per level (at least the level's concurrency)."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON document on stdout (with vllm bench serve's keys per level)."),
    save_result: Optional[Path] = typer.Option(None, "--save-result", help="Write vllm bench serve style result JSON per level: FILE-cN.json."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Write latency and throughput against concurrency to FILE.png."),
    route: str = typer.Option("chat", "--route", help="chat (/v1/chat/completions) or completions (/v1/completions)."),
    model: Optional[str] = typer.Option(None, "--model", help="Model name (default: the first of GET /v1/models)."),
    dataset: Optional[Path] = typer.Option(None, "--dataset", help="JSONL requests ({\"prompt\"|\"messages\", \"max_tokens\"}) or ShareGPT JSON."),
    from_log: Optional[Path] = typer.Option(None, "--from-log", help="The runtime's request log: replay its lengths and arrival pattern."),
    input_len: Optional[str] = typer.Option(None, "--input-len", help="Synthetic prompt words: N, LO-HI, normal:MEAN,STD, lognormal:MEDIAN,SIGMA (default 128, fitted to max_model_len)."),
    output_len: Optional[str] = typer.Option(None, "--output-len", help="max_tokens per request (same forms; default 128, fitted)."),
    seed: int = typer.Option(0, "--seed", help="Seed for synthetic lengths, dataset order and Poisson arrivals."),
    rate: Optional[float] = typer.Option(None, "--rate", help="Open loop: arrivals at this many requests/s (capped at the level's concurrency)."),
    ttft_slo_ms: Optional[float] = typer.Option(None, "--ttft-slo-ms", help="P99 TTFT objective (ms) for the knee and goodput."),
    tpot_slo_ms: Optional[float] = typer.Option(None, "--tpot-slo-ms", help="P99 TPOT objective (ms) for the knee and goodput."),
    e2e_slo_ms: Optional[float] = typer.Option(None, "--e2e-slo-ms", help="End-to-end objective (ms) for goodput."),
    timeout: float = typer.Option(60.0, "--timeout", help="Seconds per request, whole stream included."),
    max_level_seconds: Optional[float] = typer.Option(None, "--max-level-seconds", help="Send no new request after this long in a level."),
    api_key_env: Optional[str] = typer.Option(None, "--api-key-env", help="Env var holding the API key (default DEPLOYCTL_API_KEY, then OPENAI_API_KEY)."),
    metrics_url: Optional[str] = typer.Option(None, "--metrics-url", help="Scrape this /metrics before and after each level and report the server's histograms."),
    metrics_prefix: str = typer.Option(adapter("deployctl-runtime").metrics.prefix, "--metrics-prefix", help="Metric name prefix (vLLM: 'vllm:')."),
    ignore_eos: bool = typer.Option(False, "--ignore-eos", help="Send ignore_eos: true (vLLM extension) so outputs reach max_tokens."),
    max_error_rate: float = typer.Option(0.01, "--max-error-rate", help="A level with a larger error share (0-1) is past the knee."),
    loadgen_check: bool = typer.Option(True, "--loadgen-check/--no-loadgen-check", help="Measure the generator's own overhead first."),
    warmup: int = typer.Option(1, "--warmup", help="Requests sent one at a time before level 1 and counted in no level (a cold server's first request would set level 1's P99); 0 sends none."),
    apply: bool = typer.Option(False, "--apply", help="Write the knee into deploy.yaml (-c, default ./deploy.yaml): engine.max_num_seqs and router.max_conns_per_host, with a comment."),
) -> None:
    """Load ladder: TTFT, TPOT, ITL and E2E percentiles per concurrency, errors per reason, and the knee."""
    from deployctl.bench import prepare
    from deployctl.bench.client import ROUTES, Target, normalize_base_url
    from deployctl.bench.fit import server_info
    from deployctl.bench.ladder import POOL_MAX, LadderConfig
    from deployctl.bench.stats import Objectives

    names, urls, key = _sides(url, config, hosts, api_key_env)
    if apply and len(urls) != 1:
        raise UsageError("--apply writes one server's knee; two servers were given", fix="bench one server with --apply")
    apply_to = (config or Path("deploy.yaml")) if apply else None
    if apply_to is not None:
        if not apply_to.is_file():
            raise UsageError(f"--apply: {apply_to} does not exist", fix="pass -c with the deploy.yaml to change")
        from deployctl.config import load_config

        load_config(apply_to)  # an invalid file is refused (exit 3) before minutes of load, not after
    if metrics_url is not None:
        _check_url(metrics_url, "--metrics-url")
    if route not in ROUTES:
        raise UsageError(f"--route {route!r} is not a route", fix="use --route chat or --route completions")
    if requests < 1:
        raise UsageError(f"--requests {requests} must be at least 1", fix="e.g. --requests 64")
    if warmup < 0:
        raise UsageError(f"--warmup {warmup} is negative", fix="e.g. --warmup 1, or --warmup 0 to send none")
    for name, value in (("--rate", rate), ("--timeout", timeout), ("--ttft-slo-ms", ttft_slo_ms),
                        ("--tpot-slo-ms", tpot_slo_ms), ("--e2e-slo-ms", e2e_slo_ms),
                        ("--max-level-seconds", max_level_seconds)):
        _positive(name, value)
    if dataset is not None and from_log is not None:
        raise UsageError("--dataset and --from-log both give the requests", fix="pass one of them")
    if plot is not None and (plot.suffix.lower() != ".png" or plot.is_dir()):
        raise UsageError(f"--plot {plot} is not a .png file name", fix="e.g. --plot bench.png")
    for flag, path in (("--plot", plot), ("--save-result", save_result)):
        if path is not None and not path.resolve().parent.is_dir():
            raise UsageError(f"{flag} {path}: directory {path.resolve().parent} does not exist",
                             fix="create it or pick another path")
    if not 0 <= max_error_rate < 1:
        raise UsageError(f"--max-error-rate {max_error_rate} is not a fraction", fix="e.g. --max-error-rate 0.01 (1%)")
    levels = _concurrencies(concurrency)
    for spec, what in ((input_len, "--input-len"), (output_len, "--output-len")):
        if spec is not None:
            from deployctl.bench.workload import parse_length_spec

            parse_length_spec(spec, what)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    bases = [normalize_base_url(u) for u in urls]
    infos = [server_info(b, headers) for b in bases]
    targets = []
    for name, base, info in zip(names, bases, infos):
        side_model = model or info.model
        if side_model is None:
            err_console.print(f"[yellow]warning:[/] no model from {base}/v1/models; sending requests without 'model'",
                              markup=True)
        targets.append(Target(base_url=base, route=route, model=side_model, api_key=key, ignore_eos=ignore_eos))
    contexts = [i.max_model_len for i in infos if i.max_model_len is not None]
    max_model_len = min(contexts) if contexts else None
    base_cfg = LadderConfig(target=targets[0], concurrencies=levels, requests_per_level=requests, timeout=timeout,
                            rate=rate, seed=seed, max_level_s=max_level_seconds,
                            objectives=Objectives(ttft_slo_ms, tpot_slo_ms, e2e_slo_ms), metrics_url=metrics_url,
                            metrics_prefix=metrics_prefix, warmup=warmup)
    need = min(max(base_cfg.level_requests(c) for c in levels), POOL_MAX)  # the ladder cycles through the pool
    work = prepare.build(need, seed, targets[0], max_model_len, min(timeout, 30.0), input_len=input_len,
                         output_len=output_len, dataset=dataset, from_log=from_log)
    for note in work.notes:
        err_console.print(f"note: {note}")
    cfgs = [replace(base_cfg, target=t, rate=rate or work.rate, arrival_gaps=work.arrival_gaps,
                    metrics_url=metrics_url if i == 0 or metrics_url is None else None)
            for i, t in enumerate(targets)]
    reports = _run_with_progress(cfgs, work.requests, loadgen_check, max_error_rate, names)
    for rep in reports:
        rep.max_model_len, rep.workload = max_model_len, work.info
    doc = _show(reports, names, base_cfg.objectives, max_error_rate, work.context)
    if plot is not None:
        from deployctl.bench.plot import write_plot_sides

        written = write_plot_sides([(n if len(reports) > 1 else "", r.levels, r.knee) for n, r in zip(names, reports)],
                                   plot, title=f"deployctl bench {' vs '.join(bases)} ({route})")
        err_console.print(f"plot written to {written}")
    if save_result is not None:
        from deployctl.bench.vllm_format import save_results

        for n, rep in zip(names, reports):
            meta = {"backend": "openai-chat" if route == "chat" else "openai", "model_id": rep.cfg.target.model,
                    "base_url": rep.cfg.target.base_url, "deployctl_loop": "open" if rep.cfg.rate else "closed"}
            written = save_results(save_result, rep.levels, meta, n if len(reports) > 1 else "")
            err_console.print(f"results written to {', '.join(str(w) for w in written)}")
    if json_out:
        print_json(doc)
    _fail_if_nothing_succeeded(reports, work.context)
    if apply_to is not None:
        _apply(apply_to, reports[0], f"deployctl bench of {bases[0]} (concurrency {concurrency}, {requests} requests "
                                     f"per level, seed {seed})")


def _apply(path: Path, report, run: str) -> None:
    from deployctl.bench.apply import apply_recommendation
    from deployctl.bench.recommend import recommendation

    done = apply_recommendation(path, recommendation(report.knee, report.cfg.target.base_url), run=run)
    for key, (old, new) in done.changes.items():
        err_console.print(f"{path}: {key} {old} -> {new}")
    for note in done.notes:
        err_console.print(f"note: {note}")


def _sides(url, config, hosts, api_key_env) -> tuple[list[str], list[str], Optional[str]]:
    """(names, URLs, API key) from --url (A, B) or -c/--hosts."""
    if hosts is not None:
        if url:
            raise UsageError("--url and --hosts both name the servers", fix="pass one of them")
        from deployctl.cli.bench_hosts import resolve_hosts

        resolved, cfg_key = resolve_hosts(config or Path("deploy.yaml"), hosts)
        names, urls = [n for n, _ in resolved], [u for _, u in resolved]
        key = _api_key(api_key_env) if api_key_env else cfg_key
    else:
        if not url:
            raise UsageError("no server to bench", fix="pass --url http://HOST:PORT (twice to compare), "
                                                       "or -c deploy.yaml --hosts stable,canary")
        names, urls, key = (["A", "B"][: len(url)] if len(url) > 1 else ["A"]), list(url), _api_key(api_key_env)
    if len(urls) not in (1, 2):
        raise UsageError(f"{len(urls)} servers given; bench runs one, or two side by side",
                         fix="pass --url once, or twice to compare")
    for u in urls:
        _check_url(u)
    return names, urls, key


def _show(reports, names, objectives, max_error_rate: float, context: str) -> dict:
    """Print the table(s); the --json document (one run: the report; two: both sides and the comparison)."""
    from deployctl.bench.compare import compare
    from deployctl.cli.bench_output import side_by_side, table

    if len(reports) == 1:
        table(reports[0], context=context)
        return reports[0].to_json()
    a, b = reports
    comparison = compare(a.levels, b.levels, objectives, a.knee, max_error_rate, tuple(names))
    side_by_side(reports, names, comparison)
    return {"sides": {n: r.to_json() for n, r in zip(names, reports)}, "comparison": comparison,
            "verdict": comparison["verdict"]}


def _fail_if_nothing_succeeded(reports, context: str) -> None:
    from deployctl.bench import diagnose

    for rep in reports:
        if rep.num_ok:
            continue
        base = rep.cfg.target.base_url
        totals: dict[str, int] = {}
        for s in rep.levels:
            for k, v in s.errors.items():
                totals[k] = totals.get(k, 0) + v
        reasons = ", ".join(f"{k}: {v}" for k, v in totals.items())
        uniform = [diagnose.uniform_failure(s, context) for s in rep.levels]
        extra = ""
        if uniform and all(uniform) and len({u.split(":", 1)[1] for u in uniform}) == 1:
            extra = f": all {sum(s.num_requests for s in rep.levels)} requests {uniform[0].split(':', 1)[1].strip()}"
        raise CheckFailed(f"no request to {base} succeeded ({reasons}){extra}", fix=_fix_for(rep))


def _fix_for(rep) -> str:
    errors = {k for s in rep.levels for k in s.errors}
    codes = " ".join(k for s in rep.levels for k in s.error_codes)
    from deployctl.bench import diagnose

    hint = diagnose.refused_field(rep.levels)
    if hint:
        return hint
    if "context_length" in codes:
        return "shorten --input-len/--output-len (or the dataset's prompts) to fit the server's max_model_len"
    if errors == {"http_401"}:
        return "pass the server's API key (--api-key-env NAME, or DEPLOYCTL_API_KEY)"
    if errors == {"http_404"}:
        return "check --model against GET /v1/models"
    return "check that the server is up and the URL, model and API key are right"


def _run_with_progress(cfgs, pool, loadgen_check: bool, max_error_rate: float, names):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from deployctl.bench.report import run_side_by_side

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
               TimeElapsedColumn())
    tasks: dict[int, int] = {}
    with Progress(*columns, console=err_console, transient=False) as progress:
        if loadgen_check:
            progress.console.print(f"measuring the load generator's overhead at concurrency {max(cfgs[0].concurrencies)}")

        def on_progress(p) -> None:
            key = (p.index, p.side)
            if key not in tasks:
                side = f"{names[p.side]} " if len(cfgs) > 1 else ""
                tasks[key] = progress.add_task(f"{side}concurrency {p.concurrency:>4}", total=p.total, info="")
            info = f"ok {p.ok} err {p.errors}"
            if p.stats is not None and p.stats.ttft_ms["p99"] is not None:
                info += f"  P99 TTFT {p.stats.ttft_ms['p99']:.0f} ms  P99 TPOT {p.stats.tpot_ms['p99'] or 0:.1f} ms"
            progress.update(tasks[key], completed=p.done, info=info)

        return run_side_by_side(cfgs, pool, on_progress, measure_loadgen=loadgen_check, max_error_rate=max_error_rate)
