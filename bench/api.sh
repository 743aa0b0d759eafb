#!/usr/bin/env bash
# moatd API benchmark: starts moatd on a scratch state directory, runs
# moat-api-bench against its unix socket, stops moatd (which destroys what is
# left), and removes the state. Usage: bench/api.sh [BIN_DIR] [ROUNDS]
# With WARM=N, moatd keeps N environments ready and creates ask for the
# default spec, so they are claims.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
bin=${1:-build/bin}
rounds=${2:-200}
state=$(mktemp -d /tmp/moat-bench-XXXXXX)
cleanup() {
  [ -n "${pid:-}" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  umount -l "$state/storage" 2>/dev/null || true
  rm -rf "$state"
}
trap cleanup EXIT
MOAT_STORAGE_GB=8 "$bin/moatd" --state "$state" --listen 127.0.0.1:0 --warm-pool "${WARM:-0}" 2>"$state.log" &
pid=$!
wait_for_moatd "$state" "$state.log" "$pid"
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(uname -r) $(nproc) cpus, $rounds rounds"
if [ "${WARM:-0}" -gt 0 ]; then
  sleep 1  # the pool fills
  "$bin/moat-api-bench" "$state/moatd.sock" "$(cat "$state/master-token")" "$rounds" '{}'
else
  "$bin/moat-api-bench" "$state/moatd.sock" "$(cat "$state/master-token")" "$rounds"
fi
rm -f "$state.log"
