"""Command-line parameters shared by the commands: declared once, checked by their type.

``CONFIG`` (-c/--config), ``JSON`` (--json) and ``YES`` (--yes/-y) are the options most commands take; ``Seconds``
(a finite number of seconds above 0) and ``OneOf`` (one of a few words) are click parameter types whose bad
values are a deployctl UsageError: one line naming the flag, exit 2, like every other usage error.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import typer

from deployctl.errors import UsageError

CONFIG = typer.Option(Path("deploy.yaml"), "-c", "--config", help="deploy.yaml to read.")
JSON = typer.Option(False, "--json", help="Print one JSON document on stdout.")
YES = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation.")


def seconds(flag: str, example: str = "20"):
    """A typer ``parser`` for ``flag``: a duration in seconds, a finite number above 0 (``20``, ``0.5``)."""

    def parse(value: Any) -> float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = math.nan
        if not (math.isfinite(number) and number > 0):
            raise UsageError(f"{flag} {value} is not a positive number of seconds", fix=f"e.g. {flag} {example}")
        return number

    return parse


def one_of(flag: str, *choices: str):
    """A typer ``parser`` for ``flag``: one of ``choices`` (exact words)."""
    allowed = ", ".join(choices[:-1]) + f" or {choices[-1]}" if len(choices) > 1 else choices[0]

    def parse(value: Any) -> str:
        if value not in choices:
            raise UsageError(f"{flag} {value!r} is not {allowed}")
        return value

    return parse


def duration(flag: str, example: str = "10m"):
    """A typer ``parser`` for ``flag``: a duration, ``90``/``90s`` seconds, ``10m`` minutes, ``1h`` hours, above 0;
    returns seconds."""
    units = {"s": 1.0, "m": 60.0, "h": 3600.0}

    def parse(value: Any) -> float:
        text = str(value).strip().lower()
        scale = units.get(text[-1:], None)
        try:
            number = float(text[:-1] if scale else text) * (scale or 1.0)
        except ValueError:
            number = math.nan
        if not (math.isfinite(number) and number > 0):
            raise UsageError(f"{flag} {value} is not a duration", fix=f"e.g. {flag} {example} (s, m or h)")
        return number

    return parse
