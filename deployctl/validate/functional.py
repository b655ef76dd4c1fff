"""The functional layer: does every kind of request get a whole, clean answer, and every bad one its 400?

Cases (ids are what problems name): ``short`` (one short chat question), ``long`` (a prompt of about half the
context), ``at-limit`` (prompt + max_tokens = max_model_len exactly), each non-streamed and streamed
(``-stream``) with the same seed; ``multi-turn`` (system, user, assistant, user); ``completion`` (the
/v1/completions route, streamed); ``empty`` (no messages) and ``empty-prompt`` (an empty completion prompt),
``over-long`` (a prompt over max_model_len) and ``over-max-tokens`` (prompt + max_tokens one over), each
expecting the documented 400 (docs/CONTRACTS.md, "Runtime HTTP"). Prompt lengths are measured, not guessed: a
``max_tokens: 1`` request returns the prompt's tokens in ``usage``.

Checks of every answer (the names problems carry): ``status`` (the expected HTTP status), ``error``
(finish_reason error, an error inside the stream, no finish_reason), ``truncation`` (finish_reason length before
max_tokens: the server cut the answer), ``empty``/``repetition``/``invalid_utf8``/``zero_tokens`` (the degenerate
signs of deployctl.rollout.outputcheck, ``max_repeats`` back to back), and per pair ``stream_equal`` (the
streamed text equals the non-streamed text for the same seed). U+FFFD that the answer's own token ids decode to
(POST /detokenize) is the model's output, not the server's: a warning, not a failure (a tiny random model emits
raw bytes); U+FFFD beyond that fails.

What a server gives no way to judge is a warning that says ``cannot judge: ...``, never a failure: U+FFFD and a
streamed text that differs where the answer holds U+FFFD when the server returns no token ids (it refuses
``return_token_ids``: the model's bytes cannot be told from the server's); a stream that gave its finish_reason but
no ``data: [DONE]`` (clients such as the openai SDK end the stream either way); the context limit when the server
reports no ``max_model_len`` in /v1/models and none is given (``at-limit``, ``over-long`` and ``over-max-tokens``
are not sent, ``long`` uses a 256-token prompt).

Requests use seeded sampling (temperature 0.7, top_p 0.95, ``seed``): what users get, reproducible.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional

import httpx

from deployctl.rollout.golden import Answer, text_pieces
from deployctl.rollout.outputcheck import degenerate_signs
from deployctl.validate.client import Endpoint, Reply, detokenize, post
from deployctl.validate.result import LayerResult

FILLER = ("The harbour master counted the boats that came back before the storm, wrote each name in the ledger, "
          "and sent the boys along the quay to ask about the missing ones. ")
SHORT = "What is the capital of France?"
MULTI_TURN = [
    {"role": "system", "content": "You are a concise assistant."},
    {"role": "user", "content": "Name a primary colour."},
    {"role": "assistant", "content": "Red."},
    {"role": "user", "content": "And another one?"},
]
SAMPLING = {"temperature": 0.7, "top_p": 0.95}
CHECKS = ("status", "error", "truncation", "empty", "repetition", "invalid_utf8", "zero_tokens", "stream_equal")


@dataclass
class Case:
    """One request: ``messages`` for chat (joined into one text for /v1/completions), ``expect`` its status."""

    id: str
    route: str
    messages: list[dict[str, str]]
    max_tokens: int
    stream: bool = False
    expect: int = 200
    seed: int = 0
    pair: Optional[str] = None  # the non-streamed case whose text this one must equal
    prompt_tokens: Optional[int] = None  # measured

    def body(self) -> dict[str, Any]:
        b: dict[str, Any] = {"max_tokens": self.max_tokens, "seed": self.seed, "return_token_ids": True, **SAMPLING}
        if self.route == "chat":
            b["messages"] = self.messages
        else:
            b["prompt"] = "\n".join(m["content"] for m in self.messages)
        return b


@dataclass
class CaseResult:
    """What one case got and what its checks said: ``checks`` {name: pass|fail|warn}, ``problems`` the failures
    (each ``CHECK on 'CASE': why``), ``warnings`` the rest."""

    id: str
    route: str
    stream: bool
    expect: int
    status: int
    prompt_tokens: Optional[int]
    max_tokens: int
    completion_tokens: Optional[int]
    finish_reason: Optional[str]
    text_head: str
    checks: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}

    def fail(self, check: str, why: str) -> None:
        self.checks[check] = "fail"
        self.problems.append(f"{check} on '{self.id}' ({self.route}{', stream' if self.stream else ''}): {why}")

    def warn(self, check: str, why: str) -> None:
        self.checks.setdefault(check, "warn")
        self.warnings.append(f"{check} on '{self.id}': {why}")


def _filler(words: int) -> str:
    base = FILLER.split()
    return " ".join(base[i % len(base)] for i in range(max(words, 1)))


def _measure(client: httpx.Client, ep: Endpoint, route: str, messages: list[dict[str, str]]) -> Optional[int]:
    """The prompt's tokens as the server counts them (usage of a max_tokens 1 request), or None."""
    body = Case("measure", route, messages, 1).body()
    r = post(client, ep, route, body, stream=False)
    return r.prompt_tokens if r.status == 200 else None


def _fit_prompt(client: httpx.Client, ep: Endpoint, route: str, target: int) -> tuple[list[dict[str, str]], int]:
    """A one-message prompt of at most ``target`` tokens (and as close as three measurements get), with its count.
    Raises ValueError when the server does not report usage."""
    p1 = _measure(client, ep, route, [{"role": "user", "content": _filler(8)}])
    p2 = _measure(client, ep, route, [{"role": "user", "content": _filler(72)}])
    if p1 is None or p2 is None or p2 <= p1:
        raise ValueError("the server reports no usage.prompt_tokens; prompt lengths cannot be measured")
    per_word, overhead = (p2 - p1) / 64, p1 - 8 * (p2 - p1) / 64
    words = max(1, int((target - overhead) / per_word))
    for _ in range(4):
        msgs = [{"role": "user", "content": _filler(words)}]
        n = _measure(client, ep, route, msgs)
        if n is None:
            raise ValueError("the server did not answer a max_tokens 1 request while measuring the prompt")
        if n <= target:
            return msgs, n
        words = max(1, int(words - (n - target) / per_word) - 1)
    return msgs, n


# The context assumed for ``long`` when the server reports no max_model_len: small enough for any server.
UNKNOWN_CONTEXT = 512
NO_LIMIT = ("cannot judge the context limit: the server reports no max_model_len in /v1/models (at-limit, over-long "
            "and over-max-tokens not sent)")


def build_cases(client: httpx.Client, ep: Endpoint, chat: bool, seed: int = 0) -> list[Case]:
    """The case list of the module doc for a context of ``ep.max_model_len`` tokens (at least 64); without it
    (the server does not say) the cases that need the limit are left out (NO_LIMIT)."""
    known = ep.max_model_len is not None
    L = ep.max_model_len or UNKNOWN_CONTEXT
    route = "chat" if chat else "completions"
    short_out = min(16, L // 8)
    user = [{"role": "user", "content": SHORT}]
    cases = [Case("short", route, user, short_out, seed=seed),
             Case("short-stream", route, user, short_out, True, seed=seed, pair="short")]
    long_msgs, long_p = _fit_prompt(client, ep, route, L // 2)
    long_out = max(1, min(64, L - long_p - 1))
    cases += [Case("long", route, long_msgs, long_out, seed=seed + 1, prompt_tokens=long_p),
              Case("long-stream", route, long_msgs, long_out, True, seed=seed + 1, pair="long", prompt_tokens=long_p)]
    if known:
        lim_msgs, lim_p = _fit_prompt(client, ep, route, L - min(32, max(L // 8, 1)))
        cases += [Case("at-limit", route, lim_msgs, L - lim_p, seed=seed + 2, prompt_tokens=lim_p),
                  Case("at-limit-stream", route, lim_msgs, L - lim_p, True, seed=seed + 2, pair="at-limit",
                       prompt_tokens=lim_p)]
    if chat:
        cases.append(Case("multi-turn", "chat", MULTI_TURN, short_out, seed=seed + 3))
        cases.append(Case("empty", "chat", [], short_out, expect=400))
    cases.append(Case("completion", "completions", user, short_out, True, seed=seed + 4))
    cases.append(Case("empty-prompt", "completions", [{"role": "user", "content": ""}], short_out, expect=400))
    if known:
        cases.append(Case("over-long", route, [{"role": "user", "content": _filler(2 * L)}], short_out, expect=400))
        cases.append(Case("over-max-tokens", route, lim_msgs, L - lim_p + 1, expect=400, prompt_tokens=lim_p))
    return cases


def judge(case: Case, r: Reply, max_repeats: int, decoded: Callable[[list[int]], Optional[str]]) -> CaseResult:
    """Every check of the module doc on one reply (``decoded``: the server's whole-sequence decode of ids)."""
    res = CaseResult(case.id, case.route, case.stream, case.expect, r.status, r.prompt_tokens or case.prompt_tokens,
                     case.max_tokens, r.completion_tokens, r.finish_reason, r.text[:80])
    if r.status != case.expect:
        why = f"expected HTTP {case.expect}, got {r.status or 'no answer'}"
        res.fail("status", why + (f" ({r.error_code or ''}: {r.error})" if r.error else ""))
        return res
    res.checks["status"] = "pass"
    if case.expect != 200:  # the documented refusal came: nothing else to judge
        return res
    if r.stream_error or r.finish_reason in (None, "error", "abort"):
        res.fail("error", r.stream_error or f"finish_reason {r.finish_reason}")
    elif r.no_done:
        res.warn("error", f"the stream ended after finish_reason {r.finish_reason} without data: [DONE] "
                          "(OpenAI's end marker; the openai SDK ends the stream either way)")
    else:
        res.checks["error"] = "pass"
    n = r.completion_tokens if r.completion_tokens is not None else (len(r.token_ids) if r.token_ids else None)
    if r.finish_reason == "length" and n is not None and n < case.max_tokens:
        res.fail("truncation", f"finish_reason length after {n} of max_tokens {case.max_tokens} tokens"
                 + (f" (prompt {res.prompt_tokens} + max_tokens {case.max_tokens})" if res.prompt_tokens else ""))
    elif r.finish_reason == "length" and n is None:
        res.warn("truncation", "finish_reason length and no usage: cannot tell whether max_tokens was reached")
    else:
        res.checks["truncation"] = "pass"
    answer = Answer(text=r.text, tokens=text_pieces(r.text), token_ids=r.token_ids, finish_reason=r.finish_reason,
                    completion_tokens=n or 0, level="token" if r.token_ids is not None else "text")
    signs = degenerate_signs(answer, max_repeats)
    for check in ("empty", "repetition", "zero_tokens"):
        if check in signs:
            res.fail(check, signs[check])
        else:
            res.checks[check] = "pass"
    if "invalid_utf8" in signs:
        _judge_utf8(res, r, decoded)
    else:
        res.checks["invalid_utf8"] = "pass"
    return res


def _judge_utf8(res: CaseResult, r: Reply, decoded: Callable[[list[int]], Optional[str]]) -> None:
    have = r.text.count("\ufffd")
    whole = decoded(r.token_ids) if r.token_ids else None
    if whole is not None and have <= whole.count("\ufffd"):
        res.warn("invalid_utf8", f"{have} U+FFFD, as its own {len(r.token_ids or [])} tokens decode: the model emits "
                 "bytes that are not UTF-8 (weights or tokenizer), not the server")
    elif whole is not None:
        res.fail("invalid_utf8", f"text has {have} U+FFFD where its {len(r.token_ids or [])} tokens decode to "
                 f"{whole.count(chr(0xFFFD))}: the server garbles the text")
    elif r.token_ids is None:
        res.warn("invalid_utf8", f"cannot judge {have} U+FFFD: the server returns no token ids (return_token_ids) "
                 "to tell the model's bytes from the server's")
    else:  # token ids but no decode of them: through the router, which passes the inference routes only
        res.warn("invalid_utf8", f"cannot judge {have} U+FFFD: the server does not decode its token ids here "
                 "(POST /detokenize; the router passes the inference routes only: validate a host with --host)")


def _stream_equal(res: CaseResult, other: CaseResult, texts: dict[str, str], ids: bool = True) -> None:
    """``ids``: the server returned token ids (without them a difference at or after a U+FFFD cannot be told from
    the two decoders' handling of bytes that are not UTF-8: a warning)."""
    a, b = texts.get(res.id), texts.get(other.id)
    if a is None or b is None:  # one of the two got no answer: its status check already failed
        return
    if a == b:
        res.checks["stream_equal"] = "pass"
        return
    at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    if not ids and "\ufffd" in a[:at + 2] + b[:at + 2]:
        res.warn("stream_equal", f"cannot judge: streamed text differs from '{other.id}' at character {at}, where "
                 "the text holds U+FFFD and the server returns no token ids")
        return
    res.fail("stream_equal", f"streamed text differs from '{other.id}' (same seed) at character {at}: "
             f"{a[at:at + 12]!r} vs {b[at:at + 12]!r}")


def detect_chat(client: httpx.Client, ep: Endpoint) -> bool:
    """True when /v1/chat/completions answers (the model has a chat template); else the cases use completions."""
    return post(client, ep, "chat", Case("probe", "chat", [{"role": "user", "content": SHORT}], 1).body(),
                stream=False).status == 200


def run_functional(ep: Endpoint, *, max_repeats: int = 8, timeout: float = 120.0, seed: int = 0,
                   on_case: Optional[Callable[[CaseResult], None]] = None) -> LayerResult:
    """Send every case one at a time and judge it. ``details``: {"route", "cases": [CaseResult.to_json()]}."""
    with httpx.Client(timeout=httpx.Timeout(timeout), trust_env=False) as client:
        chat = detect_chat(client, ep)
        try:
            cases = build_cases(client, ep, chat, seed)
        except ValueError as exc:
            return LayerResult("functional", "fail", f"functional: cannot build the cases: {exc}", [str(exc)])
        results: list[CaseResult] = []
        texts: dict[str, str] = {}
        for case in cases:
            reply = post(client, ep, case.route, case.body(), case.stream)
            res = judge(case, reply, max_repeats, lambda ids: detokenize(client, ep, ids))
            if reply.status == 200:
                texts[case.id] = reply.text
            if case.pair:
                other = next(r for r in results if r.id == case.pair)
                _stream_equal(res, other, texts, ids=reply.token_ids is not None)
            results.append(res)
            if on_case is not None:
                on_case(res)
    problems = [p for r in results for p in r.problems]
    warnings = [w for r in results for w in r.warnings] + ([] if ep.max_model_len else [NO_LIMIT])
    ok = sum(r.ok for r in results)
    route = "chat" if chat else "completions (no chat template: multi-turn and empty messages not sent)"
    summary = f"functional: {ok}/{len(results)} cases pass ({route})"
    if problems:
        summary += f"; FAIL: {problems[0]}" + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else "")
    cannot = [w for w in warnings if "cannot judge" in w]
    if cannot:
        summary += f"; cannot judge: {len(cannot)} check(s), e.g. {cannot[0]}"
    return LayerResult("functional", "fail" if problems else "pass", summary, problems,
                       {"route": "chat" if chat else "completions", "max_model_len": ep.max_model_len,
                        "cases": [r.to_json() for r in results],
                        "warnings": warnings})
