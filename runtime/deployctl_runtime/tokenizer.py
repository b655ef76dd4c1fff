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

    @property
    def bos_token_id(self) -> int | None:
        return None if self.bos_token is None else self.tokenizer.token_to_id(self.bos_token)


def encode_prompt(tokenizer: Tokenizer, text: str, bos_token_id: int | None, add_special_tokens: bool = True
                  ) -> list[int]:
    """Token ids of a prompt text with the tokenizer's BOS exactly once (C22).

    The post-processor adds BOS (add_special_tokens) and a text that already starts with the BOS string (a rendered
    chat template's `{{ bos_token }}`, or a client that sends it) would carry two; the duplicate is dropped, as
    vLLM does since #27515. Chat passes add_special_tokens=False (transformers' apply_chat_template: the template
    decides), completions and the offline API pass True."""
    ids = tokenizer.encode(text, add_special_tokens=add_special_tokens).ids
    if bos_token_id is not None and len(ids) >= 2 and ids[0] == ids[1] == bos_token_id:
        ids = ids[1:]
    return ids


# GPT-2's byte-level alphabet: each byte is shown as a printable character (e.g. space -> "Ġ")
def _bytelevel_decoder() -> dict[str, int]:
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, n = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + n)] = b
            n += 1
    return chars


class TokenBytes:
    """The raw bytes of each token id, for logprobs (OpenAI's `bytes`), and text a client can show: UTF-8 decoded,
    with a partial character as `\\xNN` escapes (never byte-level markers like Ġ). Cached per id."""

    def __init__(self, tokenizer: Tokenizer):
        self._tok = tokenizer
        self._cache: dict[int, bytes] = {}
        dec = json.loads(tokenizer.to_str()).get("decoder") or {}
        kinds = {d.get("type") for d in (dec.get("decoders") or [dec])}
        self._bytelevel = _bytelevel_decoder() if "ByteLevel" in kinds else None
        self._added = {t.content for t in tokenizer.get_added_tokens_decoder().values()}
        self._special = {i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special}

    def bytes(self, token_id: int) -> bytes:
        b = self._cache.get(token_id)
        if b is None:
            piece = self._tok.id_to_token(token_id)
            if piece is None:
                b = b""
            elif piece in self._added:
                b = piece.encode()
            elif self._bytelevel is not None and all(c in self._bytelevel for c in piece):
                b = bytes(self._bytelevel[c] for c in piece)
            elif len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):  # sentencepiece byte fallback
                b = bytes([int(piece[3:5], 16)])
            else:
                b = self._tok.decode([token_id], skip_special_tokens=False).encode()
            self._cache[token_id] = b
        return b

    def is_special(self, token_id: int) -> bool:
        """True for a special token: the response text skips it (skip_special_tokens)."""
        return token_id in self._special

    def text(self, token_id: int) -> str:
        return self.bytes(token_id).decode("utf-8", errors="backslashreplace")


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
