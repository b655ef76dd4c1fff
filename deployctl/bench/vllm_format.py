"""The keys ``vllm bench serve`` writes (vllm/benchmarks/serve.py, result JSON), from our own figures, so that
dashboards and notebooks made for vLLM's results read ours.

Units as vLLM's: seconds for ``duration``, requests/s and tokens/s for the throughputs, milliseconds for
``{mean,median,std,p90,p99}_{ttft,tpot,itl,e2el}_ms``. A latency with no sample (every request failed, or one
output token for TPOT) is None where vLLM writes 0. ``request_rate`` is "inf" for a closed loop, as vLLM writes
it. ``request_goodput`` (requests/s meeting every objective) only when objectives are set.
"""
from __future__ import annotations

import json
import math
from datetime import datetime
from pathlib import Path

from deployctl.bench.stats import LevelStats
from deployctl.errors import UsageError

METRICS = (("ttft", "ttft_ms", "raw_ttft_s"), ("tpot", "tpot_ms", "raw_tpot_s"), ("itl", "itl_ms", "raw_itl_s"),
           ("e2el", "e2e_ms", "raw_e2e_s"))


def _std_ms(values_s: list[float]) -> float | None:
    if not values_s:
        return None
    mean = sum(values_s) / len(values_s)
    return round(math.sqrt(sum((v - mean) ** 2 for v in values_s) / len(values_s)) * 1e3, 3)  # numpy's std (ddof 0)


def vllm_keys(s: LevelStats) -> dict:
    """One level as vLLM's result keys (see the module docstring)."""
    total_in = s.total_prompt_tokens or 0
    dur = max(s.duration_s, 1e-9)
    out: dict = {
        "duration": s.duration_s,
        "completed": s.num_ok,
        "failed": s.num_errors,
        "num_prompts": s.num_requests,
        "max_concurrency": s.concurrency,
        "request_rate": s.rate if s.rate is not None else "inf",
        "total_input_tokens": total_in,
        "total_output_tokens": s.total_output_tokens,
        "request_throughput": s.requests_per_s,
        "output_throughput": s.output_tokens_per_s,
        "total_token_throughput": round((total_in + s.total_output_tokens) / dur, 2),
    }
    for name, summary_key, raw_key in METRICS:
        summary = getattr(s, summary_key)
        out[f"mean_{name}_ms"] = summary["mean"]
        out[f"median_{name}_ms"] = summary["p50"]
        out[f"std_{name}_ms"] = _std_ms(getattr(s, raw_key))
        out[f"p90_{name}_ms"] = summary["p90"]
        out[f"p99_{name}_ms"] = summary["p99"]
    if s.goodput is not None:
        out["request_goodput"] = s.goodput["requests_per_s"]
    return out


def save_results(path: Path, levels: list[LevelStats], meta: dict, label: str = "") -> list[Path]:
    """Write one vLLM-style result JSON per level: PATH's stem + ``-LABEL`` + ``-cN`` + suffix (``out.json`` ->
    ``out-c4.json``), with ``meta`` (date, backend, model_id, ...) and the per-request ``input_lens``,
    ``output_lens`` and ``ttfts`` (s) of the successes. Raises UsageError when a file cannot be written."""
    path = Path(path)
    written = []
    for s in levels:
        name = f"{path.stem}{'-' + label if label else ''}-c{s.concurrency}{path.suffix or '.json'}"
        doc = {"date": datetime.now().strftime("%Y%m%d-%H%M%S"), **meta, **vllm_keys(s),
               "input_lens": s.raw_input_lens, "output_lens": s.raw_output_lens, "ttfts": s.raw_ttft_s}
        target = path.with_name(name)
        try:
            target.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
        except OSError as err:
            raise UsageError(f"--save-result: cannot write {target}: {err.strerror or err}",
                             fix="pass a writable --save-result path") from None
        written.append(target)
    return written
