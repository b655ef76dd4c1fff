"""What an engine says it allocated, read from its start log, and how far that is from the plan (issue 44).

``parse(text, engine, block_size=16) -> Allocated`` over the log written since the start. Each engine's own
statement, in the formats this module knows (``KNOWN``); any other text gives ``Allocated.parsed == False`` with
``note`` "not parsed: ..." (never a guess):

- ``deployctl-runtime``: runtime/deployctl_runtime/kv_sizing.py ``KVPlan.summary``:
  "KV cache: B blocks x S tokens = T tokens (P bytes/token, N bytes); ...".
- ``vllm`` V1 engine (vllm >= 0.8, kv_cache_utils.py since PR #13596): "Available KV cache memory: X GiB",
  "GPU KV cache size: N tokens", "Maximum concurrency for L tokens per request: Cx"; where logged
  "Model loading took X GiB" and "Graph capturing finished in S secs, took X GiB".
- ``vllm`` V0 engine (vllm 0.6 - 0.7): "Memory profiling results: ... kv_cache_size=XGiB
  gpu_memory_utilization=U", "# GPU blocks: B" (tokens = B x block_size), "Loading model weights took X GB".
- ``sglang`` 0.4 ("KV Cache is allocated. #tokens: N, K size: X GB, V size: Y GB") and 0.5 (the same with
  "dtype: D, " before "#tokens"); "Load weight end. ... mem usage=X GB", "Memory pool end. avail mem=X GB",
  "max_total_num_tokens=N". SGLang's "GB" is 2**30 bytes (sglang/srt/utils ``get_available_gpu_memory`` divides
  by 1 << 30).

Bytes are integers (GiB figures × 2**30, so exact to the log's two decimals: ±5 MiB). Tensor-parallel engines
print one line per rank with the same figures; the first one is taken (per-GPU figures).

``compare(plan_tokens, plan_bytes, actual, ...) -> dict``: the difference in percent and a flag past ±10%, with
the causes it can name (``causes``).
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Optional

GIB = 1 << 30
TOLERANCE = 0.10  # a pool more than 10% off the plan is flagged (issue 44)

KNOWN = {
    "deployctl-runtime": "deployctl-runtime (kv_sizing.KVPlan.summary)",
    "vllm": "vllm V1 engine (>= 0.8) and V0 engine (0.6 - 0.7)",
    "sglang": "sglang 0.4 and 0.5",
}

_RUNTIME = re.compile(r"KV cache: (\d+) blocks x (\d+) tokens = (\d+) tokens \((\d+) bytes/token, (\d+) bytes\)")
_V1_MEM = re.compile(r"Available KV cache memory: ([\d.]+) GiB")
_V1_TOKENS = re.compile(r"GPU KV cache size: ([\d,]+) tokens")
_CONC = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x")
_V1_LOAD = re.compile(r"Model loading took ([\d.]+) Gi?B")
_V1_GRAPHS = re.compile(r"Graph capturing finished in [\d.]+ secs?, took ([\d.]+) GiB")
_V0_PROFILE = re.compile(r"Memory profiling results:.*?kv_cache_size=([\d.]+)GiB(?:.*?gpu_memory_utilization=([\d.]+))?")
_V0_BLOCKS = re.compile(r"(?:# )?GPU blocks: (\d+)")  # the issue quote lost its "# " to Markdown
_V0_LOAD = re.compile(r"Loading model weights took ([\d.]+) GB")
_SG_KV = re.compile(r"KV Cache is allocated\. (dtype: (\S+), )?#tokens: (\d+), K size: ([\d.]+) GB, V size: ([\d.]+) GB")
_SG_LOAD = re.compile(r"Load weight end\..*?mem usage=([\d.]+) GB")
_SG_POOL = re.compile(r"Memory pool end\. avail mem=([\d.]+) GB")
_SG_TOTAL = re.compile(r"max_total_num_tokens=(\d+)")


@dataclass(frozen=True)
class Allocated:
    """One engine start's own statement. ``kv_tokens`` / ``kv_bytes`` per GPU (None when the format does not say);
    ``parts``: other figures the log gives (bytes as int, ``max_concurrency`` as float, ``gpu_memory_utilization``);
    ``format``: the known format that matched, None when ``note`` says "not parsed: ..."."""

    engine: str
    format: Optional[str]
    kv_tokens: Optional[int] = None
    kv_bytes: Optional[int] = None
    parts: dict = field(default_factory=dict)
    note: str = ""

    @property
    def parsed(self) -> bool:
        return self.format is not None

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict) -> "Allocated":
        return cls(**{k: doc.get(k) for k in ("engine", "format", "kv_tokens", "kv_bytes", "note")},
                   parts=dict(doc.get("parts") or {}))


def _gib(x: str) -> int:
    return int(round(float(x) * GIB))


def _first(rx: re.Pattern, text: str):
    return rx.search(text)


def _runtime(text: str) -> Optional[Allocated]:
    m = _first(_RUNTIME, text)
    if not m:
        return None
    blocks, size, tokens, per_token, nbytes = (int(g) for g in m.groups())
    return Allocated("deployctl-runtime", KNOWN["deployctl-runtime"], tokens, nbytes,
                     {"num_blocks": blocks, "block_size": size, "kv_bytes_per_token": per_token})


def _vllm(text: str, block_size: int) -> Optional[Allocated]:
    parts: dict = {}
    conc = _first(_CONC, text)
    if conc:
        parts["max_concurrency"] = float(conc.group(2))
        parts["max_model_len"] = int(conc.group(1).replace(",", ""))
    tokens = _first(_V1_TOKENS, text)
    if tokens:
        mem = _first(_V1_MEM, text)
        for key, rx in (("weights_bytes", _V1_LOAD), ("cuda_graphs_bytes", _V1_GRAPHS)):
            m = _first(rx, text)
            if m:
                parts[key] = _gib(m.group(1))
        return Allocated("vllm", "vllm V1 engine (>= 0.8)", int(tokens.group(1).replace(",", "")),
                         _gib(mem.group(1)) if mem else None, parts)
    blocks = _first(_V0_BLOCKS, text)
    if blocks:
        prof = _first(_V0_PROFILE, text)
        load = _first(_V0_LOAD, text)
        if load:
            parts["weights_bytes"] = _gib(load.group(1))
        if prof and prof.group(2):
            parts["gpu_memory_utilization"] = float(prof.group(2))
        parts["num_blocks"] = int(blocks.group(1))
        return Allocated("vllm", "vllm V0 engine (0.6 - 0.7)", int(blocks.group(1)) * block_size,
                         _gib(prof.group(1)) if prof else None, parts)
    return None


def _sglang(text: str) -> Optional[Allocated]:
    m = _first(_SG_KV, text)
    if not m:
        return None
    parts: dict = {"k_bytes": _gib(m.group(4)), "v_bytes": _gib(m.group(5))}
    if m.group(2):
        parts["kv_dtype"] = m.group(2)
    for key, rx in (("weights_bytes", _SG_LOAD), ("avail_after_pool_bytes", _SG_POOL)):
        g = _first(rx, text)
        if g:
            parts[key] = _gib(g.group(1))
    total = _first(_SG_TOTAL, text)
    if total:
        parts["max_total_num_tokens"] = int(total.group(1))
    fmt = "sglang 0.5 (KV line with dtype)" if m.group(1) else "sglang 0.4 (KV line without dtype)"
    return Allocated("sglang", fmt, int(m.group(3)), parts["k_bytes"] + parts["v_bytes"], parts)


def parse(text: str, engine: str, block_size: int = 16) -> Allocated:
    """The engine's statement of its KV pool in ``text`` (module doc). ``engine``: a deployctl.engines KINDS value
    ("deployctl-runtime", "vllm", "sglang", ...); ``block_size``: tokens per block, for vLLM V0's block count.
    Never raises: an unknown engine or format gives ``format`` None and "not parsed: ..." in ``note``."""
    if engine not in KNOWN:
        return Allocated(engine, None, note=f"not parsed: deployctl reads no start log of engine {engine} "
                                            f"(it knows {', '.join(KNOWN)})")
    got = {"deployctl-runtime": lambda: _runtime(text), "vllm": lambda: _vllm(text, block_size),
           "sglang": lambda: _sglang(text)}[engine]()
    if got is None:
        return Allocated(engine, None, note=f"not parsed: no KV pool line of a known {engine} version in the start "
                                            f"log (known: {KNOWN[engine]})")
    return got


def _pct(actual: Optional[int], plan: Optional[int]) -> Optional[float]:
    if actual is None or not plan:
        return None
    return round(100.0 * (actual - plan) / plan, 1)


def compare(plan_tokens: Optional[int], plan_bytes: Optional[int], actual: Allocated, *,
            utilization: Optional[float] = None, graphs_reserve_bytes: Optional[int] = None,
            others: Optional[list] = None, tolerance: float = TOLERANCE) -> dict:
    """Plan vs actual per GPU: ``{"plan": {"kv_tokens", "kv_bytes"}, "actual": {...}, "diff_tokens_pct",
    "diff_bytes_pct", "flagged", "causes": [str], "note"}``. ``flagged`` when either difference is over
    ``tolerance`` (±10%). Causes named where the facts show them: ``utilization`` (deploy.yaml's
    gpu_memory_utilization) against the one the engine logged; ``graphs_reserve_bytes`` (the plan's CUDA graph
    line) against "Graph capturing ... took"; ``others``: [{"pid", "name", "used_memory"}] processes on the GPU
    that are not this service's engine (preflight's gpu_processes facts)."""
    out = {"plan": {"kv_tokens": plan_tokens, "kv_bytes": plan_bytes},
           "actual": {"kv_tokens": actual.kv_tokens, "kv_bytes": actual.kv_bytes}, "format": actual.format,
           "diff_tokens_pct": None, "diff_bytes_pct": None, "flagged": False, "causes": [], "note": actual.note}
    if not actual.parsed:
        return out
    dt, db = _pct(actual.kv_tokens, plan_tokens), _pct(actual.kv_bytes, plan_bytes)
    out["diff_tokens_pct"], out["diff_bytes_pct"] = dt, db
    out["flagged"] = any(d is not None and abs(d) > 100 * tolerance for d in (dt, db))
    if not out["flagged"]:
        return out
    causes = []
    logged = actual.parts.get("gpu_memory_utilization")
    if utilization is not None and logged is not None and abs(logged - utilization) > 1e-6:
        causes.append(f"gpu_memory_utilization: the engine ran at {logged}, deploy.yaml plans {utilization}")
    graphs = actual.parts.get("cuda_graphs_bytes")
    if graphs is not None and graphs_reserve_bytes is not None and abs(graphs - graphs_reserve_bytes) > 0.1 * GIB:
        causes.append(f"CUDA graphs: the engine's capture took {graphs / GIB:.2f} GiB, the plan reserved "
                      f"{graphs_reserve_bytes / GIB:.2f} GiB")
    for p in others or []:
        used = p.get("used_memory")
        causes.append(f"another process on the GPU: pid {p.get('pid')} ({p.get('name') or 'unknown'})"
                      + (f" holds {used / GIB:.2f} GiB" if used else ""))
    if not causes:
        causes.append("no cause deployctl can name: compare the engine's non-KV memory (weights, activation peak, "
                      "CUDA graphs) with `deployctl plan` and set engine.runtime_overhead or "
                      "gpu_memory_utilization")
    out["causes"] = causes
    return out


def describe(host: str, cmp: dict) -> str:
    """One line for ``status``: "h1: KV plan 1,024 tokens / 8.0 MiB, engine 870 tokens / 6.8 MiB (-15.0% tokens,
    -15.0% bytes): OFF PLAN: <causes>", or the "not parsed"/"no plan" note."""
    a, p = cmp.get("actual") or {}, cmp.get("plan") or {}

    def side(d: dict) -> str:
        t = "?" if d.get("kv_tokens") is None else f"{d['kv_tokens']:,} tokens"
        b = "? bytes" if d.get("kv_bytes") is None else f"{d['kv_bytes'] / (1 << 20):,.1f} MiB"
        return f"{t} / {b}"

    if not cmp.get("format"):
        return f"{host}: KV plan vs engine: {cmp.get('note')}"
    if cmp.get("diff_tokens_pct") is None and cmp.get("diff_bytes_pct") is None:
        return f"{host}: KV engine {side(a)} ({cmp.get('format')}); {cmp.get('note') or 'no plan to compare'}"
    diffs = ", ".join(f"{d:+.1f}% {what}" for d, what in ((cmp.get("diff_tokens_pct"), "tokens"),
                                                          (cmp.get("diff_bytes_pct"), "bytes")) if d is not None)
    verdict = ("OFF PLAN (over ±10%): " + "; ".join(cmp["causes"])) if cmp.get("flagged") else "within ±10%"
    return f"{host}: KV plan {side(p)}, engine {side(a)} ({diffs}): {verdict}"
