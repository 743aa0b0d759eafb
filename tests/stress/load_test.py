#!/usr/bin/env python3
"""Load: C concurrent clients (threads, a keep-alive connection each) mixing
create, exec, file write, file read and destroy against one moatd for a
fixed time; p50/p99 per operation and every error.

  load_test.py --bin-dir build/bin [--clients 64] [--seconds 15] [--phases 1] [--json FILE]

Each client holds one environment at a time (so at most C exist, under
moatd's default --max-environments 256), created with ram_mb 128 (moatd
reserves ram_mb against the host's memory: 64 x the default 1024 MB would
not fit a small machine). It runs a random 2-12 operations in it, three in
four an exec and the rest file writes (1 B-256 KiB) each read back and
compared, then destroys it and creates the next. Any answer other than the
expected one is an error (target: none). Afterwards, moatd's threads and
open files and the spawner's must be back where they were before the load,
and no environment, process or cgroup may be left.

Needs root (prints SKIP and exits 77, CTest's "skipped", otherwise).
"""

import argparse
import json
import os
import random
import resource
import sys
import threading
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import moatd_harness as h  # noqa: E402

OPS = ("create", "exec", "write", "read", "destroy")
EXECS = (["true"], ["sh", "-c", "echo $HOSTNAME; ls /workspace | wc -l"], ["cat", "/etc/hostname"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument("--phases", type=int, default=1,
                    help="split the time into phases, fresh clients each, moatd's RSS after each")
    ap.add_argument("--json", help="write the results here too")
    args = ap.parse_args()
    if not h.is_root():
        print("SKIP: needs root (moatd creates namespaces, cgroups and mounts)")
        return 77  # CTest's "skipped" (SKIP_RETURN_CODE), not a pass
    # A thread that gets an answer should not wait 5 ms for the interpreter.
    sys.setswitchinterval(0.0005)
    moatd = h.Moatd(args.bin_dir, prefix="moatd-load-")
    failures = []
    try:
        results = load(moatd, args, failures)
    except Exception as e:
        failures.append(f"{type(e).__name__}: {e}")
        results = {}
        print(moatd.log(), file=sys.stderr)
    finally:
        try:
            moatd.stop()
        finally:
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


class Worker(threading.Thread):
    def __init__(self, moatd, n, deadline, ids):
        super().__init__(daemon=True)
        self.client = moatd.client(keep=True, timeout=300)
        self.rng = random.Random(n)
        self.n = n
        self.deadline = deadline
        self.ids = ids
        self.lat = {op: [] for op in OPS}
        self.errors = []
        self.env = None
        self.files = {}

    def timed(self, op, method, path, body=None, expect=200, raw=False):
        t = time.perf_counter()
        try:
            status, out = self.client.call(method, path, body, raw=raw)
        except Exception as e:
            self.errors.append(f"{op}: {type(e).__name__}: {e}")
            return None
        self.lat[op].append(time.perf_counter() - t)
        if status != expect:
            self.errors.append(f"{op}: {status} {str(out)[:200]}")
            return None
        return out

    def create(self):
        out = self.timed("create", "POST", "/v1/environments",
                         {"task_id": f"load-{self.n}", "spec": {"ram_mb": 128}, "labels": {"suite": "load"}},
                         expect=201)
        if out is not None:
            self.env = out["id"]
            self.ids.add(self.env)
            self.files = {}

    def destroy(self):
        self.timed("destroy", "DELETE", f"/v1/environments/{self.env}", expect=204)
        self.env = None

    def run(self):
        rng = self.rng
        while time.monotonic() < self.deadline:
            if self.env is None:
                self.create()
                if self.env is None:
                    time.sleep(0.05)  # an error: do not spin
                    continue
                budget = rng.randint(2, 12)
            base = f"/v1/environments/{self.env}"
            if budget == 0:
                self.destroy()
                continue
            budget -= 1
            if rng.random() < 0.75 or not self.files and rng.random() < 0.5:
                argv = rng.choice(EXECS)
                out = self.timed("exec", "POST", base + "/exec", {"cmd": argv, "timeout_ms": 60000})
                if out is not None and out.get("exit_code") != 0:
                    self.errors.append(f"exec {argv}: {out}")
            elif not self.files or rng.random() < 0.5:
                path = f"/workspace/f{rng.randint(0, 3)}.bin"
                data = rng.randbytes(rng.choice((1, 100, 4096, 65536, 262144)))
                if self.timed("write", "PUT", base + "/files?path=" + path, data) is not None:
                    self.files[path] = data
            else:
                path = rng.choice(sorted(self.files))
                out = self.timed("read", "GET", base + "/files?path=" + path, raw=True)
                if out is not None and out != self.files[path]:
                    self.errors.append(f"read {path}: {len(out)} bytes differ from the {len(self.files[path])} written")
        if self.env is not None:
            self.destroy()
        self.client.close()


def load(moatd, args, failures):
    parents = h.cgroup_parents(moatd.pid)
    ids = set()
    # Warm-up: the first create makes the storage pool and the template.
    c = moatd.client()
    status, env = c.call("POST", "/v1/environments", {"spec": {"ram_mb": 128}})
    assert status == 201, (status, env)
    ids.add(env["id"])
    c.call("POST", f"/v1/environments/{env['id']}/exec", {"cmd": ["true"]})
    c.call("DELETE", f"/v1/environments/{env['id']}")
    c.close()
    time.sleep(1)
    before = h.census(moatd, ids, parents)
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    moatd_cpu0 = proc_cpu(moatd.pid)
    spawner = moatd.spawner_pids()[0]
    spawner_cpu0 = proc_cpu(spawner)
    start = time.monotonic()
    peak = {"envs": 0, "moatd_threads": 0, "moatd_fds": 0}
    workers = []
    rss_after_phase = []
    for phase in range(args.phases):
        deadline = time.monotonic() + args.seconds / args.phases
        batch = [Worker(moatd, phase * args.clients + n, deadline, ids) for n in range(args.clients)]
        workers += batch
        for w in batch:
            w.start()
        while any(w.is_alive() for w in batch):
            time.sleep(0.5)
            peak["envs"] = max(peak["envs"], sum(1 for w in batch if w.env))
            snap = h.census(moatd, (), parents)
            peak["moatd_threads"] = max(peak["moatd_threads"], snap.get("moatd_threads", 0))
            peak["moatd_fds"] = max(peak["moatd_fds"], snap.get("moatd_fds", 0))
            if time.monotonic() > deadline + 300:
                failures.append("clients still busy 300 s after the end")
                break
        # moatd's memory between phases: what a load leaves grows to a
        # ceiling (malloc keeps freed memory of its threads' arenas) or leaks.
        time.sleep(1)
        rss_after_phase.append(h.census(moatd, (), parents).get("moatd_rss_kib"))
    elapsed = time.monotonic() - start
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    moatd_cpu = proc_cpu(moatd.pid) - moatd_cpu0
    spawner_cpu = proc_cpu(spawner) - spawner_cpu0
    errors = [e for w in workers for e in w.errors]
    ops = {}
    for op in OPS:
        v = [x for w in workers for x in w.lat[op]]
        ops[op] = {"count": len(v), "per_s": round(len(v) / elapsed, 1),
                   "p50_ms": round(h.percentile(v, 50) * 1000, 2), "p99_ms": round(h.percentile(v, 99) * 1000, 2),
                   "max_ms": round(max(v) * 1000, 2) if v else None}
    # Everything the load made is gone again.
    def settled():
        a = h.census(moatd, ids, parents)
        return a if all(a.get(k) == before.get(k) for k in
                        ("moatd_threads", "moatd_fds", "spawner_fds", "env_processes", "cgroups",
                         "state_mounts", "lock_files", "egress_links")) else None
    after = h.wait_until(settled, 20, step=0.2) or h.census(moatd, ids, parents)
    for k in ("moatd_threads", "moatd_fds", "spawner_fds", "env_processes", "cgroups", "state_mounts",
              "lock_files", "egress_links"):
        if after.get(k) != before.get(k):
            failures.append(f"after the load: {k} {before.get(k)} -> {after.get(k)}")
    left = [e for e in h.list_all(moatd).values() if e["state"] not in ("gone",)]
    if left:
        failures.append(f"{len(left)} environments not gone: {[(e['id'], e['state'], e.get('reason')) for e in left[:5]]}")
    if errors:
        failures.append(f"{len(errors)} errors; first: " + "; ".join(errors[:5]))
    client_cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    return {"clients": args.clients, "seconds": round(elapsed, 1), "errors": len(errors),
            "error_samples": errors[:20], "operations": ops, "environments_created": len(ids) - 1,
            "peak": peak, "cpu_s": {"moatd": round(moatd_cpu, 1), "spawner": round(spawner_cpu, 1),
                      "client": round(client_cpu, 1)},
            "load_average": os.getloadavg(), "moatd_rss_kib_after_each_phase": rss_after_phase,
            "before": before, "after": after}


def proc_cpu(pid):
    fields = h.read(f"/proc/{pid}/stat")
    fields = fields[fields.rfind(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    sys.exit(main())
