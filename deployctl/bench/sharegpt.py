"""ShareGPT-format datasets, what the field's serving benchmarks read (vllm bench serve --dataset-name sharegpt):
a JSON array of ``{"id", "conversations": [{"from": "human", "value": ...}, {"from": "gpt", "value": ...}, ...]}``.

As vLLM's sampler: the first human turn is the prompt and the turn after it the reference answer, whose length
sets ``max_tokens``; conversations with fewer than two turns are skipped. There is no tokenizer here: the answer's
length in tokens is estimated as 4/3 tokens per word (OpenAI's rule of thumb, 100 tokens ~= 75 English words).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from deployctl.bench.workload import BenchRequest
from deployctl.errors import ConfigError

TOKENS_PER_WORD = 4 / 3
HUMAN = {"human", "user"}
ASSISTANT = {"gpt", "assistant", "chatgpt", "bard", "model"}


def looks_like_sharegpt(text: str) -> bool:
    """A JSON array (JSONL files hold one object per line)."""
    return text.lstrip().startswith("[")


def parse_sharegpt(text: str, path: Path, max_tokens_override: int | None = None) -> list[BenchRequest]:
    """Requests from ShareGPT JSON ``text`` (read from ``path``). ``max_tokens_override`` replaces the answers'
    lengths. Raises ConfigError naming the file when it is not ShareGPT or holds no usable conversation."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(f"dataset {path}: not JSON ({err.msg} at line {err.lineno})",
                          fix="pass a ShareGPT JSON array or a JSONL file") from None
    out = []
    for conv in data if isinstance(data, list) else []:
        turns = conv.get("conversations") if isinstance(conv, dict) else None
        if not isinstance(turns, list):
            continue
        pair = _first_exchange(turns)
        if pair is None:
            continue
        prompt, answer = pair
        est = max(1, math.ceil(len(answer.split()) * TOKENS_PER_WORD))
        out.append(BenchRequest(prompt=prompt, messages=None, max_tokens=max_tokens_override or est))
    if not out:
        raise ConfigError(f"dataset {path}: no ShareGPT conversation with a human turn and an answer",
                          fix='entries like {"conversations": [{"from": "human", "value": "..."}, '
                              '{"from": "gpt", "value": "..."}]}')
    return out


def _first_exchange(turns: list) -> tuple[str, str] | None:
    for i, turn in enumerate(turns[:-1]):
        nxt = turns[i + 1]
        if not (isinstance(turn, dict) and isinstance(nxt, dict)):
            return None
        if (turn.get("from") in HUMAN and nxt.get("from") in ASSISTANT and isinstance(turn.get("value"), str)
                and isinstance(nxt.get("value"), str) and turn["value"].strip()):
            return turn["value"], nxt["value"]
    return None
