#!/usr/bin/env bash
# One-shot start-up benchmark: `moat run -- /bin/true` against bubblewrap and
# unshare(1) and /bin/true with no isolation (the machine's floor),
# interleaved in one run; prints a markdown table with medians
# and ratios to moat. Usage: bench/run.sh [BIN_DIR] [ROUNDS]
set -euo pipefail
bin=${1:-build/bin}
rounds=${2:-200}
export MOAT_STATE=${MOAT_STATE:-/var/lib/moat}
bwrap_cmd="bwrap --unshare-all --die-with-parent --ro-bind /usr /usr --symlink usr/bin /bin \
--symlink usr/lib /lib --symlink usr/lib64 /lib64 --proc /proc --dev /dev --tmpfs /tmp /bin/true"
unshare_cmd="unshare --user --map-root-user --pid --fork --mount --net --uts --ipc --cgroup /bin/true"
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(uname -r) $(nproc) cpus, $rounds rounds"
"$bin/moat-startup-bench" "$rounds" \
  "moat run=$bin/moat run -- /bin/true" \
  "bwrap=$bwrap_cmd" \
  "unshare=$unshare_cmd" \
  "no isolation (the floor)=/bin/true"
