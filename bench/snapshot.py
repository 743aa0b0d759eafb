#!/usr/bin/env python3
"""Snapshot, fork and restore latency through moatd's API, against the
obvious alternative: copying the environment's files.

An environment gets a workspace of N files (a source tree's shape: many
small files, a few large ones); then, repeated: a snapshot (POST
/snapshots), a restore of it (POST /restore, the environment starts again
on it), a fork (POST /fork, a new environment with a copy, files re-owned to
its own id range) and, as the peer, `cp -a` of the same writable layer on
the same file system (what a snapshot-less runtime does to copy an
environment) and `cp -a --reflink=always` (the file system's copy-on-write,
per file). Prints p50/p99 per operation and ratios to cp.

  bench/snapshot.py --bin-dir build/bin [--files 10000] [--mib 64] [--runs 15] [--json FILE]

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


def timed(fn):
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1000


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--files", type=int, default=10000)
    ap.add_argument("--mib", type=int, default=64, help="bytes in a few large files, besides the small ones")
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--json")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("SKIP: needs root (moatd creates namespaces, cgroups and mounts)")
        return 0
    m = h.Moatd(args.bin_dir, prefix="moatd-bench-snap-")
    results = {}
    try:
        env = h.expect_status(m.call("POST", "/v1/environments", {"spec": {"storage_gb": 2, "ram_mb": 512}}), 201)["id"]
        script = (f"mkdir -p /workspace/src && cd /workspace/src && "
                  f"python3 -c \"import os\nfor i in range({args.files}):\n"
                  f"  d='d%03d' % (i % 100); os.makedirs(d, exist_ok=True)\n"
                  f"  open(f'{{d}}/f{{i}}.txt', 'w').write('x' * (i % 4096))\" && "
                  f"for i in 1 2 3 4; do head -c {args.mib // 4}M /dev/urandom > big$i.bin; done && sync")
        fill = {"cmd": ["sh", "-c", script], "timeout_ms": 600000}
        r = h.expect_status(m.call("POST", f"/v1/environments/{env}/exec", fill), 200)
        if r["exit_code"] != 0:
            raise SystemExit(f"filling the workspace failed: {r}")
        layer = os.path.join(m.state, "storage", "envs", env, "upper")
        copies = os.path.join(m.state, "storage", "bench-copies")
        os.makedirs(copies, exist_ok=True)
        samples = {k: [] for k in ("snapshot", "restore", "fork", "cp -a", "cp --reflink")}
        forks = []
        for i in range(args.runs):
            snap = {}
            samples["snapshot"].append(timed(lambda: snap.update(
                h.expect_status(m.call("POST", f"/v1/environments/{env}/snapshots", {}), 201))))
            samples["restore"].append(timed(lambda: h.expect_status(m.call(
                "POST", f"/v1/environments/{env}/restore", {"snapshot": snap["id"]}), 200)))
            fork = {}
            samples["fork"].append(timed(lambda: fork.update(
                h.expect_status(m.call("POST", f"/v1/environments/{env}/fork", {}), 201))))
            forks.append(fork["id"])
            h.expect_status(m.call("DELETE", f"/v1/snapshots/{snap['id']}"), 204)
            for name, extra in (("cp -a", []), ("cp --reflink", ["--reflink=always"])):
                target = os.path.join(copies, f"c{i}")
                samples[name].append(timed(lambda: subprocess.run(["cp", "-a", *extra, layer, target], check=True)))
                shutil.rmtree(target)
            while len(forks) > 2:
                m.call("DELETE", f"/v1/environments/{forks.pop(0)}")
        base = statistics.median(samples["cp -a"])
        print(f"workspace: {args.files} small files + {args.mib} MiB in 4 files; {args.runs} runs each")
        print(f"{'operation':<14} {'p50 ms':>9} {'p99 ms':>9} {'vs cp -a':>9}")
        for name, values in samples.items():
            p50 = statistics.median(values)
            results[name] = {"p50_ms": round(p50, 2), "p99_ms": round(h.nearest_rank(values, 99), 2)}
            print(f"{name:<14} {p50:>9.2f} {h.nearest_rank(values, 99):>9.2f} {p50 / base:>8.2f}x")
        results["files"] = args.files
        results["mib"] = args.mib
        results["runs"] = args.runs
    finally:
        m.remove()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
