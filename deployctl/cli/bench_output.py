"""What `deployctl bench` shows on stderr: the ladder's table (one run, or two side by side with B/A ratios),
the knee, the recommendation, warnings and notes."""
from __future__ import annotations

from deployctl.bench import diagnose
from deployctl.cli._app import err_console
from deployctl.config.units import format_bytes


def fmt(d: dict, q: str) -> str:
    v = d.get(q)
    return "-" if v is None else f"{v:.1f}"


def loop_label(cfg) -> str:
    """"open loop: ..." or "closed loop: ..." for the title of a run's table."""
    if cfg.rate:
        shape = "the log's arrival gaps" if cfg.arrival_gaps else "Poisson arrivals"
        return f"open loop: {shape} at {cfg.rate:.3g} req/s, at most the level's concurrency in flight"
    return "closed loop: the level's concurrency in flight"


def table(report, name: str = "", context: str = "") -> None:
    from rich.table import Table

    t = Table(title=f"deployctl bench{' ' + name if name else ''} {report.cfg.target.base_url} "
                    f"({loop_label(report.cfg)})", title_justify="left")
    for col in ("conc", "ok", "empty", "err", "req/s", "out tok/s", "TTFT p50/p90/p99 ms", "TPOT p50/p99 ms",
                "ITL p50/p99 ms", "E2E p50/p99 ms", "goodput", "errors"):
        t.add_column(col, justify="left" if col == "errors" else "right")
    for s in report.levels:
        mark = " *" if s.concurrency == report.knee.concurrency else ""
        t.add_row(
            f"{s.concurrency}{mark}", str(s.num_ok), str(s.num_empty), str(s.num_errors), f"{s.requests_per_s:.2f}",
            f"{s.output_tokens_per_s:.1f}",
            "/".join(fmt(s.ttft_ms, q) for q in ("p50", "p90", "p99")),
            "/".join(fmt(s.tpot_ms, q) for q in ("p50", "p99")),
            "/".join(fmt(s.itl_ms, q) for q in ("p50", "p99")),
            "/".join(fmt(s.e2e_ms, q) for q in ("p50", "p99")),
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
                    parts.append(f"{label} P50/P99 {fmt(h, 'p50')}/{fmt(h, 'p99')} ms (n={h['count']})")
            err_console.print(f"server histograms at concurrency {s.concurrency}: " + ", ".join(parts))
            vram = s.server.get("vram") or {}
            if vram.get("peak_bytes"):
                err_console.print(f"VRAM peak at concurrency {s.concurrency}: " + ", ".join(
                    f"GPU {gpu} {format_bytes(n)}" for gpu, n in vram["peak_bytes"].items())
                    + f" (highest of {vram['samples']} scrapes)")
            elif vram:
                err_console.print(f"VRAM peak at concurrency {s.concurrency}: not measured: {vram['not_measured']}")
        if s.loop == "open" and s.schedule_lag_ms is not None and s.schedule_lag_ms["p50"] is not None:
            lag = s.schedule_lag_ms
            err_console.print(f"open loop at concurrency {s.concurrency}: target {s.rate:.3g} req/s, achieved "
                              f"{s.achieved_rate if s.achieved_rate is not None else '-'} req/s, schedule lag "
                              f"P50/P99/max {lag['p50']:.1f}/{lag['p99']:.1f}/{lag['max']:.1f} ms")
        uniform = diagnose.uniform_failure(s, context)
        if uniform:
            err_console.print(f"errors at concurrency {s.concurrency}: {uniform}", soft_wrap=True)
        elif s.errors:
            err_console.print(f"errors at concurrency {s.concurrency}: "
                              + ", ".join(f"{k}: {v} ({s.error_examples.get(k, '')[:80]})" for k, v in s.errors.items()),
                              soft_wrap=True)
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
    for n in report.notes:
        err_console.print(f"note: {n}", soft_wrap=True)
    for w in report.warnings:
        err_console.print(f"[yellow]warning:[/] {w}", markup=True, soft_wrap=True)




def _r(x) -> str:
    return "-" if x is None else f"{x:.2f}x"


def side_by_side(reports, names, comparison) -> None:
    """One table with both sides per level and the B/A ratios, each side's knee, and the verdict."""
    from rich.table import Table

    a, b = reports
    t = Table(title=f"deployctl bench side by side: {names[0]} {a.cfg.target.base_url} vs {names[1]} "
                    f"{b.cfg.target.base_url} ({loop_label(a.cfg)})", title_justify="left")
    for col in ("conc", "side", "ok", "err", "out tok/s", "TTFT p50/p99 ms", "TPOT p50/p99 ms", "ITL p50/p99 ms",
                "E2E p50/p99 ms", "goodput"):
        t.add_column(col, justify="right")
    for sa, sb, ratio in zip(a.levels, b.levels, comparison["levels"]):
        for name, s in ((names[0], sa), (names[1], sb)):
            t.add_row(str(s.concurrency), name, str(s.num_ok), str(s.num_errors), f"{s.output_tokens_per_s:.1f}",
                      *("/".join(fmt(getattr(s, key), q) for q in ("p50", "p99"))
                        for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")),
                      f"{s.goodput['requests_per_s']:.2f}/s" if s.goodput else "-")
        t.add_row("", f"{names[1]}/{names[0]}", "", "", _r(ratio["output_tokens_per_s"]),
                  *(f"{_r(ratio[f'{m}_p50'])}/{_r(ratio[f'{m}_p99'])}" for m in ("ttft", "tpot", "itl", "e2e")),
                  _r(ratio["goodput_rps"]), end_section=True)
    if not err_console.is_terminal:
        err_console.width = max(err_console.width, 180)
    err_console.print(t)
    for name, rep in zip(names, reports):
        k = rep.knee
        knee = f"concurrency {k.concurrency}" if k.concurrency is not None else "none"
        err_console.print(f"knee {name} (its own {k.criterion} limits): {knee}; {k.reason}")
        for s in rep.levels:
            uniform = diagnose.uniform_failure(s)
            if uniform:
                err_console.print(f"errors {name} at concurrency {s.concurrency}: {uniform}", soft_wrap=True)
        for n in rep.notes:
            err_console.print(f"note {name}: {n}", soft_wrap=True)
        for w in rep.warnings:
            err_console.print(f"[yellow]warning {name}:[/] {w}", markup=True, soft_wrap=True)
    err_console.print(f"verdict: {comparison['verdict']}", soft_wrap=True)
