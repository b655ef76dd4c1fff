"""Set one dotted key in deploy.yaml's text, keeping its comments and layout (the value's span is replaced,
or a line is added under its section); ``comment_above`` notes where a value came from."""
from __future__ import annotations

import yaml


def _scalar(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def set_key(text: str, dotted: str, value) -> str:
    """``text`` with ``dotted`` (``section.key``) set to ``value``. Raises ValueError when the path crosses a
    non-mapping."""
    parts = dotted.split(".")
    node = yaml.compose(text, Loader=yaml.SafeLoader)
    parent = node
    for i, part in enumerate(parts):
        if not isinstance(parent, yaml.MappingNode):
            raise ValueError(f"{'.'.join(parts[:i])} is not a mapping in deploy.yaml")
        found = next(((k, v) for k, v in parent.value if k.value == part), None)
        if found is None:
            lines = [f"{' ' * (2 * (i + j))}{p}:" for j, p in enumerate(parts[i:-1])]
            lines.append(f"{' ' * (2 * (len(parts) - 1))}{parts[-1]}: {_scalar(value)}")
            if parent is node:
                return text.rstrip("\n") + "\n" + "\n".join(lines) + "\n"
            cut = parent.end_mark.index
            while cut > 0 and text[cut - 1] == "\n":
                cut -= 1
            return text[:cut] + "\n" + "\n".join(lines) + text[cut:]
        key_node, parent = found
    if not isinstance(parent, yaml.ScalarNode):
        raise ValueError(f"{dotted} is not a single value in deploy.yaml")
    return text[: parent.start_mark.index] + _scalar(value) + text[parent.end_mark.index:]


def comment_above(text: str, dotted: str, comment: str, *, marker: str) -> str:
    """``text`` with ``# comment`` on its own line above the line holding ``dotted``'s key, at that line's indent.
    A comment line directly above that starts with ``# marker`` is replaced (re-applying does not stack them).
    Raises ValueError when the key is not in ``text`` or ``comment`` spans lines."""
    if "\n" in comment:
        raise ValueError("a comment is one line")
    node = yaml.compose(text, Loader=yaml.SafeLoader)
    key_line = None
    for i, part in enumerate(dotted.split(".")):
        found = next(((k, v) for k, v in node.value if k.value == part), None) if isinstance(node, yaml.MappingNode) else None
        if found is None:
            raise ValueError(f"{'.'.join(dotted.split('.')[:i + 1])} is not in deploy.yaml")
        key_line, node = found[0].start_mark.line, found[1]
    lines = text.splitlines(keepends=True)
    indent = lines[key_line][: len(lines[key_line]) - len(lines[key_line].lstrip(" "))]
    start = key_line
    if start > 0 and lines[start - 1].lstrip(" ").startswith(f"# {marker}"):
        start -= 1
    return "".join(lines[:start]) + f"{indent}# {comment}\n" + "".join(lines[key_line:])
