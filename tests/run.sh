#!/usr/bin/env bash
# The whole test suite on a fresh Debian machine: set up (tests/setup.sh, then the extra venvs some tests need:
# tests/setup_test_venvs.sh), then pytest.
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tests/setup.sh
bash tests/setup_test_venvs.sh
exec .venv/bin/python -m pytest "$@"
