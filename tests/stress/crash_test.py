#!/usr/bin/env python3
"""Crash recovery: moatd killed with SIGKILL in the middle of creates,
execs, file writes, network policy changes, destroys, and snapshots,
restores and forks, restarted on the
same state directory, and checked.

  crash_test.py --bin-dir build/bin [--rounds 1] [--seed N] [--json FILE]

Each scenario runs 8 client threads doing one kind of operation as fast as
they can, kills moatd once every thread has had a few answers (plus a random
0-40 ms, so that the kill lands at a different point of an operation each
time; a thread that has not had them within 60 s, or that ends for any
reason but the kill, is a failure), starts moatd again on the same state and
checks:

- the store: every environment is running, gone or failed; gone and failed
  ones have a reason; none is left creating or destroying; GET answers for
  each; the audit chain verifies;
- running environments are re-attached and usable: an exec answers with
  their own hostname; their network policy and link agree (a link for
  allowlist, none for "none") and a linked one reaches moatd's proxy;
- what was acknowledged before the kill is there: every acknowledged
  environment runs, every acknowledged destroy is gone, every acknowledged
  exec's side effect is in the workspace, every acknowledged file write
  reads back byte for byte (the one in flight, if any, is either wholly
  there or not at all), the acknowledged network policy (or the one in
  flight) is in force, an acknowledged restore brought back the snapshot's
  file (the environment had another since);
- nothing is orphaned: pid 1s, cgroups, lock files and egress links match
  the running environments exactly.

The last two scenarios are deterministic: links left by an attach or a
detach that a killed moatd did not record (made by hand while it is down),
and moatd killed again and again while it re-attaches.

Scenarios never duplicate tests/integration/moatd_test.cc (an exec of a
sleeping command through a kill; files and a background process through a
kill when nothing was in flight). At the end, SIGTERM must leave no process,
cgroup, egress link or mount of moatd's but the storage pool.

Needs root (prints SKIP and exits 77, CTest's "skipped", otherwise).
"""

import argparse
import hashlib
import http.client
import json
import os
import random
import subprocess
import sys
import threading
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import moatd_harness as h  # noqa: E402

READ_MAX = 8 << 20  # the most one file GET answers (docs/API.md)

THREADS = 8
POLICY_A = {"mode": "allowlist", "allow": ["a.example.invalid"]}
POLICY_B = {"mode": "allowlist", "allow": ["b.example.invalid", "*.b.example.invalid"]}


class Failures(list):
    def check(self, ok, message):
        if not ok:
            self.append(message)
        return ok


class Op:
    """One request of a worker: acknowledged, or in flight at the kill."""

    def __init__(self, kind, **kw):
        self.kind = kind
        self.__dict__.update(kw)
        self.status = None
        self.body = None


class Worker(threading.Thread):
    """Runs next_op() until the connection breaks because moatd was killed
    (kill_during sets `killed` first). The operation that was sent when it
    broke is `inflight`. Anything else that ends it (a connection broken
    while moatd still runs, an exception of the client or of the test) is
    one of its `errors`, not the kill."""

    def __init__(self, moatd, n, next_op, rng):
        super().__init__(daemon=True)
        self.client = moatd.client(keep=True, timeout=120)
        self.n = n
        self.next_op = next_op
        self.rng = rng
        self.acked = []
        self.inflight = None
        self.errors = []
        self.stop = False
        self.killed = threading.Event()

    def run(self):
        try:
            self.loop()
        except Exception as e:
            self.errors.append(f"thread {self.n}: {type(e).__name__}: {e}")

    def loop(self):
        while not self.stop:
            op = self.next_op(self)
            if op is None:
                time.sleep(0.005)
                continue
            self.inflight = op
            try:
                op.status, op.body = self.client.call(op.method, op.path, op.payload, raw=op.raw)
            except (OSError, http.client.HTTPException) as e:
                if not self.killed.is_set():
                    self.errors.append(f"{op.kind} {op.path}: the connection broke before moatd was killed: "
                                       f"{type(e).__name__}: {e}")
                return  # moatd is gone: `inflight` may or may not have happened
            self.inflight = None
            if op.status != op.expect:
                self.errors.append(f"{op.kind} {op.path}: {op.status} {str(op.body)[:200]}")
                continue
            self.acked.append(op)
            if getattr(op, "after", None):
                op.after(op)


def kill_during(moatd, workers, rng, min_acked=3, timeout=60):
    """Kills moatd once every worker has had min_acked operations
    acknowledged (or has ended: its errors say why), and starts it again.
    Raises if that takes longer than `timeout` s: nothing was exercised."""
    for w in workers:
        w.start()
    if not h.wait_until(lambda: all(len(w.acked) >= min_acked or not w.is_alive() for w in workers), timeout, 0.005):
        for w in workers:
            w.stop = True
        raise AssertionError(f"moatd was not killed: after {timeout} s, the threads had "
                             f"{[len(w.acked) for w in workers]} operations acknowledged, not {min_acked} each; "
                             f"errors: {[e for w in workers for e in w.errors][:5]}")
    time.sleep(rng.uniform(0, 0.04))
    inflight = sum(1 for w in workers if w.inflight is not None)
    for w in workers:
        w.killed.set()
    moatd.kill9()
    for w in workers:
        w.stop = True
    for w in workers:
        w.join(timeout=130)
    moatd.start()
    return inflight


class Suite:
    def __init__(self, moatd, rng, failures):
        self.moatd = moatd
        self.rng = rng
        self.f = failures
        self.parents = h.cgroup_parents(moatd.pid)
        self.seen = set()   # every environment id this test learnt of
        self.stats = {}
        self.kills = 0
        # One environment lives through every kill and restart of the run,
        # with a link and a file written before the first.
        self.veteran = self.create({"spec": {"ram_mb": 64}, "network": POLICY_B})
        self.veteran_data = rng.randbytes(300000)
        status, r = moatd.call("PUT", f"/v1/environments/{self.veteran}/files?path=/workspace/veteran.bin",
                               self.veteran_data)
        assert status == 200, (status, r)

    # --- checks shared by every scenario ---------------------------------

    def consistent(self, label):
        """The store, the running environments and the host agree."""
        m, f = self.moatd, self.f
        envs = h.list_all(m)
        self.seen.update(envs)
        running = []
        for id_, e in envs.items():
            f.check(e["state"] in ("running", "gone", "failed"), f"{label}: {id_} is {e['state']} after a restart")
            if e["state"] in ("gone", "failed"):
                f.check(bool(e.get("reason")), f"{label}: {id_} is {e['state']} without a reason")
            status, one = m.call("GET", f"/v1/environments/{id_}")
            f.check(status == 200 and one.get("state") == e["state"], f"{label}: GET {id_}: {status} {one}")
            if e["state"] == "running":
                running.append(id_)
        linked = 0
        for id_ in running:
            status, r = m.call("POST", f"/v1/environments/{id_}/exec", {"cmd": ["cat", "/etc/hostname"]})
            f.check(status == 200 and r.get("stdout") == id_ + "\n", f"{label}: exec in re-attached {id_}: {status} {r}")
            status, net = m.call("GET", f"/v1/environments/{id_}/network")
            if not f.check(status == 200, f"{label}: GET network {id_}: {status} {net}"):
                continue
            mode = net["network"]["mode"]
            f.check((mode == "none") == ("link" not in net),
                    f"{label}: {id_}: network mode {mode} but link {net.get('link')}")
            if "link" in net:
                linked += 1
        want = {"env_pid1s": len(running), "cgroups": len(running) * len(self.parents),
                "lock_files": len(running), "egress_links": linked}
        # The network namespace of an environment destroyed a moment ago
        # (and its veth) goes in the kernel's own time: wait for it.
        c = h.wait_until(lambda: (lambda c: c if all(c[k] == v for k, v in want.items()) else None)(
            h.census(m, self.seen, self.parents)), 10, 0.1) or h.census(m, self.seen, self.parents)
        f.check(c["env_pid1s"] == len(running), f"{label}: {c['env_pid1s']} pid 1s for {len(running)} running environments")
        f.check(c["cgroups"] == len(running) * len(self.parents),
                f"{label}: {c['cgroups']} cgroups for {len(running)} running environments ({len(self.parents)} each)")
        f.check(c["lock_files"] == len(running), f"{label}: {c['lock_files']} lock files for {len(running)} running")
        f.check(c["egress_links"] == linked, f"{label}: {c['egress_links']} egress links for {linked} linked environments")
        f.check(self.veteran in running, f"{label}: the environment that lived through every restart is "
                                         f"{envs.get(self.veteran, {}).get('state')}")
        status, data = m.call("GET", f"/v1/environments/{self.veteran}/files?path=/workspace/veteran.bin", raw=True)
        f.check(status == 200 and data == self.veteran_data, f"{label}: the veteran's file: {status}, {len(data)} bytes")
        status, v = m.call("GET", "/v1/audit/verify")
        f.check(status == 200 and v.get("ok"), f"{label}: audit chain: {status} {v}")
        return envs, running

    def proxy_reachable(self, id_):
        """From inside: a CONNECT through moatd's proxy to a host off the
        list is answered (403): the link and the proxy work."""
        status, r = self.moatd.call("POST", f"/v1/environments/{id_}/exec", {
            "cmd": ["curl", "-sS", "-m", "10", "-o", "/dev/null", "https://refused.example.invalid/"],
            "timeout_ms": 20000})
        return status == 200 and "403" in r.get("stderr", ""), r

    def create(self, body=None):
        status, e = self.moatd.call("POST", "/v1/environments", body or {"spec": {"ram_mb": 128}})
        if status != 201:
            raise AssertionError(f"create: {status} {e}")
        self.seen.add(e["id"])
        return e["id"]

    def destroy_all_but(self, keep):
        keep = set(keep) | {self.veteran}
        for id_, e in h.list_all(self.moatd).items():
            if e["state"] == "running" and id_ not in keep:
                self.moatd.call("DELETE", f"/v1/environments/{id_}")

    def enough_acknowledged(self, label, workers, least):
        """Every thread had `least` operations acknowledged before the kill,
        so the checks of what was acknowledged have something to check."""
        for w in workers:
            self.f.check(len(w.acked) >= least, f"{label}: thread {w.n} had {len(w.acked)} operations "
                                                f"acknowledged before the kill, not {least}")

    def note(self, name, inflight, acked):
        s = self.stats.setdefault(name, {"rounds": 0, "in_flight_at_kill": 0, "acknowledged": 0})
        s["rounds"] += 1
        s["in_flight_at_kill"] += inflight
        s["acknowledged"] += acked

    # --- scenarios --------------------------------------------------------

    def creates(self, round_):
        label = f"creates#{round_}"

        def next_op(w):
            networked = w.rng.random() < 0.4
            body = {"task_id": f"crash-{w.n}", "spec": {"ram_mb": 64, "storage_gb": 0.2}}
            if networked:
                body["network"] = POLICY_A
            return Op("create", method="POST", path="/v1/environments", payload=body, raw=False,
                      expect=201, networked=networked)

        workers = [Worker(self.moatd, n, next_op, random.Random(self.rng.random())) for n in range(THREADS)]
        self.kills += 1
        least = 2
        inflight = kill_during(self.moatd, workers, self.rng, min_acked=least)
        envs, running = self.consistent(label)
        acked = [op for w in workers for op in w.acked]
        self.note("creates", inflight, len(acked))
        self.enough_acknowledged(label, workers, least)
        for op in acked:
            id_ = op.body["id"]
            e = envs.get(id_)
            self.f.check(e is not None and e["state"] == "running", f"{label}: acknowledged {id_} is {e and e['state']}")
        # Networked ones, acknowledged or not, have a working link.
        for op in [op for w in workers for op in w.acked] + [w.inflight for w in workers if w.inflight]:
            if op.networked and op.body:
                ok, r = self.proxy_reachable(op.body["id"])
                self.f.check(ok, f"{label}: proxy from {op.body['id']}: {r}")
        for id_ in running:
            status, net = self.moatd.call("GET", f"/v1/environments/{id_}/network")
            if net["network"]["mode"] != "none":
                ok, r = self.proxy_reachable(id_)
                self.f.check(ok, f"{label}: proxy from {id_} (created in flight): {r}")
        for w in workers:
            self.f.extend(f"{label}: {e}" for e in w.errors)
        # Usable: a new create works after the restart.
        self.create()
        self.destroy_all_but(keep=set(self.rng.sample(sorted(running), min(2, len(running)))))

    def execs(self, round_):
        label = f"execs#{round_}"
        envs = [self.create() for _ in range(4)]
        counters = [0] * THREADS

        def next_op(w):
            k = counters[w.n]
            counters[w.n] += 1
            env = envs[w.n % len(envs)]
            line = f"{w.n}-{k}"
            return Op("exec", method="POST", path=f"/v1/environments/{env}/exec", raw=False, expect=200,
                      payload={"cmd": ["sh", "-c", f"echo {line} >> /workspace/exec-{w.n}.log; echo {line}"]},
                      line=line, env=env)

        workers = [Worker(self.moatd, n, next_op, random.Random(self.rng.random())) for n in range(THREADS)]
        self.kills += 1
        least = 5
        inflight = kill_during(self.moatd, workers, self.rng, min_acked=least)
        self.consistent(label)
        self.note("execs", inflight, sum(len(w.acked) for w in workers))
        self.enough_acknowledged(label, workers, least)
        for w in workers:
            self.f.extend(f"{label}: {e}" for e in w.errors)
            env = envs[w.n % len(envs)]
            for op in w.acked:
                self.f.check(op.body.get("stdout") == op.line + "\n", f"{label}: exec answered {op.body}")
            status, text = self.moatd.call("GET", f"/v1/environments/{env}/files?path=/workspace/exec-{w.n}.log", raw=True)
            lines = text.decode().splitlines() if status == 200 else []
            want = [op.line for op in w.acked]
            ok = lines == want or (w.inflight is not None and lines == want + [w.inflight.line])
            self.f.check(ok, f"{label}: thread {w.n}: acknowledged {want[-3:]}, in flight "
                             f"{w.inflight and w.inflight.line}, the log has {lines[-3:]} ({len(lines)} lines)")
        for env in envs:
            status, ps = self.moatd.call("GET", f"/v1/environments/{env}/processes")
            self.f.check(status == 200, f"{label}: processes of {env}: {status} {ps}")
        self.destroy_all_but(keep=set())

    def read_whole(self, env, path):
        """A file's status and all its bytes: a GET answers at most 8 MiB
        (docs/API.md), and the appends of one thread may add up to more."""
        status, got = self.moatd.call("GET", f"/v1/environments/{env}/files?path={path}", raw=True)
        while status == 200 and len(got) % READ_MAX == 0 and got:
            status, more = self.moatd.call("GET", f"/v1/environments/{env}/files?path={path}&offset={len(got)}",
                                           raw=True)
            if status != 200 or not more:
                break
            got += more
        return status, got

    def writes(self, round_):
        label = f"writes#{round_}"
        envs = [self.create({"spec": {"ram_mb": 128, "storage_gb": 1}}) for _ in range(4)]
        counters = [0] * THREADS

        def next_op(w):
            k = counters[w.n]
            counters[w.n] += 1
            env = envs[w.n % len(envs)]
            size = w.rng.choice((0, 1, 4096, 65536, 1 << 20, 3 << 20))
            data = w.rng.randbytes(size)
            if k % 3 == 2:  # an append to one file per thread
                path = f"/workspace/t{w.n}/appended"
                return Op("append", method="PUT", path=f"/v1/environments/{env}/files?path={path}&append=1",
                          payload=data, raw=False, expect=200, file=path, data=data, env=env)
            path = f"/workspace/t{w.n}/f{k % 4}"
            return Op("write", method="PUT", path=f"/v1/environments/{env}/files?path={path}",
                      payload=data, raw=False, expect=200, file=path, data=data, env=env)

        workers = [Worker(self.moatd, n, next_op, random.Random(self.rng.random())) for n in range(THREADS)]
        self.kills += 1
        least = 4
        inflight = kill_during(self.moatd, workers, self.rng, min_acked=least)
        self.consistent(label)
        acked_bytes = sum(len(op.data) for w in workers for op in w.acked)
        self.note("writes", inflight, sum(len(w.acked) for w in workers))
        self.enough_acknowledged(label, workers, least)
        self.stats["writes"]["acknowledged_bytes"] = self.stats["writes"].get("acknowledged_bytes", 0) + acked_bytes
        lost = 0
        for w in workers:
            self.f.extend(f"{label}: {e}" for e in w.errors)
            expect = {}
            for op in w.acked:
                if op.kind == "append":
                    expect[op.file] = expect.get(op.file, b"") + op.data
                else:
                    expect[op.file] = op.data
            fl = w.inflight
            for path, data in expect.items():
                env = envs[w.n % len(envs)]
                status, got = self.read_whole(env, path)
                alternatives = [data]
                if fl is not None and fl.file == path:
                    alternatives.append(data + fl.data if fl.kind == "append" else fl.data)
                if not self.f.check(status == 200 and got in alternatives,
                                    f"{label}: {path}: {status}, {len(got)} bytes (sha256 "
                                    f"{hashlib.sha256(got).hexdigest()[:12]}), acknowledged {len(data)} "
                                    f"bytes, in flight {fl and fl.kind} {fl and len(fl.data)}"):
                    lost += 1
            if fl is not None and fl.file not in expect:
                status, got = self.moatd.call("GET", f"/v1/environments/{fl.env}/files?path={fl.file}", raw=True)
                self.f.check(status == 404 or got == fl.data,
                             f"{label}: {fl.file} written in flight only: {status}, {len(got)} of {len(fl.data)} bytes")
        self.stats["writes"]["files_not_as_acknowledged"] = self.stats["writes"].get("files_not_as_acknowledged", 0) + lost
        self.destroy_all_but(keep=set(envs[:1]))

    def network(self, round_):
        label = f"network#{round_}"
        envs = [self.create({"spec": {"ram_mb": 128}, "network": POLICY_A}) for _ in range(4)]
        cycle = [POLICY_B, "none", POLICY_A, "none"]
        counters = [0] * THREADS

        def next_op(w):
            if w.n >= len(envs):
                return None  # one thread per environment: its last answer is its policy
            k = counters[w.n]
            counters[w.n] += 1
            policy = cycle[k % len(cycle)]
            return Op("network", method="PUT", path=f"/v1/environments/{envs[w.n]}/network",
                      payload={"network": policy}, raw=False, expect=200, policy=policy)

        workers = [Worker(self.moatd, n, next_op, random.Random(self.rng.random())) for n in range(THREADS)]
        self.kills += 1
        least = 3
        inflight = kill_during(self.moatd, workers[:len(envs)], self.rng, min_acked=least)
        self.consistent(label)
        self.note("network", inflight, sum(len(w.acked) for w in workers))
        self.enough_acknowledged(label, workers[:len(envs)], least)

        def mode_allow(p):
            if p == "none":
                return ("none", [])
            return (p["mode"], sorted(p.get("allow", [])))

        for w in workers[:len(envs)]:
            self.f.extend(f"{label}: {e}" for e in w.errors)
            env = envs[w.n]
            last = w.acked[-1].policy if w.acked else POLICY_A
            wanted = [mode_allow(last)] + ([mode_allow(w.inflight.policy)] if w.inflight else [])
            status, net = self.moatd.call("GET", f"/v1/environments/{env}/network")
            got = (net["network"]["mode"], sorted(net["network"].get("allow", [])))
            self.f.check(got in wanted, f"{label}: {env}: policy {got}, acknowledged {wanted[0]}, "
                                        f"in flight {wanted[1:]}")
            if got[0] != "none":
                ok, r = self.proxy_reachable(env)
                self.f.check(ok, f"{label}: proxy from {env} after the restart: {r}")
            else:
                status, r = self.moatd.call("POST", f"/v1/environments/{env}/exec", {
                    "cmd": ["sh", "-c", "tail -n +3 /proc/net/dev | wc -l"]})
                self.f.check(status == 200 and r.get("stdout") == "1\n",
                             f"{label}: {env} has mode none but network devices besides lo: {r}")
            # Usable: the policy can be changed again.
            status, r = self.moatd.call("PUT", f"/v1/environments/{env}/network", {"network": POLICY_B})
            self.f.check(status == 200, f"{label}: PUT network after the restart: {status} {r}")
            ok, r = self.proxy_reachable(env)
            self.f.check(ok, f"{label}: proxy from {env} after a new policy: {r}")
        self.consistent(label + " (after new policies)")
        self.destroy_all_but(keep=set(envs[:1]))

    def destroys(self, round_):
        label = f"destroys#{round_}"
        per = 4
        envs = [self.create({"spec": {"ram_mb": 64, "storage_gb": 0.2}, **({"network": POLICY_A} if i % 2 else {})})
                for i in range(THREADS * per)]
        counters = [0] * THREADS

        def next_op(w):
            k = counters[w.n]
            if k >= per:
                return None
            counters[w.n] += 1
            return Op("destroy", method="DELETE", path=f"/v1/environments/{envs[w.n * per + k]}",
                      payload=None, raw=False, expect=204, env=envs[w.n * per + k])

        workers = [Worker(self.moatd, n, next_op, random.Random(self.rng.random())) for n in range(THREADS)]
        self.kills += 1
        least = 1
        inflight = kill_during(self.moatd, workers, self.rng, min_acked=least)
        all_envs, running = self.consistent(label)
        self.note("destroys", inflight, sum(len(w.acked) for w in workers))
        self.enough_acknowledged(label, workers, least)
        for w in workers:
            self.f.extend(f"{label}: {e}" for e in w.errors)
            for op in w.acked:
                state = all_envs.get(op.env, {}).get("state")
                self.f.check(state == "gone", f"{label}: acknowledged destroy of {op.env}: {state}")
        self.destroy_all_but(keep=set(running[:2]))

    def links(self, round_):
        """Deterministic: what a kill in the middle of an attach or a
        detach leaves, made by hand while moatd is down. The next moatd must
        reconcile the egress namespace with its store: a link the store does
        not name is removed (with the environment's end of it), a link the
        store names but that is gone is made again."""
        label = f"links#{round_}"
        m = self.moatd
        linked = self.create({"spec": {"ram_mb": 64}, "network": POLICY_A})
        bare = self.create({"spec": {"ram_mb": 64}})
        status, net = m.call("GET", f"/v1/environments/{linked}/network")
        address = [int(x) for x in net["link"]["address"].split(".")]
        slot = ((address[0] << 24 | address[1] << 16 | address[2] << 8 | address[3]) - (100 << 24 | 64 << 16)) >> 2
        pid1 = [p for p in h.descendants(m.spawner_pids())
                if h.read(f"/proc/{p}/comm").strip() == "moat-init"
                and subprocess.run(["nsenter", "-t", str(p), "-u", "hostname"], capture_output=True,
                                   text=True).stdout.strip() == bare]
        self.f.check(len(pid1) == 1, f"{label}: pid 1 of {bare}: {pid1}")
        m.kill9()
        self.kills += 1
        egress = "--net=" + os.path.join(m.state, "run", "egress.netns")
        # A detach that was not recorded: the link the store names is gone.
        r = subprocess.run(["nsenter", egress, "ip", "link", "del", "mx%x" % slot], capture_output=True, text=True)
        self.f.check(r.returncode == 0, f"{label}: ip link del: {r.stderr}")
        # An attach that was not recorded: a link for an environment whose store says "none".
        r = subprocess.run(["nsenter", egress, "ip", "link", "add", "mx3ff", "type", "veth", "peer", "name",
                            "eth0", "netns", str(pid1[0])], capture_output=True, text=True)
        self.f.check(r.returncode == 0, f"{label}: ip link add: {r.stderr}")
        m.start()
        self.consistent(label)
        ok, r = self.proxy_reachable(linked)
        self.f.check(ok, f"{label}: proxy from {linked}, whose link was gone: {r}")
        status, body = m.call("GET", f"/v1/events?environment={linked}&type=network.changed", raw=True)
        events = [json.loads(line[6:]) for line in body.decode().splitlines() if line.startswith("data: ")]
        self.f.check(any(e["actor"] == "moatd" for e in events), f"{label}: no network.changed by moatd: {events}")
        status, r = m.call("POST", f"/v1/environments/{bare}/exec", {"cmd": ["sh", "-c", "tail -n +3 /proc/net/dev | wc -l"]})
        self.f.check(status == 200 and r.get("stdout") == "1\n", f"{label}: {bare} kept a stray device: {r}")
        self.destroy_all_but(keep={linked})

    def restarts(self, round_):
        """Killed again while it re-attaches: moatd is killed 0-150 ms after
        each of five starts (during recovery, before or just after it
        serves) while environments with and without links and a destroy
        left half-done wait for it."""
        label = f"restarts#{round_}"
        m = self.moatd
        envs = [self.create({"spec": {"ram_mb": 64}, **({"network": POLICY_A} if i % 2 else {})}) for i in range(6)]
        m.kill9()
        for _ in range(5):
            m.start_and_kill(self.rng.uniform(0, 0.15))
        self.kills += 6
        m.start()
        all_envs, running = self.consistent(label)
        for id_ in envs:
            self.f.check(id_ in running, f"{label}: {id_} is {all_envs.get(id_, {}).get('state')}")
        for id_ in envs[1::2]:
            ok, r = self.proxy_reachable(id_)
            self.f.check(ok, f"{label}: proxy from {id_}: {r}")
        self.destroy_all_but(keep=set())

    def snapshots(self, round_):
        """Snapshots, restores and forks in flight at the kill. After the
        restart: every acknowledged snapshot is there and the store and the
        storage pool list the same snapshots (none half made); every
        acknowledged fork runs with its source's file; a restored
        environment runs with the snapshot's file, which is not the one it
        had when the restores began (or, killed halfway, is failed with a
        reason: consistent() checks that); restores work again."""
        label = f"snapshots#{round_}"
        m = self.moatd
        envs = [self.create({"spec": {"ram_mb": 64, "storage_gb": 0.5}}) for _ in range(4)]
        base = {}
        for i, env in enumerate(envs):
            status, r = m.call("PUT", f"/v1/environments/{env}/files?path=/workspace/mark", f"base-{i}\n".encode())
            assert status == 200, (status, r)
            status, snap = m.call("POST", f"/v1/environments/{env}/snapshots", {"name": "base"})
            assert status == 201, (status, snap)
            base[env] = snap["id"]
            # Not the snapshot's: a restore brings base-{i} back, no restore leaves this.
            status, r = m.call("PUT", f"/v1/environments/{env}/files?path=/workspace/mark", f"later-{i}\n".encode())
            assert status == 200, (status, r)

        def next_op(w):
            env = envs[w.n % len(envs)]
            kind = ("snapshot", "restore", "fork")[w.n % 3]
            if kind == "snapshot":
                return Op("snapshot", method="POST", path=f"/v1/environments/{env}/snapshots", payload={},
                          raw=False, expect=201, env=env)
            if kind == "restore":
                return Op("restore", method="POST", path=f"/v1/environments/{env}/restore",
                          payload={"snapshot": base[env]}, raw=False, expect=200, env=env)
            return Op("fork", method="POST", path=f"/v1/environments/{env}/fork", payload={"ttl_s": 600},
                      raw=False, expect=201, env=env)

        workers = [Worker(m, n, next_op, random.Random(self.rng.random())) for n in range(THREADS)]
        self.kills += 1
        least = 2
        inflight = kill_during(m, workers, self.rng, min_acked=least)
        all_envs, running = self.consistent(label)
        self.note("snapshots", inflight, sum(len(w.acked) for w in workers))
        self.enough_acknowledged(label, workers, least)
        status, listed = m.call("GET", "/v1/snapshots")
        stored = {s["id"] for s in listed.get("snapshots", [])}
        forks = [s["id"] for s in listed.get("snapshots", []) if s.get("name") == "fork"]
        self.f.check(not forks, f"{label}: snapshots a fork went through are listed: {forks}")
        pool = set(os.listdir(os.path.join(m.state, "storage", "snapshots")))
        self.f.check(stored == pool, f"{label}: the store lists {sorted(stored - pool)} the pool lacks, the pool "
                                     f"holds {sorted(pool - stored)} the store does not list")
        for w in workers:
            self.f.extend(f"{label}: {e}" for e in w.errors)
            for op in w.acked:
                if op.kind == "snapshot":
                    self.f.check(op.body["id"] in stored, f"{label}: acknowledged snapshot {op.body['id']} is gone")
                elif op.kind == "fork":
                    fork = op.body["id"]
                    self.f.check(fork in running, f"{label}: acknowledged fork {fork} is "
                                                  f"{all_envs.get(fork, {}).get('state')}")
                    if fork in running:
                        i = envs.index(op.env)
                        status, data = m.call("GET", f"/v1/environments/{fork}/files?path=/workspace/mark", raw=True)
                        self.f.check(status == 200 and data in (f"base-{i}\n".encode(), f"later-{i}\n".encode()),
                                     f"{label}: fork {fork} of {op.env}: mark {status} {data[:40]}")
        acked_restores = {op.env for w in workers for op in w.acked if op.kind == "restore"}
        inflight_restores = {w.inflight.env for w in workers if w.inflight is not None and w.inflight.kind == "restore"}
        for i, env in enumerate(envs):
            if env not in running:
                continue
            if env in acked_restores:
                want = [f"base-{i}\n"]
            elif env in inflight_restores:
                want = [f"base-{i}\n", f"later-{i}\n"]
            else:
                want = [f"later-{i}\n"]
            status, data = m.call("GET", f"/v1/environments/{env}/files?path=/workspace/mark", raw=True)
            self.f.check(status == 200 and data in [x.encode() for x in want],
                         f"{label}: {env}'s mark: {status} {data[:40]}, expected one of {want} (restores of it: "
                         f"{'acknowledged' if env in acked_restores else 'none acknowledged'}, "
                         f"{'one' if env in inflight_restores else 'none'} in flight)")
            status, r = m.call("PUT", f"/v1/environments/{env}/files?path=/workspace/mark", f"again-{i}\n".encode())
            self.f.check(status == 200, f"{label}: a write after the restart: {status} {r}")
            status, r = m.call("POST", f"/v1/environments/{env}/restore", {"snapshot": base[env]})
            self.f.check(status == 200, f"{label}: a restore after the restart: {status} {r}")
            status, data = m.call("GET", f"/v1/environments/{env}/files?path=/workspace/mark", raw=True)
            self.f.check(status == 200 and data == f"base-{i}\n".encode(),
                         f"{label}: {env}'s mark after a restore after the restart: {status} {data[:40]}")
        for snap in stored:
            m.call("DELETE", f"/v1/snapshots/{snap}")
        self.destroy_all_but(keep=set())

    def final_stop(self):
        """An orderly stop after it all: nothing of moatd's is left."""
        m = self.moatd
        envs, running = self.consistent("before the final stop")
        ok, r = self.proxy_reachable(self.veteran)
        self.f.check(ok, f"proxy from the veteran: {r}")
        self.seen.update(events_environments(m))
        m.stop()
        # The spawner answers moatd's shutdown, then exits: a moment later.
        h.wait_until(lambda: not m.spawner_pids(), 10)
        c = h.census(m, self.seen, self.parents)
        want = {"spawners": 0, "env_processes": 0, "cgroups": 0, "state_mounts": 2, "loop_devices": 1,  # mounts: the pool, its skeletons tmpfs
                "lock_files": 0, "egress_links": -1}
        for k, v in want.items():
            self.f.check(c.get(k) == v, f"after SIGTERM: {k} is {c.get(k)}, expected {v}")
        subprocess.run(["umount", "-l", os.path.join(m.state, "storage")], check=False)
        self.f.check(h.wait_until(lambda: h.census(m, (), self.parents)["loop_devices"] == 0, 10),
                     "the storage pool's loop device outlived its unmount")
        return {"running_at_final_stop": len(running), "environments_seen": len(self.seen), "after_sigterm": c}


def events_environments(moatd):
    """Every environment id the audit log names."""
    ids, since = set(), 0
    while True:
        status, body = moatd.call("GET", f"/v1/events?type=environment.&since={since}", raw=True)
        frames = [json.loads(line[6:]) for line in body.decode().splitlines() if line.startswith("data: ")]
        if status != 200 or not frames:
            return ids
        for e in frames:
            if e.get("environment"):
                ids.add(e["environment"])
        since = frames[-1]["id"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--scenarios", default="creates,execs,writes,network,destroys,snapshots,links,restarts")
    ap.add_argument("--json")
    args = ap.parse_args()
    if not h.is_root():
        print("SKIP: needs root (moatd creates namespaces, cgroups and mounts)")
        return 77  # CTest's "skipped" (SKIP_RETURN_CODE), not a pass
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 30)
    print(f"seed {seed}", flush=True)
    rng = random.Random(seed)
    failures = Failures()
    moatd = h.Moatd(args.bin_dir, prefix="moatd-crash-")
    results = {"seed": seed}
    start = time.monotonic()
    try:
        suite = Suite(moatd, rng, failures)
        for r in range(args.rounds):
            for name in args.scenarios.split(","):
                before = len(failures)
                t = time.monotonic()
                getattr(suite, name)(r)
                print(f"{name}#{r}: {'ok' if len(failures) == before else 'FAILED'} ({time.monotonic() - t:.1f} s)",
                      flush=True)
        results.update(suite.final_stop())
        results["scenarios"] = suite.stats
        results["kills"] = suite.kills
    except Exception as e:
        import traceback
        traceback.print_exc()
        failures.append(f"{type(e).__name__}: {e}")
        print(moatd.log(), file=sys.stderr)
    finally:
        moatd.remove()
    results["seconds"] = round(time.monotonic() - start, 1)
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


if __name__ == "__main__":
    sys.exit(main())
