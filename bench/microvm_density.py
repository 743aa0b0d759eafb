#!/usr/bin/env python3
"""How many idle microVM environments this host holds, and what each costs
the host in memory (docs/BENCHMARKS.md, "microVM density").

One moatd; microVM environments (spec.isolation "microvm", --ram-mb each,
restored from the saved guest: moatd's default) are created one after the
other, each answering a first command, and left idle, until a create
fails (moatd's capacity, the host's memory), the host's MemAvailable
would fall under --reserve-mb, or --max are up. Every --step guests: the
host memory of the idle ones (each QEMU's RSS and PSS from
/proc/PID/smaps_rollup, host-side; PSS shares what they share, RSS counts
it in each), the host's MemAvailable, and the time of one exec in the
first guest against the same exec in one namespace environment on the
same moatd, interleaved (the peer: how much the idle guests slow the
host down, as a ratio that holds on any day).

  bench/microvm_density.py --bin-dir build/bin [--accel tcg|kvm] [--ram-mb 128] [--max 200]
                           [--step 10] [--reserve-mb 2048] [--json FILE]

Needs root; exits 0 with SKIP otherwise.
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "stress"))
import microvm  # noqa: E402  (this directory: its template maker)
import moatd_harness as h  # noqa: E402

UNAME = microvm.UNAME


def mem_available_mb():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) // 1024
    return 0


def qemu_memory_kib(pids):
    """Summed RSS and PSS (KiB) of these QEMU processes."""
    rss = pss = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Rss:"):
                        rss += int(line.split()[1])
                    elif line.startswith("Pss:"):
                        pss += int(line.split()[1])
        except OSError:
            pass
    return rss, pss


def qemu_pids():
    """Every QEMU on the host (the bench's own: run it where nothing else
    runs QEMU; the table shows their count beside the guests')."""
    return [pid for pid in h.all_pids() if h.read(f"/proc/{pid}/comm").startswith("qemu-system")]


def exec_ms(daemon, env, cmd, n=5):
    times = []
    for _ in range(n):
        t = time.perf_counter()
        r = h.expect_status(daemon.call("POST", f"/v1/environments/{env}/exec", {"cmd": cmd}), 200)
        times.append((time.perf_counter() - t) * 1000)
        if r["exit_code"] != 0:
            raise SystemExit(f"exec {cmd} in {env}: {r}")
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--accel", choices=["tcg", "kvm"], default="tcg")
    ap.add_argument("--ram-mb", type=int, default=128)
    ap.add_argument("--max", type=int, default=200)
    ap.add_argument("--step", type=int, default=10)
    ap.add_argument("--reserve-mb", type=int, default=2048)
    ap.add_argument("--json")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("SKIP: needs root (moatd creates namespaces, cgroups and QEMUs)")
        return 0
    tree = microvm.tool_tree(args.bin_dir, "moat-bench-density-tree-")
    m = h.Moatd(args.bin_dir, args=["--microvm-accel", args.accel, "--max-environments", str(args.max + 10)],
                storage_gb=64, prefix="moatd-bench-density-")
    rows = []
    stopped = ""
    spec = {"isolation": "microvm", "ram_mb": args.ram_mb, "storage_gb": 0.25}
    try:
        ns = h.expect_status(m.call("POST", "/v1/environments", {"spec": {"ram_mb": 64}}), 201)["id"]
        # The first create boots, the second saves the guest: the rest restore.
        for _ in range(2):
            env = h.expect_status(m.call("POST", "/v1/environments", {"template": tree, "spec": spec}), 201)
            h.expect_status(m.call("DELETE", f"/v1/environments/{env['id']}"), 204)
        vms = []
        base_available = mem_available_mb()
        while len(vms) < args.max:
            per_vm_mb = (base_available - mem_available_mb()) / len(vms) if vms else args.ram_mb * 2
            if mem_available_mb() - per_vm_mb < args.reserve_mb:
                stopped = f"the host's MemAvailable would fall under {args.reserve_mb} MiB"
                break
            t = time.perf_counter()
            status, body = m.call("POST", "/v1/environments", {"template": tree, "spec": spec})
            if status != 201:
                stopped = f"create {len(vms) + 1} answered {status}: {body}"
                break
            vms.append(body["id"])
            exec_ms(m, body["id"], UNAME, n=1)
            created_ms = (time.perf_counter() - t) * 1000
            if len(vms) == 1 or len(vms) % args.step == 0:
                time.sleep(2)  # idle: what they hold once nothing runs
                pids = qemu_pids()
                rss, pss = qemu_memory_kib(pids)
                vm_exec = ns_exec = 0.0
                vm_times, ns_times = [], []
                for _ in range(3):  # interleaved
                    vm_times.append(exec_ms(m, vms[0], UNAME))
                    ns_times.append(exec_ms(m, ns, ["true"]))
                vm_exec, ns_exec = statistics.median(vm_times), statistics.median(ns_times)
                rows.append({"vms": len(vms), "qemus": len(pids), "rss_mib_per_vm": rss / 1024 / len(pids),
                             "pss_mib_per_vm": pss / 1024 / len(pids), "available_mib": mem_available_mb(),
                             "last_create_ms": created_ms, "vm_exec_ms": vm_exec, "ns_exec_ms": ns_exec})
                print(f"  {rows[-1]}", file=sys.stderr, flush=True)
        else:
            stopped = f"--max {args.max} reached"
    finally:
        m.stop()
        m.remove()
        shutil.rmtree(tree, ignore_errors=True)
    first = rows[0]
    print(f"# {time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())} {os.uname().release} {os.cpu_count()} cpus, "
          f"{args.accel.upper()}, {args.ram_mb} MB guests, {mem_available_mb()} MiB available at the end")
    print("| idle microVMs | RSS MiB per VM | PSS MiB per VM | PSS / guest RAM | MemAvailable MiB | "
          "create -> first exec ms | exec in the first VM ms | vs namespace exec | vs at 1 VM |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ratio = r["vm_exec_ms"] / r["ns_exec_ms"]
        first_ratio = first["vm_exec_ms"] / first["ns_exec_ms"]
        print(f"| {r['vms']} | {r['rss_mib_per_vm']:.1f} | {r['pss_mib_per_vm']:.1f} | "
              f"{r['pss_mib_per_vm'] / args.ram_mb:.2f}x | {r['available_mib']} | {r['last_create_ms']:.0f} | "
              f"{r['vm_exec_ms']:.1f} | {ratio:.1f}x | {ratio / first_ratio:.2f}x |")
    print(f"stopped: {stopped}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "stopped": stopped, "ram_mb": args.ram_mb}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
