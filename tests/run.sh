#!/usr/bin/env bash
# The whole test suite on a fresh Debian machine: set up (tests/setup.sh, then the extra venvs some tests need:
# tests/setup_test_venvs.sh), then pytest.
# Extra arguments go to pytest. By default the tests run on DEPLOYCTL_TEST_WORKERS pytest-xdist workers (default 3:
# most of the suite's time is fleet tests waiting on sshd, nginx and engines, so more workers than 2 cores pay),
# one test file per work unit (tests/conftest.py's scheduler; tests marked xdist_group(name) together). Passing
# -n/--numprocesses/--dist yourself overrides that: `bash tests/run.sh -n 0` runs serially.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tests/setup.sh
bash tests/setup_test_venvs.sh
parallel=(-n "${DEPLOYCTL_TEST_WORKERS:-3}" --dist loadgroup)
for arg in "$@"; do
  case "$arg" in
    -n|-n*|--numprocesses|--numprocesses=*|--dist|--dist=*|no:xdist|-pno:xdist) parallel=() ;;
  esac
done
exec .venv/bin/python -m pytest "${parallel[@]}" "$@"
