#!/usr/bin/env bash
# Audit log benchmark: record() cost in process, then exec latency against a
# scratch moatd alone and under a paced background load of RATE API calls per
# second (unrecorded, then recorded: one file.read event each).
# Usage: bench/audit.sh [BIN_DIR] [RATE] [SECONDS]
# MOATD_BIN=DIR runs the moatd (and moat-init) of another build, e.g. one
# from before the audit log, under the same load: its events/s read 0.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
bin=${1:-build/bin}
rate=${2:-1200}
seconds=${3:-5}
state=$(mktemp -d /tmp/moat-bench-XXXXXX)
cleanup() {
  [ -n "${pid:-}" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  umount -l "$state/storage" 2>/dev/null || true
  rm -rf "$state"
}
trap cleanup EXIT
MOAT_STORAGE_GB=8 "${MOATD_BIN:-$bin}/moatd" --state "$state" --listen 127.0.0.1:0 2>"$state.log" &
pid=$!
wait_for_moatd "$state" "$state.log" "$pid"
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(uname -r) $(nproc) cpus, load $rate/s, $seconds s per phase"
MOATD_PID=$pid "$bin/moat-audit-bench" "$state/moatd.sock" "$(cat "$state/master-token")" "$rate" "$seconds"
rm -f "$state.log"
