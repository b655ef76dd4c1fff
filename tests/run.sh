#!/usr/bin/env bash
# The whole test suite on a fresh Debian machine: set up (tests/setup.sh), then pytest.
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tests/setup.sh
exec .venv/bin/python -m pytest "$@"
