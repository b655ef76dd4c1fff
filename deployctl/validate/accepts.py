"""Which of validate's optional fields (vLLM's extensions) an OpenAI-compatible server accepts: one probe request
per field (a one-token chat completion carrying it). A server with pydantic ``extra="forbid"`` models (Hugging Face
``transformers serve``) answers 422 naming the field; such a field is left out of every later request, and the
layers say so, instead of every case failing for a reason that is not the server's."""
from __future__ import annotations

from typing import Any

import httpx

from deployctl.validate.client import ROUTES, Endpoint

# field -> the value validate sends: return_token_ids (functional: token-level checks), ignore_eos (latency and
# stability: outputs that reach max_tokens)
OPTIONAL: dict[str, Any] = {"return_token_ids": True, "ignore_eos": True}


def refused_fields(ep: Endpoint, timeout: float = 30.0) -> tuple[tuple[str, str], ...]:
    """((field, why), ...) for each OPTIONAL field the server refuses: HTTP 400 or 422 whose body names the field.
    A field whose probe gets another answer (200, 5xx, no answer) counts as accepted: the layers judge the rest."""
    out = []
    with httpx.Client(timeout=timeout) as client:
        for name, value in OPTIONAL.items():
            body = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 1, name: value}
            if ep.model:
                body["model"] = ep.model
            try:
                r = client.post(ep.base_url + ROUTES["chat"], json=body, headers=ep.headers())
            except httpx.HTTPError:
                continue
            if r.status_code in (400, 422) and name in r.text:
                out.append((name, f"the server refuses it (HTTP {r.status_code})"))
    return tuple(out)


def left_out(ep: Endpoint) -> str:
    """One phrase for a layer's summary: what was left out and why ("" when nothing)."""
    return "; ".join(f"left out {name}: {why}" for name, why in ep.refused)
