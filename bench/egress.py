#!/usr/bin/env python3
"""Egress proxy benchmark: what moatd's proxy adds to HTTPS (docs/EGRESS.md).

Runs in a private network namespace with the test internet of
tests/egress/egress_test.py (its World, Moatd and Env: HTTPS servers with a
test CA on 203.0.113.x, moatd started with --egress-hosts and
--egress-ca-bundle). Three paths to the same server, side by side, round by
round:

  direct        the client in the test namespace, no sandbox, no proxy (the peer)
  passthrough   the client in an environment with an allowlist: CONNECT through
                moatd's proxy, TLS relayed as bytes
  intercepted   the client in an environment with a secret for the host:
                CONNECT, TLS terminated by moatd (its CA) and made again upstream

The client is one python3 process per batch (run through the exec API inside
an environment, as a subprocess on the host for the peer), so process
start-up is not measured: it times, in process, sequential small GETs on a
new connection each (TCP + CONNECT + TLS handshake + request: what `curl
https://...` costs), GETs on one keep-alive connection, and a large download
(/big/<bytes>). moatd's CPU time (all its threads, from /proc) is read around
every batch.

  bench/egress.py --bin-dir build/bin [--requests 300] [--rounds 5] [--mib 256]

Needs root (moatd creates namespaces); exits 0 with SKIP otherwise.
"""

import argparse
import datetime
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "egress"))
import egress_test as et  # noqa: E402  (World, Moatd, Env, the test internet)

# The client: one process, many requests. argv[1] is a JSON task; prints
# JSON with the times in ns and its own CPU seconds.
CLIENT = r'''
import http.client, json, os, socket, ssl, sys, time
cfg = json.loads(sys.argv[1])
host = cfg["host"]
ctx = ssl.create_default_context(cafile=cfg["cafile"])
proxy = None
if cfg["via"] == "proxy":
    p = os.environ["HTTPS_PROXY"].split("://", 1)[1].rstrip("/")
    proxy = (p.rsplit(":", 1)[0], int(p.rsplit(":", 1)[1]))

def connect():
    if proxy:
        s = socket.create_connection(proxy)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.sendall(("CONNECT %s:443 HTTP/1.1\r\nHost: %s:443\r\n\r\n" % (host, host)).encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = s.recv(4096)
            if not chunk:
                raise OSError("the proxy closed the connection")
            head += chunk
        if b" 200 " not in head.split(b"\r\n", 1)[0]:
            raise OSError("CONNECT refused: %r" % head[:200])
    else:
        s = socket.create_connection((cfg["address"], 443))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return ctx.wrap_socket(s, server_hostname=host)

class Conn(http.client.HTTPSConnection):
    def connect(self):
        self.sock = connect()

def get(conn, path):
    conn.request("GET", path)
    r = conn.getresponse()
    body = r.read()
    if r.status != 200:
        raise OSError("%s: %d %r" % (path, r.status, body[:200]))
    return body

task, n, out = cfg["task"], cfg.get("n", 0), {}
times = []
if task == "new":
    for i in range(n + 1):  # the first is a warm-up, not counted
        t0 = time.perf_counter_ns()
        c = Conn(host, context=ctx)
        get(c, "/small")
        c.close()
        if i:
            times.append(time.perf_counter_ns() - t0)
elif task == "keepalive":
    c = Conn(host, context=ctx)
    get(c, "/small")
    for i in range(n):
        t0 = time.perf_counter_ns()
        get(c, "/small")
        times.append(time.perf_counter_ns() - t0)
    c.close()
elif task == "big":
    c = Conn(host, context=ctx)
    get(c, "/small")
    buf = memoryview(bytearray(1 << 20))
    t0 = time.perf_counter_ns()
    c.request("GET", "/big/%d" % cfg["bytes"])
    r = c.getresponse()
    got = 0
    while True:
        k = r.readinto(buf)
        if not k:
            break
        got += k
    times.append(time.perf_counter_ns() - t0)
    if r.status != 200 or got != cfg["bytes"]:
        raise OSError("big: status %d, %d of %d bytes" % (r.status, got, cfg["bytes"]))
    c.close()
out["times"] = times
out["cpu"] = time.process_time()
print(json.dumps(out))
'''

PATHS = ("direct", "passthrough", "intercepted")


def cpu_seconds(pid):
    """utime + stime of a process (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values, p):
    s = sorted(values)
    return s[max(0, math.ceil(p * len(s)) - 1)]


class Bench:
    def __init__(self, args):
        self.args = args
        # The test server sets TCP_NODELAY, as real servers do: Python's
        # http.server does not by default, and then its head and body
        # (two writes) meet the client's delayed ACK, ~40 ms a request on
        # every path alike. --server-nagle keeps that default.
        et.Echo.disable_nagle_algorithm = not args.server_nagle
        self.world = et.World()
        self.moatd = None
        self.envs = {}

    def start(self):
        self.moatd = et.Moatd(os.path.abspath(self.args.bin_dir), self.world)
        # cpus 2: the client inside has the same two cores as the peer on the host.
        spec = {"cpus": 2, "ram_mb": 512}
        self.envs["passthrough"] = et.Env(self.moatd, self.world, spec=spec, network=et.allow(et.API))
        self.envs["intercepted"] = et.Env(self.moatd, self.world, spec=spec, network=et.allow(et.API), secrets=[
            {"name": "API_TOKEN", "value": et.SECRET_VALUE, "hosts": [et.API],
             "header": "Authorization: Bearer {value}"}])

    def close(self):
        shutil.rmtree(self.world.dir, ignore_errors=True)
        if not self.moatd:
            return
        for e in self.envs.values():
            e.destroy()
        self.moatd.stop()
        subprocess.run(["umount", "-l", os.path.join(self.moatd.state, "storage")], capture_output=True)
        shutil.rmtree(self.moatd.state, ignore_errors=True)
        if os.path.exists(self.moatd.log_path):
            os.unlink(self.moatd.log_path)

    def client(self, path, task):
        """Runs one client batch on `path`; returns (its output, moatd CPU s, server CPU s)."""
        cfg = dict(task, host=et.API)
        if path == "direct":
            cfg.update(via="direct", address=et.API_IP, cafile=self.world.ca)
        else:
            cfg.update(via="proxy", cafile="/etc/moat/ca-bundle.crt")
        argv = ["python3", "-c", CLIENT, json.dumps(cfg)]
        m0, s0 = cpu_seconds(self.moatd.proc.pid), time.process_time()
        if path == "direct":
            r = subprocess.run(argv, capture_output=True, text=True, timeout=600)
            code, out, err = r.returncode, r.stdout, r.stderr
        else:
            code, out, err = self.envs[path].exec(argv, timeout_ms=600000)
        m1, s1 = cpu_seconds(self.moatd.proc.pid), time.process_time()
        if code != 0:
            raise RuntimeError(f"{path} {task}: exit {code}: {err[-2000:]}")
        return json.loads(out), m1 - m0, s1 - s0

    def run(self):
        a = self.args
        per_round = max(1, a.requests // a.rounds)
        ka_per_round = max(1, a.keepalive // a.rounds)
        big = a.mib << 20
        new = {p: [] for p in PATHS}
        ka = {p: [] for p in PATHS}
        cpu = {p: {"new": 0.0, "keepalive": 0.0} for p in PATHS}
        transfers = {p: [] for p in PATHS}
        for p in PATHS:  # warm-up: the leaf certificate, caches, first connections
            self.client(p, {"task": "new", "n": 5})
        for r in range(a.rounds):
            order = PATHS[r % 3:] + PATHS[:r % 3]
            for p in order:
                out, m, _ = self.client(p, {"task": "new", "n": per_round})
                new[p] += out["times"]
                cpu[p]["new"] += m
            for p in order:
                out, m, _ = self.client(p, {"task": "keepalive", "n": ka_per_round})
                ka[p] += out["times"]
                cpu[p]["keepalive"] += m
            print(f"  round {r + 1}/{a.rounds}: "
                  + ", ".join(f"{p} new p50 {percentile(new[p], .5) / 1e6:.2f} ms" for p in PATHS),
                  file=sys.stderr, flush=True)
        for t in range(a.transfers):
            order = PATHS[t % 3:] + PATHS[:t % 3]
            for p in order:
                out, m, s = self.client(p, {"task": "big", "bytes": big})
                transfers[p].append({"s": out["times"][0] / 1e9, "moatd": m, "client": out["cpu"], "server": s})
            print(f"  transfer {t + 1}/{a.transfers}: "
                  + ", ".join(f"{p} {big / transfers[p][-1]['s'] / 1e6:.0f} MB/s" for p in PATHS),
                  file=sys.stderr, flush=True)
        return new, ka, cpu, transfers

    @staticmethod
    def latency_table(times, cpu, digits):
        print("| path | p50 ms | p99 ms | added p50 ms | added p99 ms | p50 ÷ direct | p99 ÷ direct "
              "| moatd CPU ms/request |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        d50, d99 = percentile(times["direct"], .5), percentile(times["direct"], .99)
        for p in PATHS:
            p50, p99 = percentile(times[p], .5), percentile(times[p], .99)
            print(f"| {p} | {p50 / 1e6:.{digits}f} | {p99 / 1e6:.{digits}f} | {(p50 - d50) / 1e6:+.{digits}f} | "
                  f"{(p99 - d99) / 1e6:+.{digits}f} | {p50 / d50:.2f} | {p99 / d99:.2f} | "
                  f"{cpu[p] / len(times[p]) * 1e3:.3f} |")

    def report(self, new, ka, cpu, transfers):
        a = self.args
        print(f"# {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%dT%H:%MZ} {platform.release()} "
              f"{os.cpu_count()} cpus, load {os.getloadavg()[0]:.2f}; {len(new['direct'])} new-connection GETs "
              f"and {len(ka['direct'])} keep-alive GETs per path in {a.rounds} interleaved rounds, "
              f"{a.transfers} x {a.mib} MiB downloads")
        print()
        print("HTTPS GET of a small JSON answer (~330 bytes), new connection each time "
              "(TCP + CONNECT + TLS handshake + request):")
        print()
        self.latency_table(new, {p: cpu[p]["new"] for p in PATHS}, 2)
        print()
        print("The same GET on one keep-alive connection:")
        print()
        self.latency_table(ka, {p: cpu[p]["keepalive"] for p in PATHS}, 3)
        print()
        big = a.mib << 20
        print(f"Download of {a.mib} MiB on one connection (MB = 10^6 bytes; median of {a.transfers}, "
              "CPU seconds per GB downloaded):")
        print()
        print("| path | MB/s | all runs MB/s | ÷ direct | moatd CPU s/GB | client CPU s/GB | server CPU s/GB |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        rate = {p: sorted(big / t["s"] / 1e6 for t in transfers[p]) for p in PATHS}
        med = {p: rate[p][len(rate[p]) // 2] for p in PATHS}
        gb = big / 1e9
        for p in PATHS:
            runs = " / ".join(f"{big / t['s'] / 1e6:.0f}" for t in transfers[p])
            mean = lambda k: sum(t[k] for t in transfers[p]) / len(transfers[p]) / gb  # noqa: E731
            print(f"| {p} | {med[p]:.0f} | {runs} | {med[p] / med['direct']:.2f} | {mean('moatd'):.2f} | "
                  f"{mean('client'):.2f} | {mean('server'):.2f} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin-dir", default="build/bin")
    parser.add_argument("--requests", type=int, default=300, help="new-connection GETs per path")
    parser.add_argument("--keepalive", type=int, default=1000, help="keep-alive GETs per path")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds the requests are split into")
    parser.add_argument("--mib", type=int, default=256, help="size of the download")
    parser.add_argument("--transfers", type=int, default=5, help="downloads per path")
    parser.add_argument("--server-nagle", action="store_true",
                        help="leave Nagle's algorithm on in the test server (Python's default)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("SKIP: the egress benchmark needs root (moatd creates namespaces)")
        return 0
    for tool in ("ip", "openssl"):
        if not shutil.which(tool):
            print(f"FAIL: {tool} is missing (scripts/install-deps.sh installs it)")
            return 1
    et.enter_private_network()
    bench = Bench(args)
    try:
        bench.start()
        results = bench.run()
    except BaseException:
        if bench.moatd:
            print(bench.moatd.log(), file=sys.stderr)
        raise
    finally:
        bench.close()
    bench.report(*results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
