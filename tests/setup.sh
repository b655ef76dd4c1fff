#!/usr/bin/env bash
# Set up everything deployctl and its test suite need on a fresh Debian machine:
# the Debian packages (openssh-server, nginx, prometheus for promtool) and a virtual
# environment in .venv with torch 2.13.0 (CPU build), both distributions and the test tools.
# Safe to run again: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
[ -x /usr/sbin/sshd ] || need_apt+=(openssh-server)
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need_apt+=(nginx)
command -v promtool >/dev/null 2>&1 || need_apt+=(prometheus)
command -v systemd-analyze >/dev/null 2>&1 || need_apt+=(systemd)
[ -x /usr/bin/sudo ] || need_apt+=(sudo)  # the sshd fleet's deploy users need password-protected sudo (C18)
if [ ${#need_apt[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python
export PIP_DISABLE_PIP_VERSION_CHECK=1
# torch first: 2.13.0 installs from this machine's disk; any other spec pulls a multi-GB CUDA build.
"$VPY" -c "import torch" 2>/dev/null || "$VPY" -m pip install -q torch==2.13.0
"$VPY" -m pip install -q -e ./runtime -e ".[test]"
# Triton for the paged decode kernel's tests: on CPU they run it interpreted (TRITON_INTERPRET=1); 3.9.0 installs
# beside torch 2.13.0 CPU without pulling another torch
"$VPY" -c "import triton" 2>/dev/null || "$VPY" -m pip install -q triton==3.9.0

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
