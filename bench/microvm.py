#!/usr/bin/env python3
"""microVM environments against namespace ones and against QEMU's own
boot, interleaved in one run, through moatd's API.

Per round: a namespace environment created and its first command run; a
microVM environment (spec.isolation "microvm") the same, restored from
the saved guest (moatd's default); one booted cold (a second moatd with
--microvm-saved-guests 0); one claimed from a warm pool of one guest (a
third moatd with --warm-pool 1:...,isolation=microvm; the refill between
rounds is not timed); and, as the peer, the floor of any QEMU boot here:
the same QEMU, machine and guest kernel booting with nothing to run
(rdinit names no file: the kernel panics and QEMU ends), timed from exec
to exit. The create that saves the guest (the second of its machine) is
timed once. Then exec latency on one of each, a snapshot and a fork
(to the fork's first command) of the namespace environment and of the
restored microVM, interleaved (the microVM's: its guest synced and
stopped while its disk's volume is snapshotted; its fork restored from
the saved guest onto a copy of that disk), and the memory each holds
idle (its cgroup's: for a microVM, QEMU's, the guest's touched RAM and
TCG's cache included). All run the same template: a directory of one
static program (moat-guest-tool as /bin/tool).

  bench/microvm.py --bin-dir build/bin [--accel tcg|kvm] [--runs 10] [--execs 20] [--json FILE]

Needs root; exits 0 with SKIP otherwise.
"""

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "stress"))
import moatd_harness as h  # noqa: E402


def guest_kernel():
    named = os.environ.get("MOAT_GUEST_KERNEL")
    if named:
        return named
    found = sorted(glob.glob("/boot/vmlinuz-*-cloud-amd64"))
    if not found:
        raise SystemExit("no guest kernel: apt-get install linux-image-cloud-amd64 (make deps)")
    return found[-1]


UNAME = ["/bin/tool", "uname"]  # the command both kinds run


def tool_tree(bin_dir, prefix):
    """A microVM template (root's, 0755): moat-guest-tool as /bin/tool and
    nothing else; the caller removes it."""
    tree = tempfile.mkdtemp(prefix=prefix)
    os.chmod(tree, 0o755)
    os.makedirs(tree + "/bin", 0o755)
    shutil.copy(os.path.join(bin_dir, "moat-guest-tool"), tree + "/bin/tool")
    os.chmod(tree + "/bin/tool", 0o755)
    return tree


def host_tsc_khz():
    # What moat tells a TCG guest (backend/microvm/vm.cc hostTscKhz): without
    # it the microvm machine's kernel cannot calibrate its clock and hangs.
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("cpu MHz"):
                return int(float(line.split(":")[1]) * 1000)
    return 2000000


def qemu_floor_ms(kernel, accel):
    # The same machine and flags moat uses (backend/microvm/vm.cc qemuArgv),
    # without moat's initramfs, disks or port: a boot to the first thing it
    # would run, then the panic and QEMU's end.
    cmdline = "console=ttyS0 quiet panic=-1 reboot=t rdinit=/none"
    if accel == "kvm":
        machine = ["-M", "microvm", "-accel", "kvm", "-cpu", "host"]
    else:
        machine = ["-M", "microvm,pit=on", "-accel", "tcg,tb-size=128", "-cpu", "qemu64"]
        cmdline += f" tsc_early_khz={host_tsc_khz()}"
    argv = ["qemu-system-x86_64"] + machine + ["-m", "256", "-nodefaults", "-no-user-config", "-nographic",
                                              "-no-reboot", "-kernel", kernel, "-append", cmdline]
    t = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False, timeout=120)
    return (time.perf_counter() - t) * 1000


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--accel", choices=["tcg", "kvm"], default="tcg")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--execs", type=int, default=20)
    ap.add_argument("--json")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("SKIP: needs root (moatd creates namespaces, cgroups and QEMUs)")
        return 0
    kernel = guest_kernel()
    tree = tool_tree(args.bin_dir, "moat-bench-vm-tree-")
    m = h.Moatd(args.bin_dir, args=["--microvm-accel", args.accel], prefix="moatd-bench-vm-")
    cold = h.Moatd(args.bin_dir, args=["--microvm-accel", args.accel, "--microvm-saved-guests", "0"],
                   prefix="moatd-bench-vm-cold-")
    warm = h.Moatd(args.bin_dir, args=["--microvm-accel", args.accel, "--warm-pool",
                                       f"1:template={tree},ram_mb=256,isolation=microvm"],
                   prefix="moatd-bench-vm-warm-")
    # name -> (moatd, spec.isolation)
    kinds = {"namespaces": (m, "namespaces"), "microvm (restored)": (m, "microvm"),
             "microvm (cold boot)": (cold, "microvm"), "microvm (warm pool)": (warm, "microvm")}

    def pool_ready():
        """Until the warm pool holds its guest again (bounded: 120 s)."""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            text = warm.call("GET", "/metrics", raw=True)[1].decode()
            if "\nmoat_warm_pool_ready 1\n" in text:
                return
            time.sleep(0.05)
        raise SystemExit("the warm pool did not refill within 120 s")
    times = {name: [] for name in kinds}
    times["qemu floor"] = []
    execs = {name: [] for name in kinds}
    snaps = {"namespaces": [], "microvm (restored)": []}
    forks = {"namespaces": [], "microvm (restored)": []}
    idle = {}
    try:
        def create_and_run(name):
            daemon, isolation = kinds[name]
            spec = {"isolation": isolation, "ram_mb": 256}
            if daemon is warm:
                pool_ready()
            t = time.perf_counter()
            env = h.expect_status(daemon.call("POST", "/v1/environments", {"template": tree, "spec": spec}), 201)
            r = h.expect_status(daemon.call("POST", f"/v1/environments/{env['id']}/exec", {"cmd": UNAME}), 200)
            took = (time.perf_counter() - t) * 1000
            if r["exit_code"] != 0:
                raise SystemExit(f"{name}: {r}")
            return env["id"], took

        def destroy(name, env):
            h.expect_status(kinds[name][0].call("DELETE", f"/v1/environments/{env}"), 204)

        # One of each first (the image is made on each moatd's first microVM
        # create); the restoring moatd's second create of the machine saves
        # the guest (the first boots).
        first_saved_ms = None
        for name in kinds:
            env, _ = create_and_run(name)
            destroy(name, env)
        env, first_saved_ms = create_and_run("microvm (restored)")
        destroy("microvm (restored)", env)
        for _ in range(args.runs):
            for name in kinds:
                env, took = create_and_run(name)
                times[name].append(took)
                destroy(name, env)
            times["qemu floor"].append(qemu_floor_ms(kernel, args.accel))
        kept = {name: create_and_run(name)[0] for name in kinds}
        for _ in range(args.execs):
            for name, env in kept.items():
                t = time.perf_counter()
                h.expect_status(kinds[name][0].call("POST", f"/v1/environments/{env}/exec", {"cmd": UNAME}), 200)
                execs[name].append((time.perf_counter() - t) * 1000)
        for _ in range(args.runs):
            for name in ("namespaces", "microvm (restored)"):
                daemon, env = kinds[name][0], kept[name]
                t = time.perf_counter()
                snap = h.expect_status(daemon.call("POST", f"/v1/environments/{env}/snapshots", {}), 201)
                snaps[name].append((time.perf_counter() - t) * 1000)
                t = time.perf_counter()
                fork = h.expect_status(daemon.call("POST", f"/v1/environments/{env}/fork", {}), 201)
                h.expect_status(daemon.call("POST", f"/v1/environments/{fork['id']}/exec", {"cmd": UNAME}), 200)
                forks[name].append((time.perf_counter() - t) * 1000)
                destroy(name, fork["id"])
                h.expect_status(daemon.call("DELETE", f"/v1/snapshots/{snap['id']}"), 204)
        time.sleep(2)  # idle: what each holds once nothing runs
        for name, env in kept.items():
            stats = h.expect_status(kinds[name][0].call("GET", f"/v1/environments/{env}/stats"), 200)
            idle[name] = stats["memory_bytes"]
    finally:
        for daemon in (m, cold, warm):
            daemon.stop()
            daemon.remove()
        shutil.rmtree(tree, ignore_errors=True)
    floor = statistics.median(times["qemu floor"])
    print(f"# {time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())} {os.uname().release} {os.cpu_count()} cpus, "
          f"{args.runs} rounds, {args.accel.upper()}, guest kernel {os.path.basename(kernel)}")
    print("| create -> first exec | p50 ms | p90 ms | vs QEMU's boot floor |")
    print("|---|---|---|---|")
    for name, values in times.items():
        print(f"| {name} | {statistics.median(values):.0f} | {h.nearest_rank(values, 90):.0f} | "
              f"{statistics.median(values) / floor:.2f}x |")
    print(f"| the create that saves the guest (boots, saves, restores; once) | "
          f"{first_saved_ms:.0f} | | {first_saved_ms / floor:.2f}x |")
    print()
    print("| exec on a running environment | p50 ms | p90 ms | idle memory MiB |")
    print("|---|---|---|---|")
    for name, values in execs.items():
        print(f"| {name} | {statistics.median(values):.1f} | {h.nearest_rank(values, 90):.1f} | "
              f"{idle[name] / 2**20:.1f} |")
    print()
    print("| of a running environment | p50 ms | p90 ms | vs namespaces |")
    print("|---|---|---|---|")
    for what, values in (("snapshot", snaps), ("fork -> its first exec", forks)):
        base = statistics.median(values["namespaces"])
        for name, v in values.items():
            print(f"| {what}, {name} | {statistics.median(v):.1f} | {h.nearest_rank(v, 90):.1f} | "
                  f"{statistics.median(v) / base:.2f}x |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"create_ms": times, "first_saved_ms": first_saved_ms, "exec_ms": execs, "idle_bytes": idle,
                       "snapshot_ms": snaps, "fork_ms": forks}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
