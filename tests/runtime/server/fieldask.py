"""Asking the runtime's two endpoints with request fields: the helpers of the field-table tests
(test_field_table.py walks the table, test_field_edges.py the requests at its edges)."""
from __future__ import annotations

import httpx

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}}, "required": ["city"]}}}


def ask(srv, chat: bool, **fields):
    body = {k: v for k, v in {"max_tokens": 8, "temperature": 0, **fields}.items() if v is not None}
    if chat:
        body.setdefault("messages", [{"role": "user", "content": "Tell me about the sea"}])
    else:
        body.setdefault("prompt", "Tell me about the sea")
    return httpx.post(srv.url + ("/v1/chat/completions" if chat else "/v1/completions"), json=body, timeout=120)


def ok(srv, chat, **fields) -> dict:
    r = ask(srv, chat, **fields)
    assert r.status_code == 200, r.text
    return r.json()


def text(resp, chat, i=0) -> str:
    ch = resp["choices"][i]
    return ch["message"]["content"] if chat else ch["text"]
