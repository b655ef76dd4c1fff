"""The ladder as a PNG: latency percentiles and throughput against concurrency, the knee marked.

matplotlib (the ``plot`` extra) is imported here only, with the Agg backend, when a plot is asked for.
Raises UsageError when matplotlib is missing or the file cannot be written.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from deployctl.bench.knee import Knee
from deployctl.bench.stats import LevelStats
from deployctl.errors import UsageError


def write_plot(levels: Sequence[LevelStats], knee: Knee, path: Path, title: str = "") -> Path:
    """Write the figure to ``path`` (PNG) and return it."""
    return write_plot_sides([("", levels, knee)], path, title)


def write_plot_sides(sides: Sequence[tuple[str, Sequence[LevelStats], Knee]], path: Path, title: str = "") -> Path:
    """One figure with every side's ladder overlaid (one colour per side, labels prefixed with the side's name)
    and each side's knee; write it to ``path`` (PNG) and return it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError("--plot needs matplotlib, which is not installed", fix="pip install 'deployctl[plot]'") from None
    fig, (ax_lat, ax_tok, ax_thr) = plt.subplots(1, 3, figsize=(15, 4.5))
    ax_req = ax_thr.twinx()
    colours = ("tab:blue", "tab:red", "tab:green", "tab:purple")
    for n, (name, levels, knee) in enumerate(sides):
        tag = f"{name} " if name else ""
        colour = colours[n % len(colours)] if len(sides) > 1 else None
        xs = [s.concurrency for s in levels]
        # line style: the quantile; marker: the metric (two metrics share a panel)
        for key, label, ax, marker in (("ttft_ms", "TTFT", ax_lat, "o"), ("e2e_ms", "E2E", ax_lat, "s"),
                                       ("tpot_ms", "TPOT", ax_tok, "o"), ("itl_ms", "ITL", ax_tok, "s")):
            for q, line in (("p50", "-"), ("p90", "--"), ("p99", ":")):
                ys = [getattr(s, key)[q] for s in levels]
                if any(y is not None for y in ys):
                    ax.plot(xs, [float("nan") if y is None else y for y in ys], line + marker, color=colour,
                            label=f"{tag}{label} {q.upper()}")
        ax_thr.plot(xs, [s.output_tokens_per_s for s in levels], "-o", color=colour, label=f"{tag}output tokens/s")
        ax_req.plot(xs, [s.requests_per_s for s in levels], "--s", color=colour or "tab:orange",
                    label=f"{tag}requests/s")
        if knee.ttft_p99_limit_ms is not None:
            ax_lat.axhline(knee.ttft_p99_limit_ms, color=colour or "gray", ls="-.", lw=1, label=f"{tag}P99 TTFT limit")
        if knee.tpot_p99_limit_ms is not None:
            ax_tok.axhline(knee.tpot_p99_limit_ms, color=colour or "gray", ls="-.", lw=1, label=f"{tag}P99 TPOT limit")
        for ax in (ax_lat, ax_tok, ax_thr):
            if knee.concurrency is not None:
                ax.axvline(knee.concurrency, color=colour or "red", alpha=0.6, label=f"{tag}knee ({knee.concurrency})")
    xs = sorted({s.concurrency for _, levels, _ in sides for s in levels})
    ax_lat.set_ylabel("ms")
    ax_lat.set_title("TTFT and end-to-end latency")
    ax_tok.set_ylabel("ms")
    ax_tok.set_title("TPOT and ITL")
    ax_thr.set_ylabel("output tokens/s")
    ax_req.set_ylabel("requests/s")
    ax_thr.set_title("Throughput")
    for ax in (ax_lat, ax_tok, ax_thr):
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_xlabel("concurrency")
        ax.grid(True, alpha=0.3)
    for ax in (ax_lat, ax_tok):
        if ax.get_legend_handles_labels()[0]:  # no request succeeded: nothing to label (matplotlib would warn)
            ax.legend(fontsize=7, loc="upper left")
    handles, labels = ax_thr.get_legend_handles_labels()
    more_handles, more_labels = ax_req.get_legend_handles_labels()
    ax_thr.legend(handles + more_handles, labels + more_labels, fontsize=7, loc="upper left")
    fig.suptitle(title or "deployctl bench")
    fig.tight_layout()
    path = Path(path)
    try:
        fig.savefig(path, dpi=100)
    except OSError as err:
        raise UsageError(f"cannot write plot {path}: {err.strerror or err}", fix="pass a writable --plot path") from None
    finally:
        plt.close(fig)
    return path
