"""Incremental detokenization that never emits half a UTF-8 character (case C06).

Byte-level BPE tokens can end in the middle of a multi-byte character; decoding them one at a time yields U+FFFD.
We keep two offsets into the generated ids, as vLLM and TGI do: `prefix_offset` (start of a short window decoded
for context, so merges and leading spaces decode as in the full text) and `read_offset` (end of what was already
emitted). Each step decodes window[prefix:] and window[prefix:read]; the difference is new text, emitted only when
it does not end in U+FFFD (an incomplete UTF-8 tail waits for its next byte). `flush()` at the end emits whatever
is left, decoded the same way in streaming and non-streaming mode, so both produce identical text byte for byte.
"""
from __future__ import annotations

from typing import Protocol, Sequence

REPLACEMENT = "\ufffd"


class _Decoder(Protocol):  # tokenizers.Tokenizer satisfies this
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas.

    Args:
        tokenizer: anything with `decode(ids, skip_special_tokens=...)` (a `tokenizers.Tokenizer`).
        prompt_ids: the prompt's ids; the last few give the first output token its context (leading spaces).
        skip_special_tokens: drop special tokens (eos, chat markers) from the text.
    """

    CONTEXT_TOKENS = 5

    def __init__(self, tokenizer: _Decoder, prompt_ids: Sequence[int] = (), skip_special_tokens: bool = True):
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = list(prompt_ids[-self.CONTEXT_TOKENS :])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self.text = ""  # everything emitted so far

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=self._skip)

    def add(self, token_ids: Sequence[int]) -> str:
        """Append new token ids; return the text that is now complete (possibly "")."""
        self._ids.extend(token_ids)
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        full_text = self._decode(self._ids[self._prefix_offset :])
        if len(full_text) <= len(prefix_text) or full_text.endswith(REPLACEMENT):
            return ""  # nothing new yet, or an incomplete UTF-8 sequence at the end: wait for more bytes
        delta = full_text[len(prefix_text) :]
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        self.text += delta
        return delta

    def flush(self) -> str:
        """Emit the held tail at the end of generation (invalid bytes become U+FFFD, as a full decode would)."""
        if self._read_offset >= len(self._ids):
            return ""
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        full_text = self._decode(self._ids[self._prefix_offset :])
        delta = full_text[len(prefix_text) :]
        self._prefix_offset = self._read_offset = len(self._ids)
        self.text += delta
        return delta
