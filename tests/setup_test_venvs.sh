#!/usr/bin/env bash
# What only the test suite needs (tests/run.sh runs this after tests/setup.sh; the demo does not need them):
# .venv-engines (vLLM's and SGLang's own argument parsers), .venv-guidellm (a field benchmark client), and node/npm
# with the CRD schema packages in .node/. Safe to run again: each part is skipped when already in place.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PIP_DISABLE_PIP_VERSION_CHECK=1

# .venv-engines: the pinned vLLM and SGLang, for tests/deployctl/engines/test_engines_parsers.py (their own argument
# parsers and metric names). torch 2.13.0 CPU first; the engines with --no-deps (they pin other torch builds and
# CUDA kernels); then only the light packages their parsers import. About 3.4 GB (torch and triton are most of
# it). Skipped when the marker records this exact list.
ENGINES_SPEC="torch==2.13.0 vllm==0.33.0 sglang==0.5.23 | packaging regex einops pyyaml pydantic numpy cbor2 urllib3 \
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

# node and npm, and the CRD schemas of the k8s targets (Argo Rollouts, Prometheus Operator, Gateway API) as the
# @kubernetes-models npm packages in .node/ (ignored), for tests/deployctl/render's custom-resource checks
# (crdcheck.mjs); the versions are deployctl/render/crdvalidate.py's NPM_PACKAGES.
need_apt=()
command -v node >/dev/null 2>&1 || need_apt+=(nodejs)
command -v npm >/dev/null 2>&1 || need_apt+=(npm)
if [ ${#need_apt[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi
VPY=.venv/bin/python
NPM_PKGS=$("$VPY" -c "from deployctl.render.crdvalidate import NPM_PACKAGES; print(' '.join(NPM_PACKAGES))")
for pkg in $NPM_PKGS; do
  name=${pkg%@*}; want=${pkg##*@}
  have=$(node -p "require('./.node/node_modules/$name/package.json').version" 2>/dev/null || true)
  if [ "$have" != "$want" ]; then
    npm install --prefix .node --no-save --no-package-lock --no-audit --no-fund --loglevel=error $NPM_PKGS >/dev/null
    break
  fi
done
