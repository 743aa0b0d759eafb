#!/usr/bin/env python3
"""Pause and resume latency through moatd's API (docs/PAUSE.md), against
the kernel's own freezer on a bare cgroup, interleaved in one run.

For each memory size (--mib, default 64, 256 and 1024): an environment
runs a counter (a shell loop that forks) and a python process holding that
many MiB, touched; the peer is a bare cgroup of the freezer (this host's:
the v1 freezer hierarchy, or cgroup.freeze on cgroup v2) holding the same
two processes, frozen the way moat freezes (on v1, asked again while a
vfork parent keeps it FREEZING). Per round: moat's pause (POST .../pause, until the answer),
the peer's freeze (write, then poll until the kernel says frozen), moat's
resume, the peer's thaw. Prints p50/p99 per operation and moat's ratio to
the peer.

With --to-disk: a microVM environment (a static busybox template, RAM
twice the size plus 256 MB: its /dev/shm holds half) holding each size in
its /dev/shm (random bytes, written by a command), checkpointed to disk (POST .../pause {"memory": "disk"}) and
resumed from it, per round; the peer, interleaved, is writing a file of
the checkpoint's size on the same file system and syncing it, then reading
it back cold (what saving and loading that many bytes costs here at least).

With --microvm: a microVM environment (a static busybox template, 256 MB)
running the same counter, paused and resumed by its guest's moat-init
(docs/PAUSE.md, "microVM environments"), against a namespace environment
running it on the same moatd, interleaved per round (instead of the
memory sizes' rows).

With --fork-memory N: a microVM environment (the busybox template) holding
each size in its /dev/shm and running a shell that was told a variable (a
REPL holding state) is forked with its memory N times at once (POST
.../fork {"memory": true, "count": N}); each copy's shell is then asked for
the variable (written to a file the bench reads back), which it must still
have. The peer, interleaved per round, is N forks of its files alone
(POST .../fork {"count": N}: each copy restored from the saved guest,
nothing of the source's processes). Prints the time to N copies and to
every copy's answer.

  bench/pause.py --bin-dir build/bin [--mib 64,256,1024] [--runs 20] [--microvm | --to-disk | --fork-memory N] [--json FILE]

Needs root; exits 0 with SKIP otherwise.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "stress"))
import moatd_harness as h  # noqa: E402

COUNTER = "i=0; while :; do i=$((i+1)); /bin/echo $i > /tmp/n; done"


def holder(mib):
    # Touches every page, then waits.
    return f"import time; b = bytearray({mib} << 20); b[::4096] = b'x' * len(b[::4096]); time.sleep(86400)"


class BareCgroup:
    """A cgroup with the same processes, frozen and thawed by hand."""

    def __init__(self, name):
        if os.path.isdir("/sys/fs/cgroup/freezer"):
            self.v2 = False
            self.dir = f"/sys/fs/cgroup/freezer/{name}"
        else:
            mount = next(line.split()[1] for line in open("/proc/mounts") if line.split()[2] == "cgroup2")
            self.v2 = True
            self.dir = f"{mount}/{name}"
        os.makedirs(self.dir, exist_ok=True)
        self.procs = []

    def start(self, argv):
        p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(f"{self.dir}/cgroup.procs", "w") as f:
            f.write(str(p.pid))
        self.procs.append(p)

    def _write(self, name, value):
        with open(f"{self.dir}/{name}", "w") as f:
            f.write(value)

    def _read(self, name):
        with open(f"{self.dir}/{name}") as f:
            return f.read()

    def freeze(self):
        if self.v2:
            self._write("cgroup.freeze", "1")
            while "frozen 1" not in self._read("cgroup.events"):
                pass
            return
        # The v1 freezer can miss a parent asleep in vfork whose child it
        # froze first (FREEZING for good): asked again after 20, 40, 80 ms...
        # as moat does (src/isolation/cgroup/freeze.cc).
        self._write("freezer.state", "FROZEN")
        wait = 0.02
        kick = time.perf_counter() + wait
        while not self._read("freezer.state").startswith("FROZEN"):
            if time.perf_counter() > kick:
                self._write("freezer.state", "THAWED")
                self._write("freezer.state", "FROZEN")
                wait *= 2
                kick = time.perf_counter() + wait

    def thaw(self):
        if self.v2:
            self._write("cgroup.freeze", "0")
        else:
            self._write("freezer.state", "THAWED")

    def remove(self):
        self.thaw()
        for p in self.procs:
            p.kill()
            p.wait()
        for _ in range(200):
            try:
                os.rmdir(self.dir)
                return
            except OSError:
                time.sleep(0.01)


def timed(fn):
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1000


def summary(values):
    s = sorted(values)
    return {"p50": round(statistics.median(s), 2), "p99": round(s[min(len(s) - 1, int(len(s) * 0.99))], 2)}


def busybox_template(flag, prefix):
    """A static busybox tree for microVM templates (tests/support), or the
    run ends saying what `flag` lacks."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "support"))
    import busybox_tree  # noqa: E402
    why = busybox_tree.missing()
    if why:
        raise SystemExit(f"{flag}: {why}")
    return busybox_tree.busybox_tree(prefix=prefix)


def microvm_row(m, runs):
    """A microVM's pause and resume against a namespace environment's, per
    round: vm pause, namespace pause, vm resume, namespace resume."""
    tree = busybox_template("--microvm", "moat-bench-pause-vm-")
    envs = {}
    try:
        envs["microvm"] = h.expect_status(m.call("POST", "/v1/environments", {
            "template": tree, "spec": {"isolation": "microvm", "ram_mb": 256}}), 201)["id"]
        envs["namespaces"] = h.expect_status(m.call("POST", "/v1/environments", {"spec": {"ram_mb": 256}}), 201)["id"]
        for env in envs.values():
            h.expect_status(m.call("POST", f"/v1/environments/{env}/processes", {"cmd": ["sh", "-c", COUNTER]}), 201)
        time.sleep(1)
        samples = {f"{kind} {op}": [] for op in ("pause", "resume") for kind in envs}
        for _ in range(runs):
            for op in ("pause", "resume"):
                for kind, env in envs.items():
                    samples[f"{kind} {op}"].append(
                        timed(lambda: h.expect_status(m.call("POST", f"/v1/environments/{env}/{op}"), 200)))
            time.sleep(0.05)
        row = {k: summary(v) for k, v in samples.items()}
        for op in ("pause", "resume"):
            row[f"microvm / namespaces {op} (p50)"] = round(
                row[f"microvm {op}"]["p50"] / max(row[f"namespaces {op}"]["p50"], 1e-3), 1)
        return row
    finally:
        for env in envs.values():
            m.call("DELETE", f"/v1/environments/{env}")
        shutil.rmtree(tree, ignore_errors=True)


def holding_guest(m, tree, mib):
    """A microVM environment of the busybox template `tree` holding `mib`
    MiB of random bytes in its /dev/shm (its RAM twice that and 256 MB): its
    id."""
    env = h.expect_status(m.call("POST", "/v1/environments", {
        "template": tree, "spec": {"isolation": "microvm", "ram_mb": 2 * mib + 256}}), 201)["id"]
    held = h.expect_status(m.call("POST", f"/v1/environments/{env}/exec", {"cmd": [
        "sh", "-c", f"dd if=/dev/urandom of=/dev/shm/held bs=1M count={mib} 2>/dev/null; du -m /dev/shm/held"]}), 200)
    if not held.get("stdout", "").startswith(f"{mib}\t"):
        raise SystemExit(f"the guest did not hold {mib} MiB in /dev/shm: {held}")
    return env


def to_disk_rows(m, sizes, runs):
    """A microVM's checkpoint to disk and restore, per memory size, against
    writing and reading back a file of the checkpoint's size."""
    tree = busybox_template("--to-disk", "moat-bench-checkpoint-")
    rows = {}
    try:
        for mib in sizes:
            env = holding_guest(m, tree, mib)
            base = f"/v1/environments/{env}"
            vm_dir = os.path.join(m.state, "microvm", "vms", env)
            peer = os.path.join(m.state, f"bench-peer-{mib}")
            try:
                h.expect_status(m.call("POST", f"{base}/processes", {"cmd": ["sh", "-c", COUNTER]}), 201)
                samples = {k: [] for k in ("checkpoint", "restore", "peer write+sync", "peer cold read")}
                sizes_mib = []
                for _ in range(runs):
                    samples["checkpoint"].append(timed(lambda: h.expect_status(
                        m.call("POST", f"{base}/pause", {"memory": "disk"}), 200)))
                    state = [f for f in os.listdir(vm_dir) if f.startswith("memory.") and f.endswith(".state")]
                    size = os.path.getsize(os.path.join(vm_dir, state[0])) if state else 0
                    sizes_mib.append(size / (1 << 20))
                    samples["restore"].append(timed(lambda: h.expect_status(m.call("POST", f"{base}/resume"), 200)))
                    chunk = os.urandom(1 << 20)

                    def write():
                        with open(peer, "wb") as f:
                            for _ in range(max(1, size >> 20)):
                                f.write(chunk)
                            f.flush()
                            os.fsync(f.fileno())

                    def read():
                        with open(peer, "rb") as f:
                            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
                            while f.read(1 << 20):
                                pass

                    samples["peer write+sync"].append(timed(write))
                    samples["peer cold read"].append(timed(read))
                    os.unlink(peer)
                row = {k: summary(v) for k, v in samples.items()}
                row["checkpoint MiB (p50)"] = round(statistics.median(sizes_mib), 1)
                row["checkpoint / write (p50)"] = round(
                    row["checkpoint"]["p50"] / max(row["peer write+sync"]["p50"], 1e-3), 1)
                row["restore / read (p50)"] = round(row["restore"]["p50"] / max(row["peer cold read"]["p50"], 1e-3), 1)
                rows[f"{mib} MiB held"] = row
                print(f"to disk, {mib} MiB held: " + json.dumps(row), flush=True)
            finally:
                m.call("DELETE", base)
                if os.path.exists(peer):
                    os.unlink(peer)
    finally:
        shutil.rmtree(tree, ignore_errors=True)
    return rows


def fork_rows(m, sizes, count, runs):
    """N memory forks of a microVM whose shell holds a variable, against N
    forks of its files, per memory size."""
    tree = busybox_template("--fork-memory", "moat-bench-fork-")
    rows = {}
    try:
        for mib in sizes:
            env = holding_guest(m, tree, mib)
            base = f"/v1/environments/{env}"
            try:
                repl = h.expect_status(m.call("POST", f"{base}/processes", {"cmd": ["sh"], "stdin": True}), 201)["id"]
                h.expect_status(m.call("POST", f"{base}/processes/{repl}/stdin", {"data": f"x=kept-{mib}\n"}), 204)
                samples = {k: [] for k in (f"{count} memory forks", "every copy answered", f"{count} file forks")}
                for _ in range(runs):
                    t = time.perf_counter()
                    made = h.expect_status(m.call("POST", f"{base}/fork", {"memory": True, "count": count}), 201)
                    samples[f"{count} memory forks"].append((time.perf_counter() - t) * 1000)
                    copies = [e["id"] for e in made["environments"]]
                    for c in copies:
                        h.expect_status(m.call("POST", f"/v1/environments/{c}/processes/{repl}/stdin",
                                               {"data": "echo $x > /workspace/x\n"}), 204)
                    for c in copies:
                        deadline = time.monotonic() + 60
                        while True:
                            got = m.call("GET", f"/v1/environments/{c}/files?path=/workspace/x", raw=True)
                            if got[0] == 200 and got[1].strip() == f"kept-{mib}".encode():
                                break
                            if time.monotonic() > deadline:
                                raise SystemExit(f"fork {c} did not answer with the variable: {got}")
                            time.sleep(0.01)
                    samples["every copy answered"].append((time.perf_counter() - t) * 1000)
                    for c in copies:
                        m.call("DELETE", f"/v1/environments/{c}")
                    t = time.perf_counter()
                    made = h.expect_status(m.call("POST", f"{base}/fork", {"count": count}), 201)
                    samples[f"{count} file forks"].append((time.perf_counter() - t) * 1000)
                    for e in made["environments"]:
                        m.call("DELETE", f"/v1/environments/{e['id']}")
                row = {k: summary(v) for k, v in samples.items()}
                row["memory / file forks (p50)"] = round(
                    row[f"{count} memory forks"]["p50"] / max(row[f"{count} file forks"]["p50"], 1e-3), 2)
                rows[f"{mib} MiB held"] = row
                print(f"fork with memory x{count}, {mib} MiB held: " + json.dumps(row), flush=True)
            finally:
                m.call("DELETE", base)
    finally:
        shutil.rmtree(tree, ignore_errors=True)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--mib", default="64,256,1024")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--microvm", action="store_true")
    ap.add_argument("--to-disk", action="store_true")
    ap.add_argument("--fork-memory", type=int, default=0)
    ap.add_argument("--json")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("SKIP: needs root (moatd creates namespaces, cgroups and mounts)")
        return 0
    sizes = [int(x) for x in args.mib.split(",")] if not (args.microvm or args.to_disk or args.fork_memory) else []
    m = h.Moatd(args.bin_dir, prefix="moatd-bench-pause-")
    results = {}
    try:
        for mib in sizes:
            env = h.expect_status(m.call("POST", "/v1/environments", {"spec": {"ram_mb": mib + 512}}), 201)["id"]
            base = f"/v1/environments/{env}"
            for cmd in (["sh", "-c", COUNTER], ["python3", "-c", holder(mib)]):
                h.expect_status(m.call("POST", f"{base}/processes", {"cmd": cmd}), 201)
            peer = BareCgroup(f"moat-bench-pause-{os.getpid()}-{mib}")
            peer.start(["sh", "-c", COUNTER.replace("/tmp/n", f"/tmp/moat-bench-pause-{os.getpid()}")])
            peer.start(["python3", "-c", holder(mib)])
            # Until both hold their memory.
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                used = h.expect_status(m.call("GET", f"{base}/stats"), 200).get("memory_bytes", 0)
                if used >= mib << 20:
                    break
                time.sleep(0.1)
            time.sleep(1)
            samples = {k: [] for k in ("moat pause", "freezer freeze", "moat resume", "freezer thaw")}
            try:
                for _ in range(args.runs):
                    samples["moat pause"].append(timed(lambda: h.expect_status(m.call("POST", f"{base}/pause"), 200)))
                    samples["freezer freeze"].append(timed(peer.freeze))
                    samples["moat resume"].append(timed(lambda: h.expect_status(m.call("POST", f"{base}/resume"), 200)))
                    samples["freezer thaw"].append(timed(peer.thaw))
                    time.sleep(0.05)  # both run a moment between rounds
            finally:
                peer.remove()
                h.expect_status(m.call("DELETE", base), 204)
            row = {k: summary(v) for k, v in samples.items()}
            row["pause / freeze (p50)"] = round(row["moat pause"]["p50"] / max(row["freezer freeze"]["p50"], 1e-3), 1)
            row["resume / thaw (p50)"] = round(row["moat resume"]["p50"] / max(row["freezer thaw"]["p50"], 1e-3), 1)
            results[f"{mib} MiB"] = row
            print(f"{mib} MiB: " + json.dumps(row))
        if args.to_disk:
            results["to disk"] = to_disk_rows(m, [int(x) for x in args.mib.split(",")], args.runs)
        if args.fork_memory:
            results["fork with memory"] = fork_rows(m, [int(x) for x in args.mib.split(",")], args.fork_memory,
                                                    args.runs)
        if args.microvm:
            results["microvm"] = microvm_row(m, args.runs)
            print("microvm: " + json.dumps(results["microvm"]))
    finally:
        m.stop()
        m.remove()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
