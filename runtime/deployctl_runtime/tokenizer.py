"""Tokenizer, chat template and stop ids of an HF checkpoint directory (tokenizers library, no transformers)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer


@dataclass
class TokenizerInfo:
    tokenizer: Tokenizer
    eos_token_ids: set[int]
    chat_template: str | None
    bos_token: str | None
    eos_token: str | None


def _token_str(value) -> str | None:
    if isinstance(value, dict):  # older tokenizer_config: {"content": "</s>", ...}
        return value.get("content")
    return value


def load_tokenizer(model_dir: str | Path, config_eos_ids: tuple[int, ...] = ()) -> TokenizerInfo:
    """Read tokenizer.json, tokenizer_config.json (chat template, bos/eos strings), chat_template.jinja and
    generation_config.json (eos ids). eos ids = generation_config ∪ config.json ∪ the eos token string's id."""
    model_dir = Path(model_dir)
    path = model_dir / "tokenizer.json"
    if not path.is_file():
        raise ValueError(f"model: {path} not found; the runtime needs a fast tokenizer (tokenizer.json)")
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:  # the tokenizers library raises plain Exception for a malformed file
        raise ValueError(f"model: {path} is not a usable tokenizer.json ({exc}); re-download it") from exc
    tok_cfg = _read_json(model_dir / "tokenizer_config.json")
    gen_cfg = _read_json(model_dir / "generation_config.json")
    chat_template = tok_cfg.get("chat_template")
    if isinstance(chat_template, list):  # [{"name": "default", "template": ...}, ...]
        chat_template = next((t["template"] for t in chat_template if t.get("name") == "default"), None)
    jinja = model_dir / "chat_template.jinja"
    if chat_template is None and jinja.is_file():
        chat_template = jinja.read_text()
    bos, eos = _token_str(tok_cfg.get("bos_token")), _token_str(tok_cfg.get("eos_token"))
    eos_ids = set(config_eos_ids)
    gen_eos = gen_cfg.get("eos_token_id")
    if isinstance(gen_eos, int):
        eos_ids.add(gen_eos)
    elif isinstance(gen_eos, list):
        eos_ids.update(int(i) for i in gen_eos)
    if eos is not None and tokenizer.token_to_id(eos) is not None:
        eos_ids.add(tokenizer.token_to_id(eos))
    return TokenizerInfo(tokenizer, eos_ids, chat_template, bos, eos)


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"model: {path} is not valid JSON ({exc})") from exc
