#!/usr/bin/env bash
# Idle environments at scale: starts moatd on a scratch state directory with
# --max-environments N, creates N idle environments one after another with
# `moat env create`, measures what they hold (host memory, moat-init PSS,
# cgroup charges, moatd and spawner), checks that an exec works in the first
# and the last, stops moatd with SIGTERM (which destroys them all) and checks
# that nothing is left. Usage: bench/idle.sh [BIN_DIR] [N]
# RAM_MB (default 16) and STORAGE_GB (0.1) are each environment's spec: moatd
# reserves ram_mb of the host's memory per environment, so N x RAM_MB must fit.
# Exit status 0 only when all N were created, both execs worked and nothing
# leaked.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
bin=$(cd "${1:-build/bin}" && pwd)
n=${2:-1000}
ram=${RAM_MB:-16}
storage=${STORAGE_GB:-0.1}
state=$(mktemp -d /tmp/moat-idle-XXXXXX)
export MOAT_STATE=$state
log=$state.log
failures=0
pid=
spawner=

# The spawner outlives moatd by design; if moatd did not take it down, ask it
# to destroy its environments and exit (its shutdown request is one byte, 5).
stop_spawner() {
  [ -S "$state/spawner.sock" ] || return 0
  python3 - "$state/spawner.sock" <<'EOF' 2>/dev/null || true
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.settimeout(600)
try:
    s.connect(sys.argv[1])
    s.send(b"\x05")
    s.recv(64)
except OSError:
    pass
EOF
}
cleanup() {
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  fi
  stop_spawner
  umount -l "$state/storage" 2>/dev/null || true
  rm -rf "$state" "$log"
}
trap cleanup EXIT

now() { echo "${EPOCHREALTIME/./}"; }  # microseconds
meminfo() { awk -v k="$1:" '$1 == k {print $2}' /proc/meminfo; }  # KiB
status_field() { awk -v k="$2:" '$1 == k {print $2}' "/proc/$1/status"; }
alive() { [ -r "/proc/$1/stat" ] && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }  # utime + stime
kib() { awk -v v="$1" 'BEGIN {printf "%.0f KiB", v}'; }
mib() { awk -v v="$1" 'BEGIN {printf "%.1f MiB", v / 1024}'; }
per() { awk -v v="$1" -v n="$2" 'BEGIN {if (n > 0) printf "%.0f KiB", v / n; else print "-"}'; }
secs() { awk -v us="$1" 'BEGIN {printf "%.1f s", us / 1e6}'; }
check() {  # check WHAT COUNT_LEFT
  if [ "$2" = 0 ]; then echo "  ok    $1: none left"; else echo "  LEAK  $1: $2 left"; failures=$((failures + 1)); fi
}

# Where the cgroup hierarchies are mounted: "v1 CONTROLLER MOUNTPOINT ROOT" or
# "v2 - MOUNTPOINT ROOT".
cgroup_mounts() {
  awk '{
    for (i = 1; i <= NF && $i != "-"; i++) ;
    if ($(i + 1) == "cgroup") {
      split($(i + 3), o, ",")
      for (k in o) if (o[k] == "cpu" || o[k] == "memory" || o[k] == "pids") print "v1", o[k], $5, $4
    } else if ($(i + 1) == "cgroup2") print "v2", "-", $5, $4
  }' /proc/self/mountinfo
}
# The cgroup directories of a process: "CONTROLLER DIR" for cpu, memory, pids
# (v1), or "- DIR" (v2).
cgroup_dirs_of() {
  local p=$1
  awk -F: -v mounts="$(cgroup_mounts)" '
    BEGIN {
      m = split(mounts, lines, "\n")
      for (i = 1; i <= m; i++) {
        split(lines[i], f, " ")
        if (f[1] == "v1") { mp[f[2]] = f[3]; rt[f[2]] = f[4] } else if (!("-" in mp)) { mp["-"] = f[3]; rt["-"] = f[4] }
      }
    }
    {
      split($2, cs, ",")
      if ($2 == "") cs[1] = "-"
      for (k in cs) {
        c = cs[k]
        if (!(c in mp) || (c == "-" && ("memory" in mp))) continue
        path = $3
        if (rt[c] != "/" && index(path, rt[c]) == 1) path = substr(path, length(rt[c]) + 1)
        print c, mp[c] path
      }
    }' "/proc/$p/cgroup"
}

MOAT_STORAGE_GB=${MOAT_STORAGE_GB:-8} "$bin/moatd" --state "$state" --listen 127.0.0.1:0 \
  --max-environments "$n" 2>"$log" &
pid=$!
wait_for_moatd "$state" "$log" "$pid"
spawner=$(ps -o pid= --ppid "$pid" | awk 'NR == 1 {print $1}')
echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(uname -r) $(nproc) cpus, $(awk '/MemTotal/ {printf "%.1f", $2 / 1048576}' /proc/meminfo) GiB;" \
     "$n idle environments (ram_mb $ram, storage_gb $storage); state $state"
echo "# moatd $pid, spawner $spawner; open files limit: $(ulimit -Sn) here," \
     "$(awk '/^Max open files/ {print $4}' "/proc/$pid/limits") in moatd"

# Warm-up: the first create makes the storage pool and the template skeleton.
warm=$("$bin/moat" env create --memory "$ram" --storage "$storage")
"$bin/moat" env rm "$warm" >/dev/null
sleep 1

declare -A before
slabs() { awk 'NR > 2 {printf "%s %d\n", $1, $3 * $4 / 1024}' /proc/slabinfo; }  # name KiB
slabs_before=$(slabs)
for k in MemAvailable MemFree Slab SUnreclaim PageTables KernelStack Shmem AnonPages Cached Percpu VmallocUsed; do
  before[$k]=$(meminfo $k)
done

ids=()
times=()
t0=$(now)
error=
for i in $(seq "$n"); do
  s=$(now)
  if ! id=$("$bin/moat" env create --memory "$ram" --storage "$storage" --ttl 86400 2>&1); then
    error="create #$i failed: $id"
    break
  fi
  times+=($(( $(now) - s )))
  ids+=("$id")
  if (( i % 100 == 0 )); then
    echo "  created $i in $(secs $(( $(now) - t0 )))"
  fi
done
t1=$(now)
created=${#ids[@]}
echo
echo "## create"
[ -n "$error" ] && { echo "  $error"; failures=$((failures + 1)); }
printf '%s\n' "${times[@]}" | sort -n | awk -v n="$created" -v total=$((t1 - t0)) '
  {t[NR] = $1; s += $1}
  END {
    if (NR == 0) exit
    printf "  %d environments in %.1f s: %.2f ms each on average (moat env create, one at a time)\n", n, total / 1e6, s / NR / 1e3
    printf "  p50 %.2f ms, p90 %.2f ms, p99 %.2f ms, max %.2f ms\n", t[int(NR * .5) + 1] / 1e3, t[int(NR * .9) + 1] / 1e3, t[int(NR * .99) + 1] / 1e3, t[NR] / 1e3
  }'
printf '%s\n' "${times[@]}" | awk '
  NR <= 100 {a += $1; na++} {last[NR % 100] = $1}
  END {
    if (NR < 200) exit
    for (k in last) b += last[k]
    printf "  first 100: %.2f ms average; last 100: %.2f ms average\n", a / na / 1e3, b / 100 / 1e3
  }'

sleep 2  # settle
echo
echo "## memory with $created idle environments"
declare -A after
for k in "${!before[@]}"; do after[$k]=$(meminfo $k); done
drop=$(( before[MemAvailable] - after[MemAvailable] ))
echo "  MemAvailable: $(mib ${before[MemAvailable]}) before, $(mib ${after[MemAvailable]}) after:" \
     "drop $(mib $drop), $(per $drop "$created") per environment"
line="  grown by (all, per environment):"
for k in AnonPages Cached Slab SUnreclaim Percpu PageTables KernelStack VmallocUsed; do
  d=$(( after[$k] - before[$k] ))
  line+=" $k $(mib $d) ($(per $d "$created"));"
done
echo "${line%;}"
echo "  slab caches that grew most (KiB per environment):$(
  join <(echo "$slabs_before" | sort) <(slabs | sort) |
    awk -v n="$created" '$3 > $2 {printf "%d %s\n", $3 - $2, $1}' | sort -rn | head -8 |
    awk -v n="$created" '{printf " %s %.0f;", $2, $1 / n}')"

inits=$(ps -o pid=,comm= --ppid "$spawner" | awk '$2 == "moat-init" {print $1}')
ninit=$(echo "$inits" | grep -c . || true)
pss=0 rss=0
for p in $inits; do
  read -r a b < <(awk '$1 == "Pss:" {p = $2} $1 == "Rss:" {r = $2} END {print p, r}' "/proc/$p/smaps_rollup")
  pss=$((pss + a)) rss=$((rss + b))
done
echo "  moat-init processes: $ninit; PSS sum $(mib $pss) ($(per $pss "$ninit") each), RSS sum $(mib $rss) ($(per $rss "$ninit") each)"

# The environments' cgroups, per controller, from each moat-init's
# /proc/PID/cgroup (the host's view).
declare -A parents
charge=0
kmem=0
ncg=0
for p in $inits; do
  while read -r c dir; do
    parents[$c]=${dir%/*}
    case $c in
      memory)
        charge=$((charge + $(cat "$dir/memory.usage_in_bytes"))); ncg=$((ncg + 1))
        [ -r "$dir/memory.kmem.usage_in_bytes" ] && kmem=$((kmem + $(cat "$dir/memory.kmem.usage_in_bytes")))
        ;;
      -) charge=$((charge + $(cat "$dir/memory.current"))); ncg=$((ncg + 1)) ;;
    esac
  done < <(cgroup_dirs_of "$p")
done
charge=$((charge / 1024)) kmem=$((kmem / 1024))
echo "  memory cgroup charges: $ncg cgroups, sum $(mib $charge) ($(per $charge "$ncg") each$(
     [ "$kmem" -gt 0 ] && echo ", of which kernel $(per $kmem "$ncg")")) under ${parents[memory]:-${parents[-]:-?}}"

echo
echo "## moatd and spawner with $created idle environments"
for who in moatd:$pid spawner:$spawner; do
  p=${who#*:}
  echo "  ${who%%:*}: RSS $(kib "$(status_field "$p" VmRSS)"), $(status_field "$p" Threads) threads," \
       "$(ls "/proc/$p/fd" | wc -l) open fds"
done
hz=$(getconf CLK_TCK)
c0=$(( $(cpu_ticks "$pid") )) s0=$(( $(cpu_ticks "$spawner") ))
sleep 10
c1=$(( $(cpu_ticks "$pid") )) s1=$(( $(cpu_ticks "$spawner") ))
echo "  CPU while idle (10 s): moatd $(awk -v t=$((c1 - c0)) -v hz="$hz" 'BEGIN {printf "%.1f%%", t / hz / 10 * 100}')," \
     "spawner $(awk -v t=$((s1 - s0)) -v hz="$hz" 'BEGIN {printf "%.1f%%", t / hz / 10 * 100}') of one core"
echo "  host mount table lines under $state: $(grep -c " $state/" /proc/self/mountinfo || true)" \
     "(the storage pool only); btrfs subvolumes in the pool: $(ls "$state/storage/envs" | wc -l)"
loop=$(losetup -j "$state/storage.img" | cut -d: -f1)
echo "  storage pool on ${loop:-?}"

echo
echo "## exec"
(( created > 0 )) || { echo "  FAIL  no environment to run in"; failures=$((failures + 1)); }
for id in ${ids[0]:+"${ids[0]}" "${ids[created - 1]}"}; do
  s=$(now)
  if out=$("$bin/moat" exec "$id" -- /bin/sh -c 'echo "$HOSTNAME"' 2>&1) && [ "$out" = "$id" ]; then
    echo "  ok    $id: echo \$HOSTNAME printed its id ($(( ($(now) - s) / 1000 )) ms)"
  else
    echo "  FAIL  $id: $out"
    failures=$((failures + 1))
  fi
done

echo
echo "## teardown: SIGTERM to moatd (destroys every environment, then the spawner exits)"
s=$(now)
kill -TERM "$pid"
wait "$pid" || true
t_moatd=$(( $(now) - s ))
while alive "$spawner" && (( $(now) - s < 600000000 )); do sleep 0.02; done
t_all=$(( $(now) - s ))
echo "  moatd exited after $(secs $t_moatd), the spawner after $(secs $t_all)" \
     "($(awk -v us=$t_moatd -v n="$created" 'BEGIN {if (n) printf "%.2f", us / n / 1e3}') ms per environment)"
pid=
check "spawner $spawner" "$(alive "$spawner" && echo 1 || echo 0)"
left=0
for p in $inits; do [ "$(cat "/proc/$p/comm" 2>/dev/null)" = moat-init ] && left=$((left + 1)); done
check "moat-init processes (of $ninit)" "$left"
left=0
for id in "${ids[@]}"; do
  for c in "${!parents[@]}"; do [ -d "${parents[$c]}/moat-$id" ] && left=$((left + 1)); done
done
check "environment cgroups (${#parents[@]} controllers x $created)" "$left"
check "btrfs subvolumes in the pool" "$(ls "$state/storage/envs" | wc -l)"
check "lock files in $state/run" "$(ls "$state/run" | wc -l)"
check "mounts under $state other than the pool" \
      "$(grep " $state/" /proc/self/mountinfo | grep -vc " $state/storage " || true)"
# A deleted subvolume's qgroup stays listed (stale) until btrfs's cleaner has
# freed its extents; then the kernel drops it.
s=$(now)
btrfs subvolume sync "$state/storage" >/dev/null 2>&1 || true
qgroups() { btrfs qgroup show "$state/storage" 2>/dev/null | grep '^0/' | grep -vc '^0/5 ' || true; }
while [ "$(qgroups)" != 0 ] && (( $(now) - s < 120000000 )); do
  btrfs filesystem sync "$state/storage" >/dev/null 2>&1 || true
  sleep 1
done
check "btrfs qgroups in the pool ($(secs $(( $(now) - s ))) for the cleaner)" "$(qgroups)"
umount "$state/storage" || echo "  FAIL  umount $state/storage"
check "loop device ${loop:-?} (autoclear at the pool's unmount)" \
      "$(losetup -j "$state/storage.img" | grep -c . || true)"
line="  info  kernel memory after teardown vs before the creates:"
for k in Slab SUnreclaim Percpu PageTables KernelStack VmallocUsed; do
  line+=" $k $(mib $(( $(meminfo $k) - before[$k] )));"
done
echo "${line%;}"
echo
if [ "$failures" = 0 ]; then echo "# all $n created, execs ok, nothing left"; else echo "# $failures problem(s); moatd log:"; tail -5 "$log"; fi
rm -f "$log"
[ "$failures" = 0 ]
