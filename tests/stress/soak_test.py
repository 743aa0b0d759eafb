#!/usr/bin/env python3
"""Soak: N create -> exec -> files -> destroy cycles through moatd's API, and
everything moatd holds or leaves on the host counted before and after.

  soak_test.py --bin-dir build/bin [--cycles 200] [--network-every 10]
               [--checkpoint-every 1000] [--json FILE]

Each cycle creates an environment, runs a command, writes a file and reads
it back, and destroys it. Every --network-every'th cycle creates it with an
allowlist network policy (a veth in moatd's egress namespace), sends one
refused HTTPS request through moatd's proxy from inside, and every other such
cycle takes the link away again with PUT network "none" before the destroy.
Every 25th cycle leaves a background process running into the destroy.
Requests alternate between one keep-alive connection and a fresh connection
each (moatd runs a thread per connection).

After a warm-up, a baseline census (moatd_harness.census) is taken; after
the cycles (and at every checkpoint) the census must come back to it: moatd's
open files and threads, the spawner's open files, processes, network
namespaces, cgroups, mounts, loop devices, egress links and lock files
exactly; moatd's RSS within --rss-slack-mib (SQLite's page cache and malloc
arenas grow to a ceiling). Growth is reported per 1,000 cycles. At the end,
SIGTERM to moatd must leave nothing but the storage pool (which moatd keeps
mounted by design), and its unmount the loop device.

Needs root (prints SKIP and exits 77, CTest's "skipped", otherwise).
"""

import argparse
import json
import os
import random
import subprocess
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import moatd_harness as h  # noqa: E402

EXACT = ["moatd_fds", "moatd_threads", "spawners", "spawner_fds", "env_processes", "env_pid1s",
         "env_netns", "state_mounts", "egress_links", "loop_devices", "lock_files", "cgroups"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--cycles", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--network-every", type=int, default=10)
    ap.add_argument("--checkpoint-every", type=int, default=0, help="census every N cycles (0: at the end only)")
    ap.add_argument("--rss-slack-mib", type=float, default=16)
    ap.add_argument("--json", help="write the results here too")
    ap.add_argument("--keep", action="store_true", help="leave the state directory (debugging)")
    args = ap.parse_args()
    if not h.is_root():
        print("SKIP: needs root (moatd creates namespaces, cgroups and mounts)")
        return 77  # CTest's "skipped" (SKIP_RETURN_CODE), not a pass

    moatd = h.Moatd(args.bin_dir, prefix="moatd-soak-")
    failures = []
    try:
        results = soak(moatd, args, failures)
        results.update(teardown(moatd, results.pop("_ids"), results.pop("_parents"), failures))
    except Exception as e:  # report what moatd said before it goes
        failures.append(f"{type(e).__name__}: {e}")
        results = {}
        print(moatd.log(), file=sys.stderr)
    finally:
        if not args.keep:
            moatd.remove()
    results["failures"] = failures
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    print(json.dumps(results, indent=1))
    if failures:
        print("FAIL:\n  " + "\n  ".join(failures))
        return 1
    print("PASS")
    return 0


def settle(moatd, ids, parents, baseline, timeout=20):
    """The census once it equals the baseline on every exact count (what
    the kernel tears down asynchronously needs a moment: network namespaces
    and their veths, exited connection threads), or the last one taken."""
    last = None

    def ok():
        nonlocal last
        last = h.census(moatd, ids, parents)
        return all(last.get(k) == baseline.get(k) for k in EXACT)

    h.wait_until(ok, timeout, step=0.1)
    return last


def stable_census(moatd, ids, parents, timeout=10):
    """A census that two readings 0.5 s apart agree on (exact counts)."""
    previous = h.census(moatd, ids, parents)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = h.census(moatd, ids, parents)
        if all(now.get(k) == previous.get(k) for k in EXACT):
            return now
        previous = now
    return previous


def soak(moatd, args, failures):
    rng = random.Random(1)
    parents = h.cgroup_parents(moatd.pid)
    keep = moatd.client(keep=True)
    fresh = moatd.client(keep=False)
    ids = set()
    errors = []
    latency = {"cycle": [], "create": [], "exec": [], "destroy": []}

    def expect(what, got, status):
        if got[0] != status:
            errors.append(f"{what}: {got[0]} {str(got[1])[:300]}")
            return False
        return True

    def cycle(i):
        c = keep if i % 2 == 0 else fresh
        t0 = time.perf_counter()
        networked = args.network_every > 0 and i % args.network_every == 0
        body = {"task_id": f"soak-{i}", "labels": {"suite": "soak"}, "ttl_s": 3600}
        if networked:
            body["network"] = {"mode": "allowlist", "allow": ["allowed.example.invalid"]}
        r = c.call("POST", "/v1/environments", body)
        t1 = time.perf_counter()
        if not expect(f"cycle {i} create", r, 201):
            return
        env = r[1]["id"]
        ids.add(env)
        base = f"/v1/environments/{env}"
        r = c.call("POST", base + "/exec", {"cmd": ["sh", "-c", "echo $((6*7)); echo $HOSTNAME > /workspace/id"]})
        t2 = time.perf_counter()
        if expect(f"cycle {i} exec", r, 200) and r[1].get("stdout") != "42\n":
            errors.append(f"cycle {i} exec: {r[1]}")
        data = rng.randbytes(rng.randint(1, 64 << 10))
        r = c.call("PUT", base + "/files?path=/workspace/sub/data.bin", data)
        if expect(f"cycle {i} write", r, 200):
            r = c.call("GET", base + "/files?path=/workspace/sub/data.bin", raw=True)
            if expect(f"cycle {i} read", r, 200) and r[1] != data:
                errors.append(f"cycle {i} read: {len(r[1])} bytes differ from the {len(data)} written")
        if networked:
            r = c.call("GET", base + "/network")
            if expect(f"cycle {i} network", r, 200) and "link" not in r[1]:
                errors.append(f"cycle {i} network: no link: {r[1]}")
            # Through moatd's proxy to a host off the allowlist: refused (the
            # gate's default denies), nothing leaves the machine.
            r = c.call("POST", base + "/exec", {"cmd": ["curl", "-sS", "-m", "10", "-o", "/dev/null",
                                                        "https://refused.example.invalid/"], "timeout_ms": 20000})
            if expect(f"cycle {i} curl", r, 200) and "403" not in r[1].get("stderr", ""):
                errors.append(f"cycle {i} curl through the proxy: {r[1]}")
            if (i // args.network_every) % 2 == 1:
                r = c.call("PUT", base + "/network", {"network": "none"})
                expect(f"cycle {i} network none", r, 200)
        if i % 25 == 0:
            r = c.call("POST", base + "/processes", {"cmd": ["sleep", "300"], "stdin": False})
            expect(f"cycle {i} background process", r, 201)
        t3 = time.perf_counter()
        r = c.call("DELETE", base)
        t4 = time.perf_counter()
        expect(f"cycle {i} destroy", r, 204)
        latency["cycle"].append(t4 - t0)
        latency["create"].append(t1 - t0)
        latency["exec"].append(t2 - t1)
        latency["destroy"].append(t4 - t3)

    def run(start, count):
        for i in range(start, start + count):
            try:
                cycle(i)
            except Exception as e:  # a broken connection: counted, the soak goes on
                errors.append(f"cycle {i}: {type(e).__name__}: {e}")
                keep.close()
            if len(errors) > 50:
                raise RuntimeError("more than 50 errors: " + "; ".join(errors[:5]))

    run(0, args.warmup)
    keep.close()
    baseline = stable_census(moatd, ids, parents)
    print("baseline after %d warm-up cycles: %s" % (args.warmup, json.dumps(baseline)), flush=True)
    checkpoints = [{"cycles": 0, "seconds": 0.0, **baseline}]
    start = time.monotonic()
    done = 0
    step = args.checkpoint_every or args.cycles
    while done < args.cycles:
        n = min(step, args.cycles - done)
        run(args.warmup + done, n)
        done += n
        keep.close()
        snap = settle(moatd, ids, parents, baseline)
        snap.update(cycles=done, seconds=round(time.monotonic() - start, 1))
        checkpoints.append(snap)
        print("after %d cycles (%.0f s): %s" % (done, snap["seconds"], json.dumps(snap)), flush=True)
    end = checkpoints[-1]
    for k in EXACT:
        if end.get(k) != baseline.get(k):
            failures.append(f"{k}: {baseline.get(k)} at the start, {end.get(k)} after {done} cycles")
    growth = {}
    for k in ("moatd_rss_kib", "spawner_rss_kib", "host_mounts", "store_kib", "pool_used_kib"):
        if k in end and k in baseline:
            growth[k] = round((end[k] - baseline[k]) * 1000.0 / done, 1)
    rss_growth_mib = (end["moatd_rss_kib"] - baseline["moatd_rss_kib"]) / 1024.0
    if rss_growth_mib > args.rss_slack_mib:
        failures.append(f"moatd RSS grew {rss_growth_mib:.1f} MiB (slack {args.rss_slack_mib} MiB)")
    # Steady state: growth over the second half, where a warm-up's one-off
    # allocations are behind (only with checkpoints).
    if len(checkpoints) >= 3:
        mid = checkpoints[len(checkpoints) // 2]
        span = end["cycles"] - mid["cycles"]
        if span > 0:
            growth["moatd_rss_kib_second_half"] = round((end["moatd_rss_kib"] - mid["moatd_rss_kib"]) * 1000.0 / span, 1)
    if errors:
        failures.append(f"{len(errors)} failed requests; first: " + "; ".join(errors[:5]))
    ms = lambda v: round(v * 1000, 2)  # noqa: E731
    lat = {op: {"p50_ms": ms(h.percentile(v, 50)), "p99_ms": ms(h.percentile(v, 99))}
           for op, v in latency.items() if v}
    return {"cycles": done, "seconds": end["seconds"], "errors": len(errors), "baseline": baseline,
            "end": end, "growth_per_1000_cycles": growth, "latency": lat, "checkpoints": checkpoints,
            "_ids": ids, "_parents": parents}


def teardown(moatd, ids, parents, failures):
    """SIGTERM: moatd and its spawner go, and with them everything but the
    storage pool; unmounting the pool frees its loop device."""
    moatd.stop()
    # The spawner answers moatd's shutdown, then exits: a moment later.
    h.wait_until(lambda: not moatd.spawner_pids(), 10)
    after = h.census(moatd, ids, parents)
    want = {"spawners": 0, "env_processes": 0, "cgroups": 0, "state_mounts": 2, "loop_devices": 1,  # mounts: the pool, its skeletons tmpfs
            "lock_files": 0, "egress_links": -1}
    for k, v in want.items():
        if after.get(k) != v:
            failures.append(f"after SIGTERM: {k} is {after.get(k)}, expected {v}")
    storage = os.path.join(moatd.state, "storage")
    subprocess.run(["umount", "-l", storage], check=False)
    loops = h.wait_until(lambda: h.census(moatd, ids, parents)["loop_devices"] == 0, 10)
    if not loops:
        failures.append("the storage pool's loop device outlived its unmount")
    return {"after_sigterm": after}


if __name__ == "__main__":
    sys.exit(main())
