"""Words for what a ladder saw: a level whose requests all failed alike, an open loop that slipped, empty answers,
streams without ``data: [DONE]``, and a server that refuses a field we send. Each function returns lines (no
printing); ``context`` is the caller's description of the workload against the server (e.g. "prompts of up to 640
words + max_tokens up to 128 against max_model_len 512")."""
from __future__ import annotations

from typing import Sequence

from deployctl.bench.stats import LevelStats

# Fields we may send that a strict server (pydantic extra="forbid", e.g. HF transformers serve) refuses.
OPTIONAL_FIELDS = ("ignore_eos", "stream_options")
SLIP_RATE_SHARE = 0.95  # an open loop that sent slower than 95% of its schedule's rate slipped
SLIP_LAG_S = 0.05  # ... or whose P99 schedule lag is over 50 ms and over one mean gap


def uniform_failure(s: LevelStats, context: str = "") -> str | None:
    """"all 16 requests: http_400 context_length_exceeded (message) — context" when every request of the level
    failed with one reason; None otherwise."""
    if s.num_ok or len(s.errors) != 1:
        return None
    reason = next(iter(s.errors))
    codes = [k.split(" ", 1)[1] for k in s.error_codes if k.startswith(reason + " ")]
    code = f" {codes[0]}" if len(codes) == 1 else ""
    message = s.error_examples.get(reason, "")[:240]
    line = f"all {s.num_requests} requests: {reason}{code}" + (f" ({message})" if message else "")
    if context and ("context_length" in code or "context" in message.lower()):
        line += f" — {context}"
    return line


def refused_field(levels: Sequence[LevelStats]) -> str | None:
    """A hint naming the field when a server answered 400/422 naming one we send that not every server takes."""
    for s in levels:
        for reason, example in s.error_examples.items():
            if reason not in ("http_400", "http_422"):
                continue
            for name in OPTIONAL_FIELDS:
                if name in example:
                    fix = "leave out --ignore-eos" if name == "ignore_eos" else "the server cannot report usage in streams"
                    return (f"the server refuses the field '{name}' ({reason.replace('http_', 'HTTP ')}): {fix}")
    return None


def open_loop_slip(s: LevelStats, max_in_flight: int) -> str | None:
    """A warning when an open-loop level could not keep its arrival schedule, naming the cause: the concurrency
    cap (requests waited for a free slot) or the generator itself."""
    if s.loop != "open" or s.schedule_lag_ms is None or s.achieved_rate is None or not s.scheduled_rate:
        return None
    lag_p99 = (s.schedule_lag_ms["p99"] or 0.0) / 1e3
    slow = s.achieved_rate < SLIP_RATE_SHARE * s.scheduled_rate
    late = lag_p99 > SLIP_LAG_S and lag_p99 > 1.0 / s.scheduled_rate
    if not (slow or late):
        return None
    lag = s.schedule_lag_ms
    by_cap = (s.slot_wait_share or 0.0) >= 0.5
    cause = (f"the concurrency cap ({max_in_flight} in flight) held requests back ({s.slot_wait_share:.0%} of the "
             "lag): the server could not keep up, and the queueing is not in the latencies; raise --concurrency or "
             "lower --rate" if by_cap else
             "the generator could not send on time (CPU busy?); run bench on a less loaded machine")
    return (f"concurrency {s.concurrency}, open loop at {s.rate:.3g} req/s: achieved {s.achieved_rate:.2f} req/s "
            f"(schedule {s.scheduled_rate:.2f}), schedule lag P50 {lag['p50']:.1f} ms P99 {lag['p99']:.1f} ms "
            f"max {lag['max']:.1f} ms: {cause}")


def notes(levels: Sequence[LevelStats]) -> list[str]:
    """Once per run: empty answers counted as successes, streams that ended without [DONE]."""
    out = []
    empty = sum(s.num_empty for s in levels)
    if empty:
        out.append(f"{empty} answers were empty (200, no output text): counted as successes with their output "
                   "tokens (TTFT and TPOT not defined for them)")
    no_done = sum(s.num_no_done for s in levels)
    if no_done:
        out.append(f"{no_done} streams ended after a finish_reason without 'data: [DONE]': counted as successes "
                   "(as vllm bench serve does)")
    return out
