"""deploy.yaml read and validated: ``load_config(path)`` is the only entry point.

Every error raised is a ``ConfigError`` (exit 3) whose message names the file, the line, the dotted key, the bad
value and what is allowed; unknown keys get a "did you mean".
"""
from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from deployctl.errors import ConfigError
from deployctl.config.models import DeployConfig
from deployctl.config.yamlsource import parse_yaml


def _allowed_keys(model: type[BaseModel], loc: tuple) -> list[str]:
    """Field names of the model that owns the last element of ``loc``."""
    current: Any = model
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = current.model_fields.get(part) if isinstance(current, type) and issubclass(current, BaseModel) else None
        if field is None:
            return []
        ann = field.annotation
        for cand in (ann, *getattr(ann, "__args__", ())):
            for inner in (cand, *getattr(cand, "__args__", ())):
                if isinstance(inner, type) and issubclass(inner, BaseModel):
                    current = inner
                    break
    return list(current.model_fields) if isinstance(current, type) and issubclass(current, BaseModel) else []


def _format_error(err: dict, source: str, lines: dict[tuple, int]) -> str:
    loc = tuple(err["loc"])
    dotted = ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in loc).replace(".[", "[") or "(top level)"
    line = None
    for cut in range(len(loc), -1, -1):
        if loc[:cut] in lines:
            line = lines[loc[:cut]]
            break
    where = f"{source}:{line}" if line else source
    if err["type"] == "extra_forbidden":
        allowed = _allowed_keys(DeployConfig, loc)
        guess = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
        hint = f"did you mean {guess[0]!r}?" if guess else f"allowed keys: {', '.join(allowed)}"
        return f"{where}: unknown key {dotted!r}; {hint}"
    if err["type"] == "missing":
        return f"{where}: {dotted} is required; add it (see the example deploy.yaml from `deployctl init`)"
    msg = err["msg"].removeprefix("Value error, ")
    if not loc:  # a cross-key check: its message names the keys
        return f"{where}: {msg}"
    value = err.get("input")
    # the message may name the value itself (parse_duration's does): say it once
    shown = ("" if isinstance(value, (dict, list)) or value is None or f"got {value!r}" in msg
             else f" (got {value!r})")
    return f"{where}: {dotted}: {msg}{shown}"


def parse_config(text: str, source: str = "deploy.yaml") -> DeployConfig:
    """Parse deploy.yaml text. Raises ConfigError (exit 3) naming source:line, key, value and fix."""
    data, lines = parse_yaml(text, source)
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping with service, model, engine, server, hosts; got {type(data).__name__}")
    try:
        return DeployConfig.model_validate(data)
    except ValidationError as exc:
        messages = [_format_error(e, source, lines) for e in exc.errors()]
        more = f" (and {len(messages) - 1} more: {'; '.join(messages[1:])})" if len(messages) > 1 else ""
        raise ConfigError(messages[0] + more) from None


def load_config(path: str | Path) -> DeployConfig:
    """Read and validate deploy.yaml at ``path``. Raises ConfigError (exit 3)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{p}: no such file", fix="run `deployctl init MODEL_DIR` to write one, or pass -c PATH") from None
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{p}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start})",
                          fix="save the file as UTF-8") from None
    return parse_config(text, str(p))
