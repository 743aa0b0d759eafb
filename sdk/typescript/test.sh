#!/usr/bin/env bash
# Builds the TypeScript SDK and runs its tests (node --test), some of them
# against a real moatd from MOAT_BIN_DIR (default: ../../build/bin; those
# need root and say "skipped" without it). CTest: sdk.typescript.
# Exit 77 (CTest's "skipped") when Node.js >= 20 or npm is not installed;
# in CI (MOAT_CI=1, set by .ci/run) that is a failure instead.
set -euo pipefail
cd "$(dirname "$0")"
skip=77
[ "${MOAT_CI:-}" = 1 ] && skip=1  # CI must run every tier

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "SKIP: the TypeScript SDK needs Node.js >= 20 and npm (not installed)"
  exit "$skip"
fi
major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$major" -lt 20 ]; then
  echo "SKIP: the TypeScript SDK needs Node.js >= 20 (this is $(node --version))"
  exit "$skip"
fi

export MOAT_BIN_DIR="${MOAT_BIN_DIR:-$PWD/../../build/bin}"

# Dev dependencies (typescript, @types/node) exactly as package-lock.json
# says; reinstalled only when the lock file changed since the last install.
stamp=node_modules/.moat-package-lock
if ! cmp -s package-lock.json "$stamp" 2>/dev/null; then
  npm ci --no-audit --no-fund --loglevel=error
  cp package-lock.json "$stamp"
fi

./node_modules/.bin/tsc -p tsconfig.json
# The files run at once: each starts its own moatd (or a fake one on loopback).
exec node --test --test-reporter=spec --test-concurrency=5 test/*.test.mjs
