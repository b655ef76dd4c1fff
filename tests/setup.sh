#!/usr/bin/env bash
# Set up everything deployctl and its test suite need on a fresh Debian machine:
# the Debian packages (openssh-server, nginx, prometheus for promtool, mtail) and a virtual
# environment in .venv with torch 2.13.0 (CPU build), both distributions and the test tools.
# Safe to run again: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
[ -x /usr/sbin/sshd ] || need_apt+=(openssh-server)
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need_apt+=(nginx)
command -v promtool >/dev/null 2>&1 || need_apt+=(prometheus)
command -v mtail >/dev/null 2>&1 || need_apt+=(mtail)  # the router's exporter over nginx's access log (render.watch)
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
