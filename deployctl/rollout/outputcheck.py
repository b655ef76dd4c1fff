"""Judging the canary's golden answers against stable's (deployctl.rollout.golden): plain data in, a report out.

Agreement (``mode``): ``exact`` — a prompt agrees when its output tokens are identical; at least
``min_exact_share`` of the prompts must. ``prefix`` (another engine or dtype, where greedy ties legitimately
flip) — a prompt agrees when the first ``min_prefix_tokens`` tokens are identical (or the whole answer, when
shorter); at least ``min_prefix_share`` must. ``skip`` — the weights changed on purpose; not compared.

Degenerate answers, judged whatever the mode, each against stable's answer to the same prompt as the reference
of healthy (a tiny or odd model may loop or stop by itself; only what stable did not do counts): empty text; a
run of one token or n-gram (n ≤ 4) repeated ``max_repeats`` times back to back; U+FFFD or lone surrogates
(invalid UTF-8); mostly token id 0; ``finish_reason`` ``length`` where stable stopped. Over the set: the mean
output length ratio canary/stable outside [``min_length_ratio``, ``max_length_ratio``]. A canary error where
stable answered fails; prompts stable could not answer are left out; none left: inconclusive.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Optional

from deployctl.rollout.golden import Answer, Prompt, text_pieces

NGRAM_MAX = 4


@dataclass(frozen=True)
class Rules:
    mode: str = "exact"  # exact | prefix | skip
    why: str = ""  # why this mode (shown in the report)
    min_exact_share: float = 1.0
    min_prefix_tokens: int = 8
    min_prefix_share: float = 0.9
    max_repeats: int = 8
    min_length_ratio: float = 0.5
    max_length_ratio: float = 2.0


@dataclass
class OutputReport:
    """The comparison of one canary host with stable. ``diffs``: per disagreeing prompt ``{"prompt", "at",
    "stable", "canary"}`` (token strings from the first difference on); ``problems``: one line per failed check."""

    canary_host: str
    stable_host: str
    result: str  # pass | fail | inconclusive | changed (failed agreement only, outputs.on_change report)
    mode: str
    why: str
    total: int
    compared: int = 0
    identical: int = 0
    agreeing: int = 0
    problems: list[str] = field(default_factory=list)
    diffs: list[dict] = field(default_factory=list)
    length_ratio: Optional[float] = None
    level: str = "token"
    prefix_tokens: int = 8
    reason: str = ""
    changed: bool = False  # the agreement rule (exact or prefix share) failed: the answers differ from stable's

    def to_json(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        unit = "tokens" if self.level == "token" else "text"
        if self.result == "inconclusive":
            return f"outputs on {self.canary_host}: inconclusive: {self.reason}"
        if self.mode == "skip":
            head = (f"outputs: agreement not checked on {self.canary_host} ({self.why}); "
                    f"{self.compared}/{self.total} answers checked for degenerate output")
        else:
            head = (f"outputs: {self.identical}/{self.compared} prompts identical on {self.canary_host}"
                    + (f", {self.agreeing}/{self.compared} share the first {self.prefix_tokens} {unit}" if self.mode == "prefix" else "")
                    + f" ({self.mode}: {self.why})")
        if self.length_ratio is not None:
            head += f", length ratio {self.length_ratio:.2f}"
        return head + {"fail": f"; FAIL: {self.reason}", "changed": f"; CHANGED: {self.reason}"}.get(self.result, "")


def repeated_run(units: list, max_repeats: int) -> Optional[tuple[int, int]]:
    """(start, n) of the first unit sequence of length n ≤ 4 repeated ``max_repeats`` times back to back, else None."""
    L = len(units)
    for n in range(1, NGRAM_MAX + 1):
        need = n * max_repeats
        if need > L:
            break
        for start in range(0, L - need + 1):
            gram = units[start:start + n]
            if all(units[start + k * n:start + (k + 1) * n] == gram for k in range(1, max_repeats)):
                return start, n
    return None


def bad_text(text: str) -> bool:
    """U+FFFD (what invalid UTF-8 decodes to) or a lone surrogate in the text."""
    return "\ufffd" in text or any(0xD800 <= ord(c) <= 0xDFFF for c in text)


def zero_garbage(a: Answer) -> bool:
    ids = a.token_ids or []
    return len(ids) >= 4 and sum(1 for i in ids if i == 0) * 2 >= len(ids)


def common_prefix(a: list, b: list) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _shown(a: Answer, at: int, k: int = 4) -> list[str]:
    toks = a.tokens if a.token_ids is None or len(a.tokens) == len(a.token_ids) else [f"#{i}" for i in a.token_ids]
    return toks[at:at + k]


def diff_line(d: dict) -> str:
    """``prompt 3 ('…'): first difference at token 4: stable 'a' ' b' | canary 'x' ' y'``."""
    def fmt(ts):
        return " ".join(repr(t) for t in ts) if ts else "(end)"
    return f"{d['label']}: first difference at token {d['at']}: stable {fmt(d['stable'])} | canary {fmt(d['canary'])}"


def degenerate_signs(a: Answer, max_repeats: int) -> dict[str, str]:
    """The signs of a degenerate answer, by check: ``empty`` (no visible text), ``repetition`` (a token or n-gram,
    n <= 4, ``max_repeats`` times back to back: what repeats and from which token), ``invalid_utf8`` (U+FFFD or a
    lone surrogate), ``zero_tokens`` (mostly token id 0). {} for a healthy answer. The one home of these rules:
    the canary comparison counts the signs stable does not show; ``deployctl validate`` counts them all."""
    out: dict[str, str] = {}
    if not a.text.strip():
        out["empty"] = "answered empty text"
    run = repeated_run(a.units, max_repeats)
    if run:
        start, n = run
        unit = a.tokens[start:start + n] if a.token_ids is None or len(a.tokens) == len(a.token_ids) else a.units[start:start + n]
        out["repetition"] = f"repeats {' '.join(repr(t) for t in unit)} {max_repeats}+ times from token {start}"
    if bad_text(a.text):
        out["invalid_utf8"] = "text has U+FFFD or invalid UTF-8"
    if zero_garbage(a):
        out["zero_tokens"] = "output is mostly token id 0"
    return out


def _degenerate(p: Prompt, s: Answer, c: Answer, rules: Rules) -> list[str]:
    cs, ss = degenerate_signs(c, rules.max_repeats), degenerate_signs(s, rules.max_repeats)
    out = []
    if "empty" in cs and "empty" not in ss:
        out.append(f"{p.label()}: canary answered empty text (stable {len(s.units)} tokens)")
    if "repetition" in cs and "repetition" not in ss:
        out.append(f"{p.label()}: canary {cs['repetition']} (stable does not)")
    for check in ("invalid_utf8", "zero_tokens"):
        if check in cs and check not in ss:
            out.append(f"{p.label()}: canary {cs[check]}")
    if c.finish_reason == "length" and s.finish_reason == "stop":
        out.append(f"{p.label()}: canary ran to max_tokens (finish_reason length) where stable stopped")
    return out


def compare(prompts: list[Prompt], stable: list[Answer], canary: list[Answer], rules: Rules, *,
            canary_host: str = "canary", stable_host: str = "stable") -> OutputReport:
    """Judge one canary host's answers (rules in the module doc). The lists are parallel to ``prompts``."""
    rep = OutputReport(canary_host, stable_host, "pass", rules.mode, rules.why, len(prompts))
    rep.prefix_tokens = rules.min_prefix_tokens
    s_tokens = c_tokens = 0
    levels = set()
    for p, s, c in zip(prompts, stable, canary):
        if s.error:
            continue
        if c.error:
            rep.problems.append(f"{p.label()}: the canary did not answer ({c.error})")
            continue
        rep.compared += 1
        same_level = s.level == c.level == "token" and (s.token_ids is None) == (c.token_ids is None)
        levels.add("token" if same_level else "text")
        s_tokens += s.completion_tokens
        c_tokens += c.completion_tokens
        rep.problems.extend(_degenerate(p, s, c, rules))
        # one side gave tokens, the other text only (e.g. runtime stable, transformers canary): compare text pieces
        su, cu = (s.units, c.units) if same_level else (text_pieces(s.text), text_pieces(c.text))
        at = common_prefix(su, cu)
        if su == cu:
            rep.identical += 1
            rep.agreeing += 1
            continue
        if at >= min(rules.min_prefix_tokens, max(len(su), len(cu))):
            rep.agreeing += 1
        if len(rep.diffs) < 16:
            rep.diffs.append({"prompt": p.id, "label": p.label(), "at": at, "stable": _shown(s, at), "canary": _shown(c, at)})
    rep.level = "text" if "text" in levels else "token"
    if rep.compared == 0 and not rep.problems:
        rep.result = "inconclusive"
        rep.reason = (f"stable ({stable_host}) answered none of the {len(prompts)} prompts"
                      + (f" ({next(a.error for a in stable if a.error)})" if any(a.error for a in stable) else ""))
        return rep
    if s_tokens > 0:
        rep.length_ratio = c_tokens / s_tokens
        if not rules.min_length_ratio <= rep.length_ratio <= rules.max_length_ratio:
            rep.problems.append(f"mean output length ratio canary/stable {rep.length_ratio:.2f} outside "
                                f"[{rules.min_length_ratio:g}, {rules.max_length_ratio:g}] ({c_tokens} vs {s_tokens} tokens)")
    if rules.mode == "exact" and rep.compared and rep.identical < rules.min_exact_share * rep.compared:
        rep.changed = True
        rep.problems.append(f"{rep.identical}/{rep.compared} prompts identical < min_exact_share "
                            f"{rules.min_exact_share:g}; " + diff_line(rep.diffs[0]))
    if rules.mode == "prefix" and rep.compared and rep.agreeing < rules.min_prefix_share * rep.compared:
        first = next((d for d in rep.diffs if d["at"] < rules.min_prefix_tokens), rep.diffs[0])
        rep.changed = True
        rep.problems.append(f"{rep.agreeing}/{rep.compared} prompts share the first {rules.min_prefix_tokens} tokens "
                            f"< min_prefix_share {rules.min_prefix_share:g}; " + diff_line(first))
    if rep.problems:
        rep.result = "fail"
        rep.reason = rep.problems[0] + (f" (+{len(rep.problems) - 1} more)" if len(rep.problems) > 1 else "")
    return rep
