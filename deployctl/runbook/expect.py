"""Expected conditions: ``OP VALUE`` strings a step's observed value is compared with.

Forms: ``== V``, ``!= V``, ``< N``, ``<= N``, ``> N``, ``>= N`` (numbers compare as floats, anything else as
text), ``in [a, b]``, ``not in [a, b]``, ``matches REGEX`` (search), ``is true`` / ``is false``,
``is none`` / ``is not none``. V may hold ``{variables}``; they are filled in before comparing.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

_FORM = re.compile(r"^\s*(==|!=|<=|>=|<|>|not in|in|matches|is not|is)\s+(.+?)\s*$", re.S)
_ORDER = {"<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b}


@dataclass(frozen=True)
class Expect:
    """A parsed expected condition. ``text`` is what the runbook says (shown in tables and audit)."""

    op: str
    operand: str
    text: str

    @classmethod
    def parse(cls, text: str) -> "Expect":
        """Parse ``text``. Raises ValueError naming the text and the allowed forms."""
        m = _FORM.match(str(text))
        if not m:
            raise ValueError(
                f"expect {text!r} is not a condition; write one of: == V, != V, < N, <= N, > N, >= N, "
                "in [a, b], not in [a, b], matches REGEX, is true, is false, is none, is not none"
            )
        op, operand = m.group(1), m.group(2)
        if op in ("is", "is not") and operand.lower() not in ("true", "false", "none"):
            raise ValueError(f"expect {text!r}: 'is' takes true, false or none")
        if op in ("in", "not in") and not (operand.startswith("[") and operand.endswith("]")):
            raise ValueError(f"expect {text!r}: 'in' takes a list like [free, runtime]")
        if op == "matches":
            try:  # {variables} are filled in at run time: check the pattern around them
                re.compile(re.sub(r"\{[^{}]*\}", "x", operand))
            except re.error as exc:
                raise ValueError(f"expect {text!r}: 'matches' takes a regular expression: {exc}") from None
        return cls(op, operand, str(text).strip())

    def holds(self, observed: Any, fill: Callable[[str], str] = lambda s: s) -> bool:
        """True when ``observed`` meets the condition. ``fill`` substitutes variables in the operand.
        A number condition on a non-number (e.g. None: nothing observed) is False."""
        operand = fill(self.operand)
        if self.op == "is":
            return _is(observed, operand.lower())
        if self.op == "is not":
            return not _is(observed, operand.lower())
        if self.op in ("in", "not in"):
            items = [i.strip().strip("'\"") for i in operand[1:-1].split(",") if i.strip()]
            inside = _text(observed) in items
            return inside if self.op == "in" else not inside
        if self.op == "matches":
            return observed is not None and re.search(operand, _text(observed)) is not None
        a, b = _number(observed), _number(operand)
        if self.op in ("==", "!="):
            same = (a == b) if a is not None and b is not None else _text(observed) == operand.strip("'\"")
            return same if self.op == "==" else not same
        if a is None or b is None:
            return False
        return _ORDER[self.op](a, b)


def _is(observed: Any, word: str) -> bool:
    if word == "none":
        return observed is None
    return isinstance(observed, bool) and observed is (word == "true")


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return "none" if value is None else str(value)
