"""--dataset: a JSONL file (deployctl.bench.workload) or ShareGPT JSON (deployctl.bench.sharegpt), told apart by
the first character (a JSON array is ShareGPT)."""
from __future__ import annotations

from pathlib import Path

from deployctl.bench.sharegpt import looks_like_sharegpt, parse_sharegpt
from deployctl.bench.workload import BenchRequest, load_jsonl
from deployctl.errors import ConfigError


def load_dataset(path: Path, default_max_tokens: int, max_tokens_override: int | None = None) -> list[BenchRequest]:
    """Requests from ``path``; ShareGPT answers set max_tokens unless ``max_tokens_override``. Raises ConfigError."""
    try:
        with open(path, encoding="utf-8") as f:
            head = f.read(4096)
    except (OSError, UnicodeDecodeError):
        return load_jsonl(path, default_max_tokens)  # it words the error
    if looks_like_sharegpt(head):
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise ConfigError(f"dataset {path}: {err}", fix="pass a readable UTF-8 ShareGPT JSON file") from None
        return parse_sharegpt(text, path, max_tokens_override)
    return load_jsonl(path, default_max_tokens)
