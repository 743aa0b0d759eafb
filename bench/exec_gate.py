#!/usr/bin/env python3
"""The exec gate's cost: what every exec inside a moatd environment pays
for being handed to moat-init (and, when the permissions judge programs, to
moatd) before it runs, against the same loop under `moat run` (no gate),
interleaved round by round.

Each round runs, in each setup, a shell loop of N execs of /bin/true and
takes the time the loop itself measured inside (so start-up and the API
do not count):

- moat run: the CLI's environment, no exec gate (the floor);
- moatd, default permissions: moat-init answers every exec itself (the
  kernel's notification and one answer);
- moatd, run_command rules: moat-init reads each exec's argv from the
  process's memory, judges it by the rules moatd gave it and reports it
  (program.started, batched); no round trip to moatd; then traces each
  allowed exec until it has happened (the second look).

and, as the floor of what the gate can cost on this machine, the kernel's
mechanism alone on the host (moat-exec-floor-bench): the same loop with no
filter, with the gate's seccomp filter answered at once, and with each exec
also traced to its stop after the exec.

  bench/exec_gate.py --bin-dir build/bin [--rounds 15] [--execs 200]

Needs root; exits 77 with SKIP otherwise.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "stress"))
import moatd_harness as h  # noqa: E402

LOOP = ('s=$(date +%s%N); i=0; while [ $i -lt {n} ]; do /bin/true; i=$((i+1)); done; '
        'e=$(date +%s%N); echo $(((e-s)/1000))')


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--execs", type=int, default=200)
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("SKIP: needs root (moatd creates namespaces, cgroups and mounts)")
        return 77
    loop = LOOP.format(n=args.execs)
    m = h.Moatd(args.bin_dir, prefix="moatd-bench-gate-")
    try:
        envs = {}
        for name, perms in (("default", None), ("rules", {"run_command": [{"match": ["*"], "action": "allow"}]})):
            body = {"permissions": perms} if perms else {}
            status, r = m.call("POST", "/v1/environments", body)
            assert status == 201, (status, r)
            envs[name] = r["id"]
        samples = {"moat run": [], "moatd, default permissions": [], "moatd, run_command rules": []}
        floor_samples = {"host, no filter": [], "host, seccomp listener answering at once": [],
                         "host, listener and trace to the exec's stop": []}
        floor_bin = os.path.join(args.bin_dir, "moat-exec-floor-bench")
        state = tempfile.mkdtemp(prefix="moat-bench-gate-cli-")
        for _ in range(args.rounds):
            out = subprocess.run([os.path.join(args.bin_dir, "moat"), "run", "--", "sh", "-c", loop],
                                 capture_output=True, text=True, env={"PATH": h.PATH, "MOAT_STATE": state}, check=True)
            samples["moat run"].append(int(out.stdout) / args.execs)
            for name, label in (("default", "moatd, default permissions"), ("rules", "moatd, run_command rules")):
                status, r = m.call("POST", f"/v1/environments/{envs[name]}/exec", {"cmd": ["sh", "-c", loop]})
                assert status == 200 and r["exit_code"] == 0, (status, r)
                samples[label].append(int(r["stdout"]) / args.execs)
            for mode, label in zip(("none", "notify", "trace"), floor_samples):
                out = subprocess.run([floor_bin, mode, str(args.execs)], capture_output=True, text=True, check=True)
                floor_samples[label].append(float(out.stdout))
        floor = statistics.median(samples["moat run"])
        print(f"| setup | µs per exec of /bin/true (median of {args.rounds}) | gate's cost |")
        print("|---|---:|---:|")
        for label, values in samples.items():
            med = statistics.median(values)
            cost = "" if label == "moat run" else f"{med - floor:+.0f} µs ({(med - floor) / floor * 100:+.1f} %)"
            print(f"| {label} | {med:.0f} | {cost} |")
        print()
        print(f"| the mechanism alone | µs per exec (median of {args.rounds}) | its cost |")
        print("|---|---:|---:|")
        host = statistics.median(floor_samples["host, no filter"])
        for label, values in floor_samples.items():
            med = statistics.median(values)
            cost = "" if label == "host, no filter" else f"{med - host:+.0f} µs ({(med - host) / host * 100:+.1f} %)"
            print(f"| {label} | {med:.0f} | {cost} |")
    finally:
        m.stop()
        m.remove()
        if "state" in locals():
            subprocess.run(["umount", "-l", os.path.join(state, "storage")], capture_output=True)
            shutil.rmtree(state, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
