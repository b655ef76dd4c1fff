"""Golden prompts and their answers: the prompt set the canary and stable releases are both asked, greedily.

Engine-agnostic: everything here takes a base URL (``http://host:port``, no /v1), an API key, the model name and
whether the model has a chat template, nothing runtime-specific. With a chat template the prompts go to
/v1/chat/completions as one user message; without one to /v1/completions as plain text.

Requests are greedy (``temperature 0``, ``top_p 1``, a fixed ``seed``) with a fixed ``max_tokens``. They ask for the
output token ids (``return_token_ids``, vLLM's extension) and per-token strings (``logprobs``) so that answers are
compared token by token; an engine that rejects those fields (HTTP 400) is asked again without them and its
answers are compared on text pieces (``text_pieces``) instead.

Prompt file (``rollout.analysis.outputs.prompts``): JSON lines, each ``{"messages": [...]}`` (chat) or
``{"prompt": "..."}`` (completion), optionally with ``"id"``. A chat line sent to a model without a chat template
is joined into one text; a prompt line sent to a chat model becomes one user message.
"""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

import httpx

from deployctl.errors import ConfigError

PROBE_HEADER = "X-Deployctl-Probe"  # marks deployctl's own requests (golden prompts and probes)

# The default set: short, varied requests (facts, lists, code, translation, arithmetic, a story, non-ASCII text)
# whose greedy continuations exercise the chat template, the tokenizer's byte handling and the stop tokens.
DEFAULT_PROMPTS = (
    "What is the capital of France?",
    "List the days of the week.",
    "Write a haiku about the sea.",
    "Explain what a key-value cache is in one sentence.",
    "def fibonacci(n):",
    "Translate to French: the coffee is hot.",
    "What is 17 plus 25?",
    "Once upon a time, in a small village by the sea,",
    "Name three primary colours.",
    "Summarise: continuous batching lets new requests join a running batch at every step.",
    "Schöne Grüße aus München, die Straße ist naß.",
    "中文：今天天气很好，我们去公园散步吧。",
    "Give an example of a JSON object with two keys.",
    "Why is the sky blue?",
    "Count from one to ten.",
    "Emoji: 😊 🚀 — describe them.",
)


@dataclass(frozen=True)
class Prompt:
    """One golden prompt: ``messages`` (chat) or ``prompt`` (completion text); ``id`` names it in reasons."""

    id: str
    messages: Optional[list[dict[str, Any]]] = None
    prompt: Optional[str] = None

    def as_text(self) -> str:
        if self.prompt is not None:
            return self.prompt
        return "\n".join(str(m.get("content", "")) for m in self.messages or [])

    def as_messages(self) -> list[dict[str, Any]]:
        return self.messages if self.messages is not None else [{"role": "user", "content": self.prompt or ""}]

    def label(self) -> str:
        text = self.as_text().replace("\n", " ")
        return f"prompt {self.id} ({text[:40]!r}{'…' if len(text) > 40 else ''})"


def default_prompts() -> list[Prompt]:
    """The shipped set (16 prompts), ids ``1``..``16``."""
    return [Prompt(str(i + 1), prompt=p) for i, p in enumerate(DEFAULT_PROMPTS)]


def load_prompts(path: str | Path) -> list[Prompt]:
    """Prompts from a JSON-lines file (module doc). Raises ConfigError naming the file and line."""
    p = Path(path)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"rollout.analysis.outputs.prompts: cannot read {p}: {e}",
                          fix="point it at a JSON-lines file of {\"messages\": [...]} or {\"prompt\": \"...\"}") from None
    out: list[Prompt] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            if not isinstance(rec, dict):
                raise ValueError("not an object")
            msgs, text = rec.get("messages"), rec.get("prompt")
            if msgs is not None and not (isinstance(msgs, list) and msgs and all(
                    isinstance(m, dict) and isinstance(m.get("content"), str) for m in msgs)):
                raise ValueError("messages must be a non-empty list of {role, content}")
            if text is not None and not isinstance(text, str):
                raise ValueError("prompt must be a string")
            if (msgs is None) == (text is None):
                raise ValueError("needs exactly one of messages or prompt")
        except ValueError as e:
            raise ConfigError(f"{p}:{n}: not a golden prompt line: {e}",
                              fix='each line: {"messages": [{"role": "user", "content": "..."}]} or {"prompt": "..."}') from None
        out.append(Prompt(str(rec.get("id", n)), messages=msgs, prompt=text))
    if not out:
        raise ConfigError(f"{p}: no prompts in the file", fix="add at least one JSON line, or remove outputs.prompts")
    return out


@dataclass
class Answer:
    """One greedy answer. ``tokens``: the output as token strings (from logprobs), else text pieces; ``token_ids``
    when the engine returned them; ``level``: ``token`` or ``text`` (what ``tokens`` holds); ``error``: why there is
    no answer (None on success)."""

    text: str = ""
    tokens: list[str] = field(default_factory=list)
    token_ids: Optional[list[int]] = None
    finish_reason: Optional[str] = None
    completion_tokens: int = 0
    level: str = "text"
    error: Optional[str] = None

    @property
    def units(self) -> list:
        """What agreement compares: token ids when known, else the token strings."""
        return list(self.token_ids) if self.token_ids is not None else list(self.tokens)

    def to_json(self) -> dict:
        return asdict(self)


def text_pieces(text: str) -> list[str]:
    """Words with their leading whitespace: the comparison unit when an engine returns no tokens."""
    return re.findall(r"\s*\S+|\s+", text)


def _body(model: str, prompt: Prompt, chat: bool, max_tokens: int, extras: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "temperature": 0, "top_p": 1, "seed": 0}
    if chat:
        body["messages"] = prompt.as_messages()
    else:
        body["prompt"] = prompt.as_text()
    if extras:
        body["return_token_ids"] = True
        body["logprobs"] = True if chat else 0
    return body


def parse_answer(data: Any, chat: bool) -> Answer:
    """An Answer from an OpenAI-shaped (chat) completion body. Raises ValueError on another shape."""
    ch = data["choices"][0]
    text = (ch["message"].get("content") or "") if chat else (ch.get("text") or "")
    if not isinstance(text, str):
        raise ValueError("output text is not a string")
    a = Answer(text=text, finish_reason=ch.get("finish_reason"))
    ids = ch.get("token_ids")
    if isinstance(ids, list) and all(isinstance(i, int) for i in ids):
        a.token_ids = ids
    lp = ch.get("logprobs") or {}
    toks = ([c.get("token", "") for c in lp.get("content") or []] if chat else list(lp.get("tokens") or []))
    if toks and all(isinstance(t, str) for t in toks):
        a.tokens, a.level = toks, "token"
    else:
        a.tokens = text_pieces(text)
        a.level = "token" if a.token_ids is not None else "text"
    usage = data.get("usage") or {}
    n = usage.get("completion_tokens")
    a.completion_tokens = n if isinstance(n, int) else len(a.token_ids if a.token_ids is not None else a.tokens)
    return a


def ask(client: httpx.Client, base_url: str, model: str, prompt: Prompt, *, chat: bool, max_tokens: int,
        api_key: Optional[str] = None) -> Answer:
    """One greedy request (module doc). Never raises for HTTP or network failures: the Answer's ``error`` says."""
    url = base_url.rstrip("/") + ("/v1/chat/completions" if chat else "/v1/completions")
    headers = {PROBE_HEADER: "golden"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    for extras in (True, False):
        try:
            r = client.post(url, json=_body(model, prompt, chat, max_tokens, extras), headers=headers)
        except httpx.HTTPError as e:
            return Answer(error=f"{type(e).__name__}: {e}"[:200])
        if r.status_code in (400, 422) and extras:
            # an engine without return_token_ids/logprobs (transformers serve: 422 for unknown fields): ask again,
            # compare text
            continue
        if r.status_code != 200:
            return Answer(error=f"HTTP {r.status_code}: {r.text[:160]}")
        try:
            return parse_answer(r.json(), chat)
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            return Answer(error=f"unexpected answer body: {r.text[:160]}")
    return Answer(error="unreachable")


def collect(base_url: str, model: str, prompts: list[Prompt], *, chat: bool, max_tokens: int,
            api_key: Optional[str] = None, timeout: float = 60, should_stop=None,
            out: Optional[list[Answer]] = None) -> list[Answer]:
    """Every prompt's answer from one server, one request at a time (batching can flip greedy ties on GPUs).
    Stops early after 3 failures in a row (a server that stopped answering), or when ``should_stop()`` is true;
    the rest get that error. ``out``: the list the answers are appended to as they come (another thread may read
    how far it got); returned."""
    out = [] if out is None else out
    with httpx.Client(timeout=httpx.Timeout(timeout), trust_env=False) as client:
        for p in prompts:
            if should_stop is not None and should_stop():
                out.append(Answer(error="stopped"))
                continue
            if len(out) >= 3 and all(a.error for a in out[-3:]):
                out.append(Answer(error=out[-1].error))
                continue
            out.append(ask(client, base_url, model, p, chat=chat, max_tokens=max_tokens, api_key=api_key))
    return out
