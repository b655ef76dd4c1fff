"""Test-only fault injection, read from env `DEPLOYCTL_RUNTIME_FAULT` (comma-separated `key=value`).

  load_delay_s=S     sleep S seconds while loading (before the engine is built): a slow start (C10).
  fail_start=1       fail during loading: log "fault injection: fail_start" and exit non-zero.
  error_rate=F       answer that share (0..1) of inference requests 500 internal_error (bad canary).
  token_delay_ms=MS  sleep MS per engine step (slow canary: TPOT and TTFT grow).
  repeat_token=ID    every output token becomes token ID (a repeated-token loop; a special token: empty text).
  clamp_max_tokens=N generate at most N tokens whatever max_tokens says (a silent truncation: finish_reason length).
  garble_text=1      every text delta starts with U+FFFD (a detokenizer emitting invalid UTF-8).
  leak_kv_blocks=N   every finished request keeps its last N KV blocks forever (a block leak: KV usage climbs).
  raise_on_token=ID  the forward pass raises RuntimeError whenever its batch holds token ID (one poisoned request:
                     the engine isolates it by bisecting the batch; the others go on).
  cuda_error_on_token=ID  the forward pass raises "CUDA error: an illegal memory access was encountered" whenever
                     its batch holds token ID (a sticky device error: the runtime fails open requests and exits 3).
  fail_wake=1        POST /wake_up answers 503 gpu_memory_exhausted and the runtime stays asleep (a wake whose memory
                     was taken between the rollback's look and its wake).
  zero_weight_on_wake=1  every wake zeroes one weight tensor (the final norm's): the woken engine answers garbage
                     (a constant token, often empty text) with HTTP 200 (a standby woken wrong).
  stall_after_steps=N  the forward pass blocks forever after N of them (a wedged engine loop: a hung kernel or
                     collective); the watchdog (--engine-stall-timeout-s) must catch it.

Never set in production; the server logs a WARNING at start when any is active.
"""
from __future__ import annotations

import os
import random
import threading
from dataclasses import dataclass

ENV_VAR = "DEPLOYCTL_RUNTIME_FAULT"
HELP = (
    f"Test-only fault injection: env {ENV_VAR}=key=value[,key=value...] with load_delay_s=S (slow load), "
    "fail_start=1 (exit non-zero during load), error_rate=F (share of inference requests answered 500), "
    "token_delay_ms=MS (sleep per decode step), repeat_token=ID (every output token is ID), clamp_max_tokens=N "
    "(at most N tokens generated), garble_text=1 (U+FFFD in every text delta), leak_kv_blocks=N (finished requests "
    "keep N KV blocks), raise_on_token=ID (forward raises when its batch holds token ID), cuda_error_on_token=ID (forward "
    "raises a sticky CUDA error when its batch holds token ID), fail_wake=1 (POST /wake_up refused 503), "
    "zero_weight_on_wake=1 (a wake zeroes the final norm's weight: garbage answered 200), stall_after_steps=N (the "
    "forward pass blocks forever after N of them: a wedged engine loop)."
)


@dataclass(frozen=True)
class Faults:
    load_delay_s: float = 0.0
    fail_start: bool = False
    error_rate: float = 0.0
    token_delay_ms: float = 0.0
    repeat_token: float = -1.0
    clamp_max_tokens: float = 0.0
    garble_text: bool = False
    leak_kv_blocks: float = 0.0
    raise_on_token: float = -1.0
    cuda_error_on_token: float = -1.0
    fail_wake: bool = False
    zero_weight_on_wake: bool = False
    stall_after_steps: float = -1.0

    @property
    def active(self) -> bool:
        return self != Faults()

    def rewrite_tokens(self, new: list[int]) -> list[int]:
        """The output tokens as the repeat_token fault makes them (unchanged without it)."""
        return [int(self.repeat_token)] * len(new) if self.repeat_token >= 0 else new

    def clamp(self, max_tokens: int) -> int:
        """max_tokens as the clamp_max_tokens fault makes it (unchanged without it)."""
        return min(max_tokens, int(self.clamp_max_tokens)) if self.clamp_max_tokens >= 1 else max_tokens

    def rewrite_text(self, delta: str) -> str:
        """A text delta as the garble_text fault makes it: its first character replaced by U+FFFD."""
        return "\ufffd" + delta[1:] if self.garble_text and delta else delta

    def install(self, engine) -> None:
        """Apply the faults that live inside the engine (leak_kv_blocks, raise_on_token, cuda_error_on_token,
        zero_weight_on_wake, stall_after_steps) to an LLMEngine, once, before serving."""
        if self.leak_kv_blocks >= 1:
            _leak_blocks(engine, int(self.leak_kv_blocks))
        if self.raise_on_token >= 0 or self.cuda_error_on_token >= 0:
            _raise_in_forward(engine.runner, int(self.raise_on_token), int(self.cuda_error_on_token))
        if self.zero_weight_on_wake:
            _zero_weight_on_wake(engine)
        if self.stall_after_steps >= 0:
            _stall_after(engine.runner, int(self.stall_after_steps))

    def should_fail_request(self) -> bool:
        return self.error_rate > 0 and random.random() < self.error_rate

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> "Faults":
        """Parse the env var. Raises ValueError naming the bad item."""
        raw = (os.environ if env is None else env).get(ENV_VAR, "").strip()
        values: dict[str, float] = {}
        for item in filter(None, (p.strip() for p in raw.split(","))):
            key, sep, val = item.partition("=")
            if not sep or key not in cls.__dataclass_fields__:
                raise ValueError(f"{ENV_VAR}: unknown item {item!r}; known: {', '.join(cls.__dataclass_fields__)}")
            try:
                values[key] = float(val)
            except ValueError:
                raise ValueError(f"{ENV_VAR}: {key}={val!r} is not a number") from None
        if not 0 <= values.get("error_rate", 0) <= 1:
            raise ValueError(f"{ENV_VAR}: error_rate must be within 0..1, got {values['error_rate']}")
        for flag in ("fail_start", "garble_text", "fail_wake", "zero_weight_on_wake"):
            if flag in values:
                values[flag] = bool(values[flag])
        return cls(**values)  # type: ignore[arg-type]


def _leak_blocks(engine, n: int) -> None:
    """Wrap the scheduler's finish so that a finished request's last ``n`` blocks never return to the pool: they
    leave its block table with their reference held (preemption still frees everything, as it should)."""
    sched, kv = engine.scheduler, engine.kv
    held: list = []
    finish = sched.finish

    def leaky_finish(req, reason):
        blocks = kv.req_to_blocks.get(req.request_id)
        if blocks and req.status.name != "FINISHED":
            keep = blocks[-n:]
            del blocks[-len(keep):]
            held.extend(keep)
        return finish(req, reason)

    sched.finish = leaky_finish


def _raise_in_forward(runner, plain_id: int, cuda_id: int) -> None:
    """Wrap the model runner's forward so that it raises when its batch's input ids hold one of the given token ids
    (-1: off): a plain RuntimeError for `plain_id`, a message with "CUDA error" (fatal, isolation.is_fatal) for
    `cuda_id`."""
    forward = runner.forward

    def faulty_forward(inputs):
        ids = set(inputs.input_ids.tolist())
        if cuda_id in ids:
            raise RuntimeError("CUDA error: an illegal memory access was encountered (fault injection: "
                               f"cuda_error_on_token={cuda_id})")
        if plain_id in ids:
            raise RuntimeError(f"fault injection: raise_on_token={plain_id} is in the batch")
        return forward(inputs)

    runner.forward = faulty_forward


def _zero_weight_on_wake(engine) -> None:
    """Wrap the engine's wake_up so that, once the weights are back, the final norm's weight is zeroed in place
    (CUDA graphs read the same memory): every hidden state reaching lm_head is 0, so every logit is equal and greedy
    decoding picks one constant token."""
    wake_up = engine.wake_up

    def wake_up_wrong():
        wake_up()
        engine.runner.model.model.norm.weight.data.zero_()

    engine.wake_up = wake_up_wrong


def _stall_after(runner, n: int) -> None:
    """Wrap the model runner's forward so that its call after the n-th blocks forever (an Event nobody sets):
    the engine loop is wedged in "forward" as by a hung kernel."""
    forward = runner.forward
    calls = [0]
    never = threading.Event()

    def stalling_forward(inputs):
        calls[0] += 1
        if calls[0] > n:
            never.wait()
        return forward(inputs)

    runner.forward = stalling_forward
