#!/usr/bin/env bash
# Where the CPU goes while cold create -> exec `true` -> destroy cycles run
# back to back: samples every CPU with `perf record -a -g` while
# moat-api-bench runs ROUNDS cycles (BENCH_CYCLE_ONLY) against a scratch
# moatd, and sorts each sample into an area: the first in the script's list
# one of whose functions is in the sample's call chain, else the sampled
# process's user space or "other kernel". bench/trace.sh gives the critical path in time;
# this gives the work, including what runs beside it (the spawner making the
# next namespaces, the kernel freeing the last ones).
# Usage: bench/profile.sh [BIN_DIR] [ROUNDS]   (needs root and perf)
# BENCH_TMP=DIR: where the scratch state directory goes (as bench/trace.sh);
# KEEP_PERF_DATA=1 keeps perf's data file for `perf report -i`.
# EXEC=SECONDS samples execs of `true` in one environment from one client
# for that long instead of cycles (BENCH_EXEC_ONLY): where an exec goes.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
bin=${1:-build/bin}
rounds=${2:-200}
command -v perf >/dev/null || { echo "perf is not installed (apt-get install linux-perf)" >&2; exit 1; }
state=$(mktemp -d ${BENCH_TMP:-/tmp}/moat-profile-XXXXXX)
data=$(mktemp /tmp/moat-profile-XXXXXX.data)
cleanup() {
  [ -n "${pid:-}" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  umount -l "$state/storage" 2>/dev/null || true
  rm -rf "$state" "$state.log"; [ -n "${KEEP_PERF_DATA:-}" ] && echo "perf data kept in $data" >&2 || rm -f "$data"
}
trap cleanup EXIT
MOAT_STORAGE_GB=8 "$bin/moatd" --state "$state" --listen 127.0.0.1:0 2>"$state.log" &
pid=$!
wait_for_moatd "$state" "$state.log" "$pid"
if [ -n "${EXEC:-}" ]; then
  echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(uname -r) $(nproc) cpus, execs for $EXEC s"
  mode=(env BENCH_EXEC_ONLY="$EXEC")
else
  echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(uname -r) $(nproc) cpus, $rounds cycles"
  mode=(env BENCH_CYCLE_ONLY=1)
fi
perf record -q -a -g -F 4000 -o "$data" -- \
  "${mode[@]}" "$bin/moat-api-bench" "$state/moatd.sock" "$(cat "$state/master-token")" "$rounds" | tail -3
perf script -i "$data" -F comm,ip,sym,dso 2>/dev/null | python3 -c '
import collections, sys
# (area, functions whose presence in a call chain puts a sample there), first match wins.
areas = [
    ("idle", ["pv_native_safe_halt", "default_idle", "cpu_idle_poll"]),
    ("network namespaces: made", ["copy_net_ns"]),
    ("network namespaces: freed (kworker)", ["cleanup_net"]),
    ("seccomp filter load", ["do_seccomp"]),
    ("exec", ["__x64_sys_execve", "__x64_sys_execveat"]),
    ("process exit (memory, mounts, namespaces)", ["do_exit"]),
    ("fork / clone", ["kernel_clone", "__x64_sys_clone3", "__x64_sys_vfork"]),
    ("page faults", ["asm_exc_page_fault"]),
    ("mounts", ["__x64_sys_mount", "__x64_sys_umount", "__x64_sys_pivot_root", "__x64_sys_move_mount",
                "__x64_sys_open_tree", "__x64_sys_fsmount", "__x64_sys_fsconfig", "__x64_sys_mount_setattr"]),
    ("btrfs volumes (ioctl)", ["btrfs_ioctl"]),
    ("mkdir / rmdir (cgroups)", ["__x64_sys_mkdir", "__x64_sys_mkdirat", "__x64_sys_rmdir", "__x64_sys_unlinkat"]),
    ("open", ["__x64_sys_openat", "__x64_sys_openat2", "__x64_sys_open"]),
    ("read / write", ["ksys_read", "ksys_write", "ksys_pread64", "ksys_pwrite64", "__x64_sys_pwrite64",
                      "__x64_sys_pread64", "do_iter_write", "__x64_sys_fdatasync", "__x64_sys_fsync"]),
    ("sockets", ["__sys_sendmsg", "__sys_recvmsg", "__sys_sendto", "__sys_recvfrom", "__x64_sys_accept4",
                 "__x64_sys_connect"]),
    ("memory maps (loaders)", ["ksys_mmap_pgoff", "vm_mmap_pgoff", "__x64_sys_mprotect", "__x64_sys_munmap"]),
    ("close", ["__x64_sys_close"]),
    ("RCU callbacks", ["rcu_do_batch"]),
    ("other kernel threads", ["kthread"]),
    ("other system calls", ["do_syscall_64"]),
    ("interrupts", ["handle_softirqs", "__irq_exit_rcu", "sysvec_apic_timer_interrupt", "common_interrupt"]),
    ("scheduler", ["__schedule", "schedule", "finish_task_switch.isra.0"]),
]
samples, comms, counts, calls = 0, collections.Counter(), collections.Counter(), collections.Counter()
def close(chain, comm, user):
    global samples
    if not chain: return
    samples += 1
    comms[comm] += 1
    for area, funcs in areas:
        if any(f in chain for f in funcs):
            counts[area] += 1
            if area == "other system calls":
                names = [f for f in chain if f.startswith(("__x64_sys_", "__do_sys_", "ksys_", "__sys_"))]
                calls[names[-1] if names else "(entry and exit)"] += 1
            return
    counts["user space: " + comm if user else "other kernel"] += 1
chain, comm, user = [], None, False
for line in sys.stdin:
    if not line.strip():
        close(chain, comm, user); chain = []; continue
    if not line[0].isspace():
        close(chain, comm, user); chain = []
        comm = line.strip(); user = None; continue
    parts = line.split()
    if len(parts) < 2: continue
    if user is None: user = "kernel.kallsyms" not in line  # the sampled frame
    chain.append(parts[1].split("+")[0])
close(chain, comm, user)
print(f"\n{samples} samples on all CPUs\n\n| area (first match in the call chain) | share of CPU time |\n|---|---:|")
for area, n in counts.most_common():
    print(f"| {area} | {100 * n / samples:.1f} % |")
print("\n| other system calls, the largest | share |\n|---|---:|")
for c, n in calls.most_common(8):
    print(f"| {c} | {100 * n / samples:.1f} % |")
print("\n| process name | share |\n|---|---:|")
for c, n in comms.most_common(8):
    print(f"| {c} | {100 * n / samples:.1f} % |")
'
