"""From an HTTP request to engine requests and back: validation, admission, and the text of each choice.

`prepare()` does all validation before the first byte (C03): body, model name, prompt tokens vs the vocabulary,
context length, back-pressure, the engine's own admission check. `Generation` turns engine outputs into per-choice
text deltas: incremental detokenizer (C06), stop strings with hold-back (C05), request timeout, and on any exit
(finished, stop string, timeout, client gone) aborts what is still running so its blocks are freed (C07).

Context-length rule (C03 d; the offline API's too, sampling_params.context_length_error): prompt >= max_model_len
is rejected (param "prompt"/"messages"); an explicit max_tokens with prompt + max_tokens > max_model_len is
rejected naming both (param "max_tokens"); an omitted max_tokens defaults to the remaining context
(at most --max-completion-tokens; a prompt above --max-prompt-tokens or max_tokens above --max-completion-tokens is a
400 naming the cap). A text so long
that it cannot fit whatever the tokenizer does is rejected the same way before tokenizing (`_check_text_bound`).

Choices: a list of prompts times k gives engine choice prompt_i * k + j, k = best_of or n; with a seed, choice j
samples with seed + j (reproducible, yet distinct). best_of > n keeps, per prompt, the n choices with the highest
cumulative logprob (responses.py). The BOS is added once on every path (tokenizer.encode_prompt).
"""
from __future__ import annotations

import itertools
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from deployctl_runtime.sampling_params import context_length_error
from deployctl_runtime.tokenizer import encode_prompt

from . import params as sampling
from .detokenizer import IncrementalDetokenizer
from .chat_template import render_chat
from .errors import APIError, invalid
from .fields import check_fields
from .protocol import ChatCompletionRequest, CompletionRequest, parse_request
from .state import ServerContext
from .stop_strings import StopStringMatcher

log = logging.getLogger("deployctl_runtime.server")
_SERIAL = itertools.count()


@dataclass
class RequestRecord:
    """Per HTTP request facts for the access log and metrics (no prompt or output text)."""

    request_id: str
    arrival: float = field(default_factory=time.monotonic)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    first_token_at: float | None = None
    cached_tokens: int = 0  # prompt tokens served from the prefix cache (usage.prompt_tokens_details)
    finish_reasons: list[str] = field(default_factory=list)
    status_override: int = 0  # 499 when the client went away before the response
    key_id: str | None = None  # auth.key_id of the API key the request used (None: no keys, or refused)
    id_from_header: bool = False  # request_id is the client's X-Request-Id (a body's request_id does not replace it)


@dataclass
class Prepared:
    request: CompletionRequest | ChatCompletionRequest
    chat: bool
    prompts: list[list[int]]  # one per engine request (choice), prompt i * k + j (k = best_of or n)
    params: list[Any]  # SamplingParams per engine request
    sub_ids: list[str]
    want_logprobs: int | None = None  # what the client asked for (best_of forces the engine to compute them)
    per_prompt: int = 1  # k: engine choices per prompt
    tools: Any = None  # tools.ToolMode | None


def new_request_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex


def adopt_body_request_id(rec: RequestRecord, req: Any, chat: bool) -> None:
    """vLLM's `request_id` field names the response ("cmpl-"/"chatcmpl-" + it), the X-Request-Id header, the
    access log and the request's log lines; a client's X-Request-Id header wins, as in vLLM."""
    if req.request_id is not None and not rec.id_from_header:
        rec.request_id = ("chatcmpl-" if chat else "cmpl-") + req.request_id


def _check_text_bound(ctx: ServerContext, text: str, param: str) -> None:
    """Reject, before tokenizing, a text that has at least max_model_len tokens whatever the tokenizer does.

    No token covers more than ctx.max_token_chars characters of the normalized text, and pre-tokenizers may drop
    whitespace, so tokens >= non-whitespace characters / max_token_chars. Tokenizing megabytes holds the GIL for
    seconds to minutes (BPE is superlinear on a long word), stalling every other request and /healthz."""
    bound = ctx.max_model_len * max(ctx.max_token_chars, 1)
    if len(text) < bound:
        return
    norm = ctx.tokenizer.normalizer.normalize_str(text) if ctx.tokenizer.normalizer is not None else text
    visible = len(norm) - sum(norm.count(c) for c in " \t\n\r")
    if visible >= bound:
        raise invalid(f"This model's maximum context length is {ctx.max_model_len} tokens. However, your {param} has "
                      f"{len(text)} characters, at least {visible // max(ctx.max_token_chars, 1)} tokens; shorten it "
                      f"to under {ctx.max_model_len} tokens.", param, "context_length_exceeded")


def _tokenize_prompts(ctx: ServerContext, req: Any, chat: bool, tools=None) -> list[list[int]]:
    tok, bos = ctx.tokenizer, ctx.bos_token_id
    if chat:
        if ctx.chat_template is None:
            raise invalid("this model has no chat template; use /v1/completions", "messages", "no_chat_template")
        text = render_chat(ctx.chat_template, req.messages, req.add_generation_prompt, req.chat_template_kwargs,
                           None if tools is None else tools.template_tools)
        _check_text_bound(ctx, text, "messages")
        return [encode_prompt(tok, text, bos, add_special_tokens=False)]
    p = req.prompt
    if isinstance(p, str):
        _check_text_bound(ctx, p, "prompt")
        return [encode_prompt(tok, p, bos)]
    if all(isinstance(x, int) for x in p):
        return [list(p)]
    for x in p:
        if isinstance(x, str):
            _check_text_bound(ctx, x, "prompt")
    return [encode_prompt(tok, x, bos) if isinstance(x, str) else list(x) for x in p]


def _truncate(ctx: ServerContext, req: Any, prompts: list[list[int]]) -> list[list[int]]:
    """vLLM's truncate_prompt_tokens: each prompt keeps its last k tokens (-1: k = max_model_len; truncation from
    the left, vLLM's default side). k above max_model_len is 400 naming the field."""
    k = req.truncate_prompt_tokens
    if k is None:
        return prompts
    if k > ctx.max_model_len:
        raise invalid(f"'truncate_prompt_tokens': {k} is above the model's context length {ctx.max_model_len}; "
                      f"send at most {ctx.max_model_len} (or -1)", "truncate_prompt_tokens")
    k = ctx.max_model_len if k == -1 else k
    return [ids[-k:] for ids in prompts]


def _check_lengths(ctx: ServerContext, req: Any, prompts: list[list[int]], chat: bool) -> list[int]:
    """Return max_tokens per prompt. Raises APIError 400 context_length_exceeded (see module docstring)."""
    limit, param = ctx.max_model_len, ("messages" if chat else "prompt")
    bad_stop = next((t for t in req.stop_token_ids or [] if t >= ctx.vocab_size), None)
    if bad_stop is not None:
        raise invalid(f"'stop_token_ids': token id {bad_stop} is out of range: the vocabulary has {ctx.vocab_size} "
                      "tokens", "stop_token_ids", "invalid_token_id")
    asked = req.tokens_field
    out = []
    for ids in prompts:
        if not ids:
            raise invalid("the prompt is empty after tokenization", param, "empty_prompt")
        bad = next((t for t in ids if t >= ctx.vocab_size), None)
        if bad is not None:
            raise invalid(f"token id {bad} is out of range: the vocabulary has {ctx.vocab_size} tokens", param,
                          "invalid_token_id")
        too_long = context_length_error(len(ids), req.max_tokens, limit, param, asked)
        if too_long is not None:
            raise invalid(too_long[1], too_long[0], "context_length_exceeded")
        cap_prompt, cap_out = ctx.cfg.max_prompt_tokens, ctx.cfg.max_completion_tokens
        if cap_prompt is not None and len(ids) > cap_prompt:
            raise invalid(f"your {param} has {len(ids)} tokens, above this server's max_prompt_tokens {cap_prompt}; "
                          f"shorten it to at most {cap_prompt} tokens", param, "context_length_exceeded")
        if cap_out is not None and req.max_tokens is not None and req.max_tokens > cap_out:
            raise invalid(f"{asked} {req.max_tokens} is above this server's max_completion_tokens {cap_out}; "
                          f"lower it to at most {cap_out}", asked, "invalid_value")
        default = limit - len(ids) if cap_out is None else min(limit - len(ids), cap_out)
        out.append(req.max_tokens if req.max_tokens is not None else default)
    return out


def _check_num_choices(ctx: ServerContext, req: Any, chat: bool) -> None:
    """400 when prompts x n engine requests exceed what the server ever holds (running + queued): a 429 would make
    the client retry a request that can never be admitted."""
    p = None if chat else req.prompt
    num_prompts = len(p) if isinstance(p, list) and not all(isinstance(x, int) for x in p) else 1
    capacity = ctx.cfg.max_num_seqs + ctx.cfg.max_queued_requests
    k = max(req.n, req.best_of or 0)
    if num_prompts * k > capacity:
        raise invalid(f"this request asks for {num_prompts * k} choices ({num_prompts} prompt(s) x n {k}); "
                      f"the server holds at most {capacity} at once (--max-num-seqs {ctx.cfg.max_num_seqs} + "
                      f"--max-queued-requests {ctx.cfg.max_queued_requests}); send fewer prompts or a smaller n",
                      "n" if req.n > 1 else "prompt", "too_many_choices")


async def prepare(ctx: ServerContext, body: bytes, chat: bool, request_id: str) -> Prepared:
    """Validate everything that can be validated before generation. Raises APIError."""
    from .tools import tool_mode

    req = parse_request(ChatCompletionRequest if chat else CompletionRequest, body)
    check_fields(req.sent_fields(), chat, ctx.cfg.ignore_unknown_fields, top_level=req.top_level_names)
    if req.model is not None and req.model != ctx.served_name:
        raise APIError(404, f"The model '{req.model}' does not exist; this server serves '{ctx.served_name}' "
                       "(see /v1/models)", "not_found_error", "model", "model_not_found")
    _check_num_choices(ctx, req, chat)
    tools = tool_mode(req) if chat else None
    structured = sampling.structured_spec(req, tools)
    prompts = _truncate(ctx, req, _tokenize_prompts(ctx, req, chat, tools))
    max_tokens = _check_lengths(ctx, req, prompts, chat)
    wanted = sampling.logprobs_wanted(req, chat)
    k = max(req.n, req.best_of or 0)
    logprobs = wanted if wanted is not None or k == req.n else 0  # best_of ranks by cumulative logprob
    all_prompts, params, sub_ids = [], [], []
    serial = next(_SERIAL)  # engine ids stay unique even when clients reuse an X-Request-Id
    for i, (ids, mt) in enumerate(zip(prompts, max_tokens)):
        for j in range(k):
            params.append(sampling.build(req, chat, ctx.faults.clamp(mt), j, logprobs, structured))
            all_prompts.append(ids)
            sub_ids.append(f"{request_id}#{serial}-{i * k + j}")
    return Prepared(req, chat, all_prompts, params, sub_ids, wanted, k, tools)


@dataclass
class Choice:
    """One choice's text state. `delta` texts concatenate to `text`, for streaming and non-streaming alike."""

    index: int
    detok: IncrementalDetokenizer
    stops: StopStringMatcher
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    finish_reason: str | None = None
    error: str | None = None  # the engine's reason for finish_reason "error"
    num_output_tokens: int = 0
    last_token_at: float | None = None
    first_token_at: float | None = None

    def feed(self, token_ids: list[int], finished: bool) -> str:
        delta = self.stops.feed(self.detok.add(token_ids)) if token_ids else ""
        if finished or self.stops.stopped:
            delta += self.stops.feed(self.detok.flush())
            delta += self.stops.flush()
        self.text += delta
        return delta


@dataclass
class Event:
    index: int
    text: str
    finish_reason: str | None
    token_ids: list[int]
    logprobs: list[float] | None
    top_logprobs: list[list[tuple[int, float]]] | None = None
