"""YAML documents read by deployctl (deploy.yaml, runbooks) with the source line of every key.

``parse_yaml`` raises ConfigError (exit 3) for syntax errors (file:line:column), duplicate keys (YAML would
silently keep the last) and aliases that contain themselves.
"""
from __future__ import annotations

from typing import Any, Optional

import yaml

from deployctl.errors import ConfigError


def parse_yaml(text: str, source: str) -> tuple[Any, dict[tuple, int]]:
    """(data, {key path: 1-based line}) for ``text``; ``source`` names the file in errors."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        pos = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{pos}: YAML syntax error: {problem}", fix="fix the indentation or quoting there") from None
    try:
        lines = _line_index(node) if node is not None else {}
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc.message}", fix=exc.fix) from None
    return data, lines


def _line_index(node: yaml.Node, prefix: tuple = (), out: Optional[dict] = None,
                active: Optional[set] = None) -> dict[tuple, int]:
    """Map every key path (tuple of str/int) to its 1-based line in the YAML source.

    Raises ConfigError for a duplicate key, and for an alias that refers to a node containing it (`&a [*a]`)."""
    out = {} if out is None else out
    active = set() if active is None else active
    if id(node) in active:
        raise ConfigError(f"line {node.start_mark.line + 1}: a YAML alias refers to the node that contains it "
                          "(recursive data)", fix="use the anchor (&name) only on a node outside its alias (*name)")
    if isinstance(node, (yaml.MappingNode, yaml.SequenceNode)):
        active.add(id(node))
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            path = prefix + (key_node.value,)
            if path in out and key_node.value != "<<":
                dotted = ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in path).replace(".[", "[")
                raise ConfigError(f"duplicate key {dotted!r} on lines {out[path]} and {key_node.start_mark.line + 1}",
                                  fix="keep one of them (YAML would silently use the last)")
            out[path] = key_node.start_mark.line + 1
            _line_index(value_node, path, out, active)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            out[prefix + (i,)] = item.start_mark.line + 1
            _line_index(item, prefix + (i,), out, active)
    active.discard(id(node))
    return out
