#!/usr/bin/env bash
# moat's MCP server (docs/MCP.md) tested with the official MCP TypeScript SDK
# client (@modelcontextprotocol/sdk, pinned in package-lock.json) over stdio
# (`moat mcp`, `moat mcp --standalone`) and Streamable HTTP (moatd's /mcp),
# against a real moatd from MOAT_BIN_DIR (default: ../../build/bin; needs
# root, the tests say "skipped" without it). CTest: mcp.
# Exit 77 (CTest's "skipped") when Node.js >= 20 or npm is not installed;
# in CI (MOAT_CI=1, set by .ci/run) that is a failure instead.
set -euo pipefail
cd "$(dirname "$0")"
skip=77
[ "${MOAT_CI:-}" = 1 ] && skip=1  # CI must run every tier

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "SKIP: the MCP tests need Node.js >= 20 and npm (not installed)"
  exit "$skip"
fi
major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$major" -lt 20 ]; then
  echo "SKIP: the MCP tests need Node.js >= 20 (this is $(node --version))"
  exit "$skip"
fi

export MOAT_BIN_DIR="${MOAT_BIN_DIR:-$PWD/../../build/bin}"

# Dev dependencies (the MCP SDK, ajv) exactly as package-lock.json says;
# reinstalled only when the lock file changed since the last install.
stamp=node_modules/.moat-package-lock
if ! cmp -s package-lock.json "$stamp" 2>/dev/null; then
  npm ci --no-audit --no-fund --loglevel=error
  cp package-lock.json "$stamp"
fi

# The files run at once: each starts its own moatd (state, socket, port) and
# most of their time is spent waiting (timeouts, approvals, progress
# notifications). Arguments pick files.
if [ "$#" -gt 0 ]; then files=("$@"); else files=(*.test.mjs); fi
exec node --test --test-reporter=spec --test-concurrency=3 "${files[@]}"
