#!/usr/bin/env bash
# Builds the board (docs/BOARD.md) into OUT_DIR: installs the pinned dev
# dependencies (npm ci, only when package-lock.json changed since the last
# install), type-checks the sources (tsc --noEmit), bundles them (build.mjs).
# CMake's `board` target runs it into build/share/moat/board.
set -euo pipefail
out=${1:?usage: build.sh OUT_DIR}
case "$out" in /*) ;; *) out="$PWD/$out" ;; esac
cd "$(dirname "$0")"

stamp=node_modules/.moat-package-lock
if ! cmp -s package-lock.json "$stamp" 2>/dev/null; then
  npm ci --no-audit --no-fund --loglevel=error
  cp package-lock.json "$stamp"
fi

./node_modules/.bin/tsc -p tsconfig.json
node build.mjs "$out"
