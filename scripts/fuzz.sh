#!/usr/bin/env bash
# `make fuzz`: builds the libFuzzer targets (fuzz/*.cc) in $FUZZ_BUILD (the
# clang build `make asan-configure` sets up) and runs each for $FUZZ_SECONDS from its seed corpus
# fuzz/corpus/<name>/ (every file there is replayed first: seeds and the
# inputs of crashes found before, kept as regression tests). New inputs go to
# $FUZZ_BUILD/fuzz/corpus/<name>/; a crash leaves its input in
# $FUZZ_BUILD/fuzz/crashes/<name>/ and fails the run. FUZZ_SECONDS=0 only
# replays the corpora. FUZZ_TARGETS picks targets (default: all).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${FUZZ_BUILD:-build-asan}
seconds=${FUZZ_SECONDS:-10}
jobs=${JOBS:-$(nproc)}
all="api_request permissions egress_policy path_resolution proxy_http init_protocol mcp"
targets=${FUZZ_TARGETS:-$all}

# The longest input each target is given: what its parser sees in one piece
# is short (a request head, a policy, a frame), and shorter inputs fuzz faster.
max_len() {
  case $1 in
    path_resolution) echo 1024 ;;
    proxy_http | mcp) echo 8192 ;;
    *) echo 4096 ;;
  esac
}

if [ ! -f "$build/build.ninja" ] || ! grep -q '^MOAT_FUZZ:BOOL=ON' "$build/CMakeCache.txt"; then
  echo "fuzz: $build is not a fuzz build; \`make fuzz\` configures it (clang, -DMOAT_FUZZ=ON)" >&2
  exit 1
fi
# Only what the targets need is built here (target moat_fuzz); the same
# build serves `make sanitize`.
cmake --build "$build" -j "$jobs" --target moat_fuzz

if command -v llvm-symbolizer >/dev/null 2>&1; then
  export ASAN_SYMBOLIZER_PATH=${ASAN_SYMBOLIZER_PATH:-$(command -v llvm-symbolizer)}
fi
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}

# One target: its summary (and, failing, what to do) in $build/fuzz/$t.report;
# the exit status says whether it passed.
run_target() {
  local t=$1
  local bin="$build/bin/fuzz_$t"
  local seeds="fuzz/corpus/$t"
  local corpus="$build/fuzz/corpus/$t"
  local crashes="$build/fuzz/crashes/$t"
  local log="$build/fuzz/$t.log"
  local report="$build/fuzz/$t.report"
  mkdir -p "$corpus" "$crashes" "$seeds"
  local budget
  if [ "$seconds" -gt 0 ]; then
    budget=(-max_total_time="$seconds")
  else
    budget=(-runs=0)
  fi
  local started status=0
  started=$(date +%s)
  "$bin" "${budget[@]}" -max_len="$(max_len "$t")" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$crashes/" "$corpus" "$seeds" >"$log" 2>&1 || status=$?
  local execs cov
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$({ grep -oE '(INITED|DONE|pulse|NEW|REDUCE)[^#]* cov: [0-9]+ ft: [0-9]+ corp: [0-9]+' "$log" || true; } |
        tail -1 | sed -E 's/.*(cov: [0-9]+ ft: [0-9]+ corp: [0-9]+).*/\1/')
  if [ "$status" -eq 0 ]; then
    printf 'fuzz %-16s ok     %ss, %s runs, %s\n' "$t" "$(($(date +%s) - started))" "${execs:-?}" "${cov:-}" >"$report"
    return 0
  fi
  {
    printf 'fuzz %-16s FAILED (exit %s) after %ss; the end of %s:\n' "$t" "$status" "$(($(date +%s) - started))" "$log"
    grep -v '^#' "$log" | tail -40 | sed 's/^/  /'
    for input in $(sed -n 's/.*Test unit written to //p' "$log"); do
      echo "  crashing input: $input"
      echo "  reproduce:      $bin $input"
      echo "  once fixed, keep it as a regression test: cp $input $seeds/"
    done
  } >"$report"
  return 1
}

# $jobs targets at a time (each is one process on one core): 7 targets of
# 10 s take 40 s on 2 cores rather than 70.
mkdir -p "$build/fuzz"
declare -A pids=()
for t in $targets; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
  run_target "$t" &
  pids[$t]=$!
done
passed=0
failed=0
for t in $targets; do
  if wait "${pids[$t]}"; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
  fi
  cat "$build/fuzz/$t.report"
done
echo "fuzz: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
