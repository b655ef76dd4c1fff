"""`validate` against a server that refuses vLLM's extensions (issue 26): a strict OpenAI stand-in (FastAPI,
pydantic-style 422 naming any field outside the OpenAI API, as `transformers serve` answers) gets one probe per
optional field; the refused ones (return_token_ids, ignore_eos) are left out of every later request and each layer
names them, instead of every case failing on a 422 read as "no usage.prompt_tokens"."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from bench_fake_server import FakeConfig, FakeServer  # noqa: E402

from deployctl.validate.client import Endpoint  # noqa: E402
from deployctl.validate.run import Options, validate  # noqa: E402


def test_refused_fields_are_probed_once_left_out_and_named():
    cfg = FakeConfig(strict=True, ttft_s=0.01, tpot_s=0.001, max_model_len=512)
    with FakeServer(cfg) as srv:
        run = validate(Endpoint(srv.url, model="fake-model", max_model_len=512),
                       Options(layers=("functional", "latency"), concurrencies=(1,), requests=4, timeout_s=30))
    probes, rest = cfg.bodies[:2], cfg.bodies[2:]
    assert [sorted(set(b) - {"model", "messages", "max_tokens"}) for b in probes] == [["return_token_ids"],
                                                                                      ["ignore_eos"]]
    assert rest and not any({"return_token_ids", "ignore_eos"} & set(b) for b in rest)  # left out after the probe
    for layer in run.layers:
        assert layer.details["left_out"] == {"return_token_ids": "the server refuses it (HTTP 422)",
                                             "ignore_eos": "the server refuses it (HTTP 422)"}, layer.layer
        assert "left out return_token_ids: the server refuses it (HTTP 422)" in layer.summary
    latency = next(layer for layer in run.layers if layer.layer == "latency")
    assert latency.verdict == "pass", latency.summary  # on main: every ladder request 422 (ignore_eos)
    # (this stand-in answers non-streamed requests as streams, so its functional verdict is not judged here; no
    # test runs validate against a real transformers serve yet)
