#!/usr/bin/env bash
# The extra virtual environments only the test suite needs (tests/run.sh runs this after tests/setup.sh; the demo
# does not need them): .venv-engines (vLLM's and SGLang's own argument parsers) and .venv-guidellm (a field
# benchmark client). Safe to run again: each is skipped when its marker file records the same package list.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PIP_DISABLE_PIP_VERSION_CHECK=1

# .venv-engines: the pinned vLLM and SGLang, for tests/deployctl/engines/test_engines_parsers.py (their own argument
# parsers and metric names). torch 2.13.0 CPU first; the engines with --no-deps (they pin other torch builds and
# CUDA kernels); then only the light packages their parsers import. About 3.4 GB (torch and triton are most of
# it). Skipped when the marker records this exact list.
ENGINES_SPEC="torch==2.13.0 vllm==0.33.0 sglang==0.5.23 | packaging regex pyyaml pydantic numpy cbor2 urllib3 \
transformers==5.24.0 requests openai openai-harmony cloudpickle cachetools uvloop py-cpuinfo fastapi uvicorn \
prometheus_client partial_json_parser xgrammar llguidance watchfiles orjson python-multipart pybase64 triton \
pillow starlette msgspec pyzmq tqdm ipython aiohttp"
EPY=.venv-engines/bin/python
if [ "$(cat .venv-engines/.deployctl-spec 2>/dev/null)" != "$ENGINES_SPEC" ]; then
  [ -x "$EPY" ] || "$PY" -m venv .venv-engines
  "$EPY" -c "import torch" 2>/dev/null || "$EPY" -m pip install -q torch==2.13.0
  VLLM_TARGET_DEVICE=cpu "$EPY" -m pip install -q --no-deps vllm==0.33.0 sglang==0.5.23
  # shellcheck disable=SC2086
  "$EPY" -m pip install -q ${ENGINES_SPEC#*|} 2>&1 | grep -v "requires\|dependency conflicts\|resolver does not" || true
  "$EPY" -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
  printf '%s' "$ENGINES_SPEC" > .venv-engines/.deployctl-spec
fi

# .venv-guidellm: a field benchmark client for tests/runtime/server/test_field_clients.py (guidellm with its default
# backend check against the runtime). torch 2.13.0 first: guidellm's dependencies would otherwise pull a CUDA build.
GUIDELLM_SPEC="guidellm==0.8.1"
GPY=.venv-guidellm/bin/python
if [ "$(cat .venv-guidellm/.deployctl-spec 2>/dev/null)" != "$GUIDELLM_SPEC" ]; then
  [ -x "$GPY" ] || "$PY" -m venv .venv-guidellm
  "$GPY" -c "import torch" 2>/dev/null || "$GPY" -m pip install -q torch==2.13.0
  "$GPY" -m pip install -q "$GUIDELLM_SPEC"
  "$GPY" -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
  printf '%s' "$GUIDELLM_SPEC" > .venv-guidellm/.deployctl-spec
fi
