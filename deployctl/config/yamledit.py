"""Set one dotted key in deploy.yaml's text, keeping its comments and layout (the value's span is replaced,
or a line is added under its section)."""
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
