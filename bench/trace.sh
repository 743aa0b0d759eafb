#!/usr/bin/env bash
# Where a cold create -> exec -> destroy cycle spends its time, across
# processes: starts moatd with MOAT_TRACE=1 on a scratch state, runs ROUNDS
# cycles one after another (moat-api-bench, BENCH_CYCLE_ONLY), and merges the
# trace lines of moatd, the spawner and the cloned children on their common
# CLOCK_MONOTONIC column (with MOAT_TRACE, moat-init is started with it too
# and keeps the spawner's stderr: its own stages, from its main to the exec
# gate, are in the lines). Prints, per stage, the median time since the
# previous stage (whichever process traced it), and one cycle's timeline.
# The times exclude HTTP and the client: bench/api.sh measures those too.
# Usage: bench/trace.sh [BIN_DIR] [ROUNDS]
# BENCH_TMP=DIR puts the scratch state directory there (default /tmp): on
# ext4 without a journal, file creation in a directory whose block group saw
# heavy deletes is slow (docs/BENCHMARKS.md, session 12).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
bin=${1:-build/bin}
rounds=${2:-100}
state=$(mktemp -d ${BENCH_TMP:-/tmp}/moat-trace-XXXXXX)
log=$(mktemp /tmp/moat-trace-XXXXXX.log)
cleanup() {
  [ -n "${pid:-}" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  umount -l "$state/storage" 2>/dev/null || true
  rm -rf "$state" "$log"
}
trap cleanup EXIT
MOAT_TRACE=1 MOAT_STORAGE_GB=8 "$bin/moatd" --state "$state" --listen 127.0.0.1:0 2>"$log" &
pid=$!
wait_for_moatd "$state" "$log" "$pid"
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(uname -r) $(nproc) cpus, $rounds cycles"
BENCH_CYCLE_ONLY=1 "$bin/moat-api-bench" "$state/moatd.sock" "$(cat "$state/master-token")" "$rounds" >/dev/null
kill "$pid" && wait "$pid" 2>/dev/null || true
pid=
python3 - "$log" <<'PY'
import statistics, sys
lines = []
for line in open(sys.argv[1], errors="replace"):
    f = line.split(None, 4)
    if len(f) == 5 and f[0] == "moat-trace":
        lines.append((float(f[3]), int(f[1]), f[4].strip()))
lines.sort()
# A cycle starts at moatd's create; keep whole cycles only.
cycles, cur = [], None
for t, p, stage in lines:
    if stage == "moatd: create":
        cur = []
        cycles.append(cur)
    if cur is not None:
        cur.append((t, p, stage))
whole = [c for c in cycles if c[-1][2] == "moatd: gone stored"]
def execs(c):
    return sum(1 for _, _, stage in c if stage == "moatd: exec")
def span(c):  # us from the cycle's first line to its last
    return (c[-1][0] - c[0][0]) * 1000
ten = [span(c) for c in whole if execs(c) == 10]
cycles = [c for c in whole if execs(c) == 1]  # create -> one exec -> destroy
if not cycles:
    sys.exit("no whole cycle traced (is moatd built with traceStage?)")
measured = cycles[len(cycles) // 10:]  # the first tenth warms up
gaps, order = {}, []
for c in measured:
    seen = {}
    for (t0, _, _), (t, _, stage) in zip(c, c[1:]):
        n = seen.get(stage, 0); seen[stage] = n + 1
        key = stage if n == 0 else f"{stage} #{n + 1}"
        if key not in gaps:
            gaps[key] = []; order.append(key)
        gaps[key].append((t - t0) * 1000)
total = [span(c) for c in measured]
print(f"\n{len(total)} cycles, median {statistics.median(total):.0f} us from moatd's create to its gone stored\n")
if ten:
    print(f"{len(ten)} cycles with 10 execs, median {statistics.median(ten):.0f} us\n")
print("| stage (time since the previous trace line) | median us |\n|---|---:|")
for key in order:
    print(f"| {key} | {statistics.median(gaps[key]):.0f} |")
c = cycles[len(cycles) // 2]
print("\none cycle:")
for t, p, stage in c:
    print(f"  {(t - c[0][0]) * 1000:8.0f} us  {p:>7}  {stage}")
PY
