"""The go-live report: ``DIR/validate.json`` (the --json document) and ``DIR/report.html``, one self-contained page
(inline CSS and SVG, no script, no external file) an engineer attaches to the go-live ticket.

The page: the overall verdict and a table of the verdict per layer; then per layer that ran its section
(``<section id="LAYER">``): functional — the case table (case, route, stream, status, prompt tokens, max_tokens,
output tokens, finish_reason, checks, problems); latency — the ladder plot (P99 TTFT and TPOT against concurrency)
and its table with the knee; stability — time series plots of KV usage, RSS and queue depth, and the signals; failover — its facts (failed requests, detection and restart times).
"""
from __future__ import annotations

import json
from html import escape
from pathlib import Path
from typing import Any

from deployctl.validate.result import ValidationRun
from deployctl.validate.svg import line_chart

CSS = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}table{border-collapse:collapse;"
       "margin:.5em 0}td,th{border:1px solid #ccc;padding:2px 6px;font-size:13px;text-align:left}"
       ".pass{color:#1a7f37;font-weight:bold}.fail{color:#cf222e;font-weight:bold}.skipped,.warn{color:#9a6700}"
       "code{font-size:12px}")


def _verdict(v: str) -> str:
    return f'<span class="{escape(v)}">{escape(v.upper())}</span>'


def _table(head: list[str], rows: list[list[str]], cls: str = "") -> str:
    out = [f'<table class="{cls}"><tr>' + "".join(f"<th>{escape(h)}</th>" for h in head) + "</tr>"]
    out += ["<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows]
    return "".join(out) + "</table>"


def _functional(d: dict[str, Any]) -> str:
    rows = []
    for c in d.get("cases", []):
        checks = " ".join(f'<span class="{escape(v)}">{escape(k)}</span>' for k, v in c["checks"].items())
        rows.append([escape(c["id"]), escape(c["route"]), "yes" if c["stream"] else "no",
                     f'{c["status"]} (want {c["expect"]})', str(c["prompt_tokens"] or ""), str(c["max_tokens"]),
                     str(c["completion_tokens"] if c["completion_tokens"] is not None else ""),
                     escape(str(c["finish_reason"] or "")), checks,
                     "<br>".join(escape(p) for p in c["problems"]) or _verdict("pass")])
    html = _table(["case", "route", "stream", "HTTP", "prompt tok", "max_tokens", "output tok", "finish", "checks",
                   "problems"], rows, "functional")
    if d.get("warnings"):
        html += "<p>Warnings:</p><ul>" + "".join(f'<li class="warn">{escape(w)}</li>' for w in d["warnings"]) + "</ul>"
    return html


def _latency(d: dict[str, Any]) -> str:
    levels = d.get("levels", [])
    ttft = [(lv["concurrency"], lv["ttft_ms"]["p99"]) for lv in levels if lv["ttft_ms"]["p99"] is not None]
    tpot = [(lv["concurrency"], lv["tpot_ms"]["p99"]) for lv in levels if lv["tpot_ms"]["p99"] is not None]
    html = line_chart({"P99 TTFT ms": ttft}, "Ladder: P99 TTFT against concurrency", "concurrency", "ms")
    html += line_chart({"P99 TPOT ms": tpot}, "Ladder: P99 TPOT against concurrency", "concurrency", "ms")
    rows = [[str(lv["concurrency"]), str(lv["num_ok"]), str(lv["num_errors"]),
             f'{lv["output_tokens_per_s"]:.1f}', _ms(lv["ttft_ms"]), _ms(lv["tpot_ms"])] for lv in levels]
    html += _table(["concurrency", "ok", "errors", "out tok/s", "TTFT p50/p99 ms", "TPOT p50/p99 ms"], rows, "ladder")
    knee, rec = d.get("knee") or {}, d.get("recommendation") or {}
    html += (f"<p>Knee: concurrency {escape(str(knee.get('concurrency')))} ({escape(str(knee.get('reason', '')))})."
             f"</p><pre>{escape(rec.get('deploy_yaml', ''))}</pre>")
    return html


def _ms(p: dict) -> str:
    f = ["-" if p.get(k) is None else f"{p[k]:.1f}" for k in ("p50", "p99")]
    return "/".join(f)


def _stability(d: dict[str, Any]) -> str:
    samples = d.get("samples", [])
    sources = sorted({s["source"] for s in samples})

    def series(key: str, scale: float = 1.0) -> dict[str, list[tuple[float, float]]]:
        return {src: [(s["t"], s[key] / scale) for s in samples if s["source"] == src and s.get(key) is not None]
                for src in sources}

    html = line_chart(series("kv_usage"), "KV cache usage over time", "seconds", "used share")
    html += line_chart(series("rss_bytes", 1024 * 1024), "Process RSS over time", "seconds", "MiB")
    html += line_chart(series("waiting"), "Queue depth (waiting requests) over time", "seconds", "requests")
    if any(s.get("gpu_memory_bytes") is not None for s in samples):
        html += line_chart(series("gpu_memory_bytes", 1024 * 1024), "GPU memory in use (NVML)", "seconds", "MiB")
    html += f"<pre>{escape(json.dumps(d.get('signals', {}), indent=1))}</pre>"
    return html


def _failover(d: dict[str, Any]) -> str:
    return _table(["fact", "value"], [[escape(k), escape(json.dumps(v))] for k, v in d.items()], "failover")


SECTIONS = {"functional": _functional, "latency": _latency, "stability": _stability, "failover": _failover}


def render_html(run: ValidationRun) -> str:
    doc = run.to_json()
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>deployctl validate: {escape(run.url)}"
             f"</title><style>{CSS}</style></head><body>",
             f"<h1>deployctl validate: {_verdict(run.verdict)}</h1>",
             f"<p>{escape(run.url)} · model {escape(str(run.model))} · max_model_len {run.max_model_len} · "
             f"started {escape(run.started_at)} · {run.duration_s:.0f} s</p>",
             _table(["layer", "verdict", "summary"], [[escape(r.layer), _verdict(r.verdict), escape(r.summary)]
                                                      for r in run.layers], "verdicts")]
    for r in run.layers:
        parts.append(f'<section id="{escape(r.layer)}"><h2>{escape(r.layer)}: {_verdict(r.verdict)}</h2>')
        if r.problems:
            parts.append("<ul>" + "".join(f'<li class="fail">{escape(p)}</li>' for p in r.problems) + "</ul>")
        render = SECTIONS.get(r.layer)
        if render is not None and r.details:
            parts.append(render(doc["layers"][r.layer]["details"]))
        parts.append("</section>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(run: ValidationRun, directory: Path) -> list[Path]:
    """Write validate.json and report.html into ``directory`` (created); returns their paths. Raises OSError."""
    directory.mkdir(parents=True, exist_ok=True)
    j, h = directory / "validate.json", directory / "report.html"
    j.write_text(json.dumps(run.to_json(), indent=1) + "\n")
    h.write_text(render_html(run))
    return [j, h]
