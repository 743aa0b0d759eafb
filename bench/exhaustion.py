#!/usr/bin/env python3
"""Exhaustion benchmark: a neighbour's exec latency while another environment attacks.

Runs the exhaustion suite (tests/security/exhaustion_test.py: its moatd, its
environments with ram_mb 256, pids 128, storage_gb 0.5, its attacks and all
their assertions) with every attack held for longer, then prints one table:
for each attack, the p50/p99/max of the neighbour environment's sequential
`true` execs through the API (its own key), how many ran, and what moatd
peaked at. The issue's target for the neighbour is p99 under 50 ms.

  bench/exhaustion.py --bin-dir build/bin [--seconds 15] [--json FILE] [-k NAME]

Needs root (moatd creates namespaces); exits 0 with SKIP otherwise.
"""

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TEST = os.path.join(HERE, "..", "tests", "security", "exhaustion_test.py")


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin-dir", required=True)
    parser.add_argument("--seconds", type=float, default=15, help="how long each attack runs")
    parser.add_argument("--json", help="also write the raw measurements here")
    args, rest = parser.parse_known_args()
    if os.geteuid() != 0:
        print("SKIP: the exhaustion benchmark needs root (moatd creates namespaces)")
        return 0
    with tempfile.NamedTemporaryFile(suffix=".json") as report:
        started = datetime.datetime.now(datetime.timezone.utc)
        load_before = loadavg()
        run = subprocess.run([sys.executable, TEST, "--bin-dir", args.bin_dir, "--seconds", str(args.seconds),
                              "--report", report.name, *rest])
        with open(report.name) as f:
            results = json.load(f)
    results.sort(key=lambda r: r["attack"] != "none (baseline)")  # the baseline first, then as they ran
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    print()
    print(f"{started:%Y-%m-%d %H:%M} UTC, {platform.node()}, {os.cpu_count()} CPUs, "
          f"{args.seconds:g} s per attack, load average {load_before} before / {loadavg()} after")
    print()
    print("| attack | neighbour execs | p50 ms | p99 ms | max ms | p99 < 50 ms | /healthz max ms "
          "| moatd CPU s | moatd RSS peak MiB (before) | moatd threads / fds peak |")
    print("|---|---:|---:|---:|---:|---|---:|---:|---:|---:|")
    for r in results:
        ok = "yes" if r["p99_ms"] < 50 else "**no**"
        print(f"| {r['attack']} | {r['execs']} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['max_ms']:.2f} | {ok} "
              f"| {r['healthz_max_ms']:.1f} | {r['moatd_cpu_s']:.2f} | {r['moatd_rss_peak_mib']:.0f} ({r['moatd_rss_mib']:.0f}) "
              f"| {r['moatd_threads_peak']} / {r['moatd_fds_peak']} |")
    print()
    skip = {"attack", "seconds", "execs", "p50_ms", "p99_ms", "max_ms", "neighbour_failures", "healthz_max_ms",
            "moatd_rss_mib", "moatd_rss_peak_mib", "moatd_threads_peak", "moatd_fds_peak", "moatd_cpu_s"}
    for r in results:
        extra = {k: v for k, v in r.items() if k not in skip}
        print(f"- {r['attack']}: " + ", ".join(f"{k} {json.dumps(v)}" for k, v in extra.items()))
    return run.returncode


if __name__ == "__main__":
    sys.exit(main())
