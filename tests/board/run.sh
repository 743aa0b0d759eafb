#!/usr/bin/env bash
# The board's browser tests (board.test.mjs): builds the board from
# web/board into a temporary directory (npm ci first when package-lock.json
# changed), then drives Debian's chromium with playwright-core against a
# real moatd from MOAT_BIN_DIR (default: ../../build/bin) serving that
# build. CTest: board.browser.
# Exit 77 (CTest's "skipped") when not root or when Node.js >= 20, npm or
# chromium is missing; in CI (MOAT_CI=1) that is a failure instead.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
skip=77
[ "${MOAT_CI:-}" = 1 ] && skip=1  # CI must run every tier

if [ "$(id -u)" -ne 0 ]; then
  echo "SKIP: the board's browser tests start moatd, which needs root"
  exit "$skip"
fi
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "SKIP: the board's browser tests need Node.js >= 20 and npm (not installed)"
  exit "$skip"
fi
major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$major" -lt 20 ]; then
  echo "SKIP: the board's browser tests need Node.js >= 20 (this is $(node --version))"
  exit "$skip"
fi
export MOAT_CHROMIUM="${MOAT_CHROMIUM:-/usr/bin/chromium}"
if [ ! -x "$MOAT_CHROMIUM" ]; then
  echo "SKIP: the board's browser tests need chromium at $MOAT_CHROMIUM (apt-get install chromium)"
  exit "$skip"
fi

export MOAT_BIN_DIR="${MOAT_BIN_DIR:-$repo/build/bin}"
out=$(mktemp -d /tmp/moat-board-test.XXXXXX)
trap 'rm -rf "$out"' EXIT
"$repo/web/board/build.sh" "$out/board"
export MOAT_BOARD_DIR="$out/board"

cd "$here"
node --test --test-reporter=spec --test-timeout=900000 "$@" stream_start.test.mjs board.test.mjs
