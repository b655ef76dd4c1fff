"""Capacity at a traffic profile: concurrent sessions per replica and per GPU, replicas and GPUs needed.

Pure arithmetic plus the parsers of its three inputs (no I/O: callers pass text or parsed JSON).

- A session at the profile holds KV for its tail prompt + tail output tokens: P99 where the profile gives it
  (prompt=MEAN/P90/P99, JSON prompt_p99/output_p99: the peak a pool must hold), else P90 (the tail of real traffic,
  not the mean, which is reported too; where a skewed log's tail is below its mean, the mean). TrafficPlan.sized_at
  says which. Sessions per replica = min(KV pool tokens / tokens per session, max_num_seqs);
  per GPU = per replica / tensor_parallel_size (every rank holds the same token count, its share of the heads).
- With a bench result, the measured knee (deployctl.bench.knee: the highest concurrency whose P99 holds the SLO)
  caps it too: the plan uses the smaller of the two.
- Usable sessions per replica = floor(sessions × (1 − margin)) (capacity.margin, default 0.25: the guides' 20–30%
  headroom); replicas = ceil(peak concurrent requests / usable); GPUs = replicas × tensor_parallel_size.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass
from typing import Optional

from deployctl.errors import ConfigError


@dataclass(frozen=True)
class Profile:
    """Token counts per request and the peak number of requests in flight at once."""

    prompt_mean: float
    prompt_p90: float
    output_mean: float
    output_p90: float
    peak_concurrency: int
    source: str = "--profile"
    prompt_p99: Optional[float] = None
    output_p99: Optional[float] = None

    @property
    def sized_at(self) -> str:
        """The percentile sessions are sized on: "P99" when the profile gives a P99 (prompt or output), else "P90"."""
        return "P99" if self.prompt_p99 is not None or self.output_p99 is not None else "P90"

    def tail(self) -> tuple[float, float]:
        """(prompt, output) tokens at sized_at: each P99 where given, else its P90; never below its mean."""
        prompt = self.prompt_p99 if self.prompt_p99 is not None else self.prompt_p90
        output = self.output_p99 if self.output_p99 is not None else self.output_p90
        return max(prompt, self.prompt_mean), max(output, self.output_mean)

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class TrafficPlan:
    """The profile's plan. ``sessions_*``: concurrent sessions the KV pool holds at that length;
    ``knee``: the bench's measured knee (None without --bench); ``sessions_per_replica``: the smaller of KV,
    max_num_seqs and knee; ``usable_per_replica`` after the margin."""

    profile: Profile
    sized_at: str  # "P99" or "P90": the percentile tokens_per_session_tail and the sessions are sized on
    tokens_per_session_tail: float
    tokens_per_session_p90: float
    tokens_per_session_mean: float
    sessions_at_tail: float
    sessions_at_p90: float
    sessions_at_mean: float
    knee: Optional[int]
    limited_by: str  # "kv cache", "max_num_seqs" or "bench knee"
    sessions_per_replica: float
    sessions_per_gpu: float
    margin: float
    usable_per_replica: int
    replicas_needed: Optional[int]  # None: not one session fits
    gpus_needed: Optional[int]
    replicas_configured: Optional[int]
    fits: bool
    message: str

    def to_json(self) -> dict:
        return {**asdict(self), "profile": self.profile.to_json()}


# the inline form's parts and the JSON object's keys: one list each, and one refusal for anything else
_KEYS = {"prompt": ("prompt_mean", "prompt_p90", "prompt_p99"), "output": ("output_mean", "output_p90", "output_p99")}
JSON_KEYS = (*_KEYS["prompt"], *_KEYS["output"], "peak_concurrency")
_EXAMPLE = "e.g. --profile prompt=1000/3000/7000,output=300/800/2000,concurrency=8"


def _unknown_part(part: str) -> ConfigError:
    """The refusal of a profile part (inline ``key=value``) or JSON key that is not the profile's."""
    return ConfigError(f"--profile: {part!r} is not prompt=MEAN[/P90[/P99]], output=MEAN[/P90[/P99]] or "
                       f"concurrency=N (as JSON: {', '.join(JSON_KEYS)})", fix=_EXAMPLE)


def _positive(value, what: str, fix: str) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{what}: {value!r} is not a number", fix=fix) from None
    if not math.isfinite(x) or x <= 0:
        raise ConfigError(f"{what} must be positive, got {value!r}", fix=fix)
    return x


def make_profile(prompt_mean, prompt_p90, output_mean, output_p90, peak_concurrency, source: str,
                 check_order: bool = True, prompt_p99=None, output_p99=None) -> Profile:
    """A checked Profile. Raises ConfigError (exit 3) naming the number and the fix for zero/negative counts, a P90
    below its mean or a P99 below its P90, or a concurrency that is not a whole number."""
    fix = "give positive token counts, " + _EXAMPLE
    pm = _positive(prompt_mean, f"{source}: mean prompt tokens", fix)
    om = _positive(output_mean, f"{source}: mean output tokens", fix)
    pp = _positive(prompt_p90 if prompt_p90 is not None else pm, f"{source}: P90 prompt tokens", fix)
    op = _positive(output_p90 if output_p90 is not None else om, f"{source}: P90 output tokens", fix)
    p99 = {name: _positive(v, f"{source}: P99 {name} tokens", fix) if v is not None else None
           for name, v in (("prompt", prompt_p99), ("output", output_p99))}
    for name, mean, p90 in (("prompt", pm, pp), ("output", om, op)):
        if check_order and p90 < mean:
            raise ConfigError(f"{source}: P90 {name} tokens {p90:g} is below the mean {mean:g}",
                              fix=f"give {name}=MEAN/P90 with P90 >= MEAN")
        if check_order and p99[name] is not None and p99[name] < p90:
            raise ConfigError(f"{source}: P99 {name} tokens {p99[name]:g} is below the P90 {p90:g}",
                              fix=f"give {name}=MEAN/P90/P99 with P99 >= P90")
    c = _positive(peak_concurrency, f"{source}: peak concurrent requests", "give concurrency=N (N >= 1)")
    if c != int(c):
        raise ConfigError(f"{source}: peak concurrent requests {peak_concurrency!r} is not a whole number",
                          fix="give concurrency=N, a whole number of requests in flight at once")
    return Profile(pm, pp, om, op, int(c), source, p99["prompt"], p99["output"])


def parse_profile(spec: str, concurrency: Optional[int] = None) -> Profile:
    """``prompt=MEAN[/P90[/P99]],output=MEAN[/P90[/P99]],concurrency=N`` or a JSON object with JSON_KEYS.
    ``concurrency`` (--concurrency) wins. Raises ConfigError for a part or key that is not the profile's (both
    forms, one message), and for make_profile's reasons."""
    text = spec.strip()
    if text.startswith("{"):
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"--profile: invalid JSON: {exc.msg}") from None
        if not isinstance(doc, dict):
            raise ConfigError("--profile: expected a JSON object")
        for key in doc:
            if key not in JSON_KEYS:
                raise _unknown_part(key)
        return make_profile(doc.get("prompt_mean"), doc.get("prompt_p90"), doc.get("output_mean"),
                            doc.get("output_p90"), concurrency or doc.get("peak_concurrency"), "--profile",
                            prompt_p99=doc.get("prompt_p99"), output_p99=doc.get("output_p99"))
    values: dict = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or key not in ("prompt", "output", "concurrency"):
            raise _unknown_part(part)
        if key == "concurrency":
            values["concurrency"] = value
        else:
            numbers = value.split("/")
            if len(numbers) > 3:
                raise _unknown_part(part)
            numbers += [None] * (3 - len(numbers))
            for name, number in zip(_KEYS[key], numbers):
                values[name] = number or None
    for need in ("prompt_mean", "output_mean"):
        if need not in values:
            raise ConfigError(f"--profile: no {need.split('_')[0]}=… part", fix=_EXAMPLE)
    if concurrency is None and "concurrency" not in values:
        raise ConfigError("--profile: no concurrency=N part (the peak number of requests in flight)",
                          fix="add concurrency=N to --profile, or pass --concurrency N")
    return make_profile(values["prompt_mean"], values["prompt_p90"], values["output_mean"], values["output_p90"],
                        concurrency if concurrency is not None else values["concurrency"], "--profile",
                        prompt_p99=values["prompt_p99"], output_p99=values["output_p99"])


_LOG = re.compile(r"status=(\d+) prompt_tokens=(\d+) completion_tokens=(\d+)")


def _p90(xs: list[int]) -> float:
    """Nearest-rank P90 (the smallest value with at least 90% of the values at or below it)."""
    s = sorted(xs)
    return float(s[max(0, math.ceil(0.9 * len(s)) - 1)])


def profile_from_log(text: str, concurrency: Optional[int], source: str = "--from-log") -> Profile:
    """Token statistics from the runtime's access log (runtime/deployctl_runtime/server/middleware.py: one
    ``status=… prompt_tokens=… completion_tokens=…`` line per inference request; successful ones count).
    The log has no arrival times to derive concurrency from: ``concurrency`` (--concurrency) is required.
    Raises ConfigError when no request line is found."""
    rows = [(int(p), int(c)) for status, p, c in _LOG.findall(text) if status == "200"]
    if not rows:
        raise ConfigError(f"{source}: no request lines (status=200 prompt_tokens=N completion_tokens=M) in the log",
                          fix="give the runtime's access log (logger deployctl_runtime.access), or use --profile")
    if concurrency is None:
        raise ConfigError(f"{source}: the log gives token counts, not the peak concurrency",
                          fix="pass --concurrency N (peak requests in flight, e.g. the max of num_requests_running)")
    prompts, outputs = [p for p, _ in rows], [c for _, c in rows]
    return make_profile(sum(prompts) / len(rows), _p90(prompts), max(1.0, sum(outputs) / len(rows)),
                        max(1.0, _p90(outputs)), concurrency, f"{source} ({len(rows)} requests)", check_order=False)


def knee_from_bench(doc: dict, source: str = "--bench") -> tuple[Optional[int], Optional[Profile]]:
    """The knee concurrency of a `deployctl bench` result JSON (``knee.concurrency``, None when even the first level
    broke the SLO) and, when the levels carry token totals, the mean prompt/output tokens per request of the
    ladder. Raises ConfigError when it is not a bench result."""
    if not isinstance(doc, dict) or not isinstance(doc.get("knee"), dict):
        raise ConfigError(f"{source}: not a deployctl bench result (no 'knee' object)",
                          fix="give the JSON `deployctl bench --json` wrote")
    knee = doc["knee"].get("concurrency")
    return (int(knee) if knee is not None else None), None


def plan_traffic(*, pool_tokens: int, max_num_seqs: int, max_model_len: int, tensor_parallel_size: int,
                 profile: Profile, margin: float, knee: Optional[int] = None,
                 replicas_configured: Optional[int] = None, max_prompt_tokens: Optional[int] = None,
                 max_completion_tokens: Optional[int] = None) -> TrafficPlan:
    """The plan at ``profile`` (module docstring), sized at profile.sized_at (P99 where given, else P90). Raises
    ConfigError (exit 3) when the tail prompt + tail output is longer than max_model_len, or the tail prompt above
    server.max_prompt_tokens (the server would refuse those requests). Outputs are sized at most at
    server.max_completion_tokens (the runtime's cap)."""
    at = profile.sized_at
    # a skewed log can have P90 below the mean (a few very long requests): size on the larger of the two
    prompt, output = profile.tail()
    p90_session = max(profile.prompt_p90, profile.prompt_mean) + max(profile.output_p90, profile.output_mean)
    if max_prompt_tokens is not None and prompt > max_prompt_tokens:
        raise ConfigError(f"{profile.source}: {at} prompt {prompt:g} tokens is above server.max_prompt_tokens "
                          f"{max_prompt_tokens}: those requests would be refused (400)",
                          fix=f"raise server.max_prompt_tokens to at least {math.ceil(prompt)}, or shorten the prompts")
    if max_completion_tokens is not None:
        output = min(output, max_completion_tokens)
        p90_session = min(p90_session, max(profile.prompt_p90, profile.prompt_mean) + max_completion_tokens)
    per_p90 = prompt + output  # the tail session (P99 or P90)
    per_mean = profile.prompt_mean + profile.output_mean
    if per_p90 > max_model_len:
        raise ConfigError(
            f"{profile.source}: {at} prompt + {at} output = {per_p90:g} tokens is longer than max_model_len "
            f"{max_model_len}: those requests would be refused",
            fix=f"raise engine.max_model_len to at least {math.ceil(per_p90)}, or cap prompts/outputs below it")
    at_p90, at_mean = pool_tokens / per_p90, pool_tokens / per_mean
    candidates = [(at_p90, "kv cache"), (float(max_num_seqs), "max_num_seqs")]
    if knee is not None:
        candidates.append((float(knee), "bench knee"))
    sessions, limited = min(candidates, key=lambda c: c[0])
    usable = math.floor(sessions * (1 - margin))
    replicas = math.ceil(profile.peak_concurrency / usable) if usable >= 1 else None
    gpus = replicas * tensor_parallel_size if replicas else None
    have = replicas_configured
    fits = replicas is not None and (have is None or replicas <= have)
    if replicas is None:
        msg = (f"not one session of {per_p90:g} tokens ({at}) fits with margin {margin:g}: {sessions:.2f} sessions per "
               "replica; give the KV cache more memory (larger GPU, higher tensor_parallel_size, kv_cache_dtype fp8)")
    else:
        msg = (f"{sessions:.2f} concurrent sessions per replica at the profile ({at} {per_p90:g} tokens, limited by "
               f"{limited}), {usable} usable after margin {margin:g}; peak {profile.peak_concurrency} needs "
               f"{replicas} replica(s) = {gpus} GPU(s)")
        if have is not None:
            msg += f"; {have} configured: " + ("fits" if fits else
                                                f"does not fit: add {replicas - have} host(s), or raise the sessions per "
                                                "replica (tensor_parallel_size, kv_cache_dtype fp8, quantized weights)")
    return TrafficPlan(profile, at, per_p90, p90_session, per_mean, at_p90, pool_tokens / p90_session, at_mean, knee,
                       limited, sessions,
                       sessions / tensor_parallel_size, margin, usable, replicas, gpus, have, fits, msg)
