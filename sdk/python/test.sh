#!/usr/bin/env bash
# Runs the Python SDK's tests (pytest) against a real moatd from MOAT_BIN_DIR
# (default: ../../build/bin; it needs root, and the tests that need it say
# "skipped" without it). CTest: sdk.python.
# Exit 77 (CTest's "skipped") when Python >= 3.11 or pytest is missing
# (Debian: python3-pytest, in scripts/install-deps.sh); in CI (MOAT_CI=1, set
# by .ci/run) that is a failure instead, as is a test that skips.
set -euo pipefail
cd "$(dirname "$0")"
skip=77
[ "${MOAT_CI:-}" = 1 ] && skip=1  # CI must run every tier

# Debian's python3 first: that is where python3-pytest is installed.
python=/usr/bin/python3
[ -x "$python" ] || python=$(command -v python3 || true)
if [ -z "$python" ] || ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "SKIP: the Python SDK needs Python >= 3.11 (not installed)"
  exit "$skip"
fi
if ! "$python" -c 'import pytest' 2>/dev/null; then
  echo "SKIP: the Python SDK's tests need pytest (apt-get install python3-pytest)"
  exit "$skip"
fi

export MOAT_BIN_DIR="${MOAT_BIN_DIR:-$PWD/../../build/bin}"
export PYTHONDONTWRITEBYTECODE=1  # nothing written into the source tree

# Every module compiles (a syntax error in one that no test imports is found too).
"$python" - <<'PY'
import pathlib, sys
for path in sorted(pathlib.Path("moat").glob("*.py")):
    compile(path.read_text(), str(path), "exec")
PY

args=()
# -rs lists why each skipped test skipped; in CI (MOAT_CI=1) conftest.py fails them.
exec "$python" -m pytest -p no:cacheprovider -rs -v "${args[@]}" tests "$@"
