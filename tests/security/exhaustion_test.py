#!/usr/bin/env python3
"""Exhaustion suite: resource attacks from inside an environment (docs/SECURITY.md, "Exhaustion").

Each test creates an environment through moatd's API with small limits
(ram_mb 256, pids 128, storage_gb 0.5), runs one attack in it and checks:

- the limit held, in a way that can fail: the memory bomb was OOM-killed
  inside, the fork bomb stopped at the pids limit, the disk fill got EDQUOT,
  the fd flood got EMFILE, the output floods were cut at 1 MiB per stream;
- the host is unharmed: moatd answered every /healthz (5 s each at most), its
  RSS, threads and descriptors stayed bounded, the storage pool's image did
  not grow by more than the environment's storage (plus metadata slack), and
  no process of the environment's uid range left its cgroup (nor outlived
  its destroy);
- other environments keep working: a neighbour environment runs `true`
  through the exec API (one every 10 ms at most) during every attack; all
  its execs must succeed. Their p50/p99 are recorded but not asserted (a benchmark, not a
  timed test: bench/exhaustion.py runs each attack longer and prints them).

  exhaustion_test.py --bin-dir build/bin [-k NAME] [--seconds S] [--report FILE]

moatd is started on a scratch state directory and stopped at the end (its
storage pool is unmounted and the directory removed). Needs root (exits 0
with SKIP otherwise (77, CTest's "skipped"): moatd creates namespaces).
"""

import argparse
import base64
import contextlib
import errno
import http.client
import json
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest

BIN_DIR = None
ATTACK_S = 3.0          # how long each attack runs (--seconds; the benchmark runs longer)
REPORT = None           # --report FILE: the measurements as JSON, for bench/exhaustion.py
KEY_RATE = 200          # moatd's default --key-rate: requests per second per API key
NEIGHBOUR_PERIOD_S = 0.01  # the neighbour runs at most one exec this often (100/s)
RESULTS = []            # one dict per attack, in the order they ran
MIB = 1 << 20
LIMITS = {"cpus": 1, "ram_mb": 256, "pids": 128, "storage_gb": 0.5}
POOL_GB = 4             # MOAT_STORAGE_GB: the pool every environment's storage comes from
# Generous bounds on moatd itself (idle: ~10 MiB, ~10 threads, ~25 fds); each
# attack says how much more its own connections and output may take.
MOATD_THREADS_SLACK = 64   # beyond what the attack's own connections need
MOATD_FDS_SLACK = 64


# --- HTTP over moatd's unix socket -------------------------------------------

class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout=120):
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


class Client:
    """One keep-alive connection (reconnected on failure) with one token."""

    def __init__(self, moatd, token=None, timeout=120):
        self.moatd = moatd
        self.token = token
        self.timeout = timeout
        self.conn = None

    def call(self, method, path, body=None, token=True):
        if self.conn is not None and self.conn.sock is not None and self.dropped(self.conn.sock):
            # moatd closed it while it sat idle (at capacity, idle connections
            # make room for new ones; or the idle timeout): as any client
            # would, reconnect instead of sending into a closed socket.
            self.close()
        if self.conn is None:
            self.conn = UnixHTTPConnection(self.moatd.sock, timeout=self.timeout)
        headers = {}
        if token:
            headers["Authorization"] = "Bearer " + (self.token or self.moatd.token)
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        try:
            self.conn.request(method, path, body=data, headers=headers)
            r = self.conn.getresponse()
            raw = r.read()
        except (OSError, http.client.HTTPException):
            self.close()
            raise
        if r.getheader("Connection", "").lower() == "close":
            self.close()
        try:
            return r.status, json.loads(raw) if raw else None
        except ValueError:
            return r.status, raw

    @staticmethod
    def dropped(sock):
        readable, _, _ = select.select([sock], [], [], 0)
        if not readable:
            return False
        try:
            return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None


class Moatd:
    def __init__(self, bin_dir):
        self.bin_dir = bin_dir
        self.state = tempfile.mkdtemp(prefix="moatd-exhaust-")
        self.log_path = self.state + ".log"
        self.sock = os.path.join(self.state, "moatd.sock")
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               "MOAT_STORAGE_GB": str(POOL_GB)}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [os.path.join(bin_dir, "moatd"), "--state", self.state, "--listen", "127.0.0.1:0",
                 "--no-egress"],
                stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=env)
        deadline = time.monotonic() + 30
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"moatd exited at start:\n{self.log()}")
            try:
                if self.call("GET", "/healthz", token=False)[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"moatd did not start:\n{self.log()}")
            time.sleep(0.02)
        with open(os.path.join(self.state, "master-token")) as f:
            self.token = f.read().strip()
        self.pool_image = os.path.join(self.state, "storage.img")

    def log(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()[-4000:]

    def call(self, method, path, body=None, token=True, timeout=120, bearer=None):
        c = Client(self, bearer, timeout)
        try:
            return c.call(method, path, body, token)
        finally:
            c.close()

    @property
    def pid(self):
        return self.proc.pid

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def remove(self):
        """After stop(): moatd keeps its storage pool mounted by design."""
        storage = os.path.join(self.state, "storage")
        if os.path.ismount(storage):
            subprocess.run(["umount", "-l", storage], check=False)
        shutil.rmtree(self.state, ignore_errors=True)
        try:
            os.unlink(self.log_path)
        except OSError:
            pass


# --- what the host sees ------------------------------------------------------

def proc_status(pid):
    """(rss bytes, threads, open fds) of a host process, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            text = f.read()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) * 1024, int(fields["Threads"]), fds


def proc_cpu_s(pid):
    """CPU seconds (user + system, all threads) a process has used."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_uid(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Uid:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def proc_cgroups(pid):
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            return [line.rstrip("\n").split(":", 2) for line in f]
    except OSError:
        return None


def exiting(pid):
    """True for a task that is exiting or a zombie (or gone): on cgroup v1,
    /proc/PID/cgroup shows those in the root cgroup."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return True
    PF_EXITING = 0x4
    return fields[0] in "ZXx" or int(fields[6]) & PF_EXITING != 0


def cgroup_mounts():
    """controller -> mount point ("" for the v2 hierarchy)."""
    mounts = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            sep = fields.index("-")
            fstype, options = fields[sep + 1], fields[sep + 3]
            if fstype == "cgroup2":
                mounts.setdefault("", fields[4])
            elif fstype == "cgroup":
                for controller in options.split(","):
                    if controller in ("memory", "pids", "cpu"):
                        mounts.setdefault(controller, fields[4])
    return mounts


def read_counter(path, key=None):
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    if key is None:
        text = text.strip()
        return int(text) if text.isdigit() else text
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == key:
            return int(parts[1])
    return 0


def allocated_bytes(path):
    return os.stat(path).st_blocks * 512


def free_bytes(path):
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def qgroup_referenced(moatd, env):
    """Bytes the environment's subvolume holds, as its btrfs quota counts them."""
    out = subprocess.run(["btrfs", "qgroup", "show", "-re", "--raw", os.path.join(moatd.state, "storage")],
                         capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        if line.rstrip().endswith("envs/" + env.id):
            return int(line.split()[1])
    raise AssertionError(f"no quota group for {env.id}:\n{out}")


def file_nr():
    with open("/proc/sys/fs/file-nr") as f:
        return int(f.read().split()[0])


# --- environments ------------------------------------------------------------

class Env:
    def __init__(self, moatd, client=None, **spec):
        self.moatd = moatd
        self.client = client or Client(moatd)
        status, body = self.client.call("POST", "/v1/environments", {"spec": dict(LIMITS, **spec), "ttl_s": 900})
        if status != 201:
            raise AssertionError(f"create failed: {status} {body}")
        self.id = body["id"]
        self.spec = body["spec"]
        self.gone = False
        self._find_cgroups()

    def _find_cgroups(self):
        """The environment's cgroup directories and its host uid range, from its moat-init."""
        name = "moat-" + self.id
        mounts = cgroup_mounts()
        for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
            lines = proc_cgroups(pid)
            if not lines or not any(path.endswith("/" + name) for _, _, path in lines):
                continue
            try:
                with open(f"/proc/{pid}/comm") as f:
                    if f.read().strip() != "moat-init":
                        continue
            except OSError:
                continue
            self.init_pid = pid
            self.uid_base = proc_uid(pid)
            # Another moatd on the host (another state directory) numbers its
            # environments' uid ranges the same way: the pid namespace tells
            # this environment's processes apart (nothing inside can leave it).
            self.pidns = os.stat(f"/proc/{pid}/ns/pid").st_ino
            self.cgroups = {}
            for _, controllers, path in lines:
                for c in (controllers.split(",") if controllers else [""]):
                    if c in mounts and path.endswith("/" + name):
                        self.cgroups[c] = mounts[c] + path
            if "" in self.cgroups:  # pure v2: one directory for all
                for c in ("memory", "pids", "cpu"):
                    self.cgroups.setdefault(c, self.cgroups[""])
            self.v2 = "memory" not in mounts
            return
        raise AssertionError(f"no moat-init in a cgroup named {name}")

    def cg(self, controller, file, key=None):
        return read_counter(os.path.join(self.cgroups[controller], file), key)

    def pids_current(self):
        return self.cg("pids", "pids.current")

    def pids_limit_hits(self):
        return self.cg("pids", "pids.events", "max")

    def memory_current(self):
        return self.cg("memory", "memory.current" if self.v2 else "memory.usage_in_bytes")

    def memory_peak(self):
        return self.cg("memory", "memory.peak" if self.v2 else "memory.max_usage_in_bytes")

    def oom_kills(self):
        return self.cg("memory", "memory.events" if self.v2 else "memory.oom_control", "oom_kill")

    def own_pids(self):
        """Host pids of this environment: its uid range and its pid namespace."""
        found = []
        for p in os.listdir("/proc"):
            if not p.isdigit():
                continue
            uid = proc_uid(int(p))
            if uid is None or not self.uid_base <= uid < self.uid_base + 65536:
                continue
            try:
                if os.stat(f"/proc/{p}/ns/pid").st_ino != self.pidns:
                    continue
            except OSError:
                continue
            found.append(int(p))
        return found

    def escaped(self):
        """Processes of this environment's uids outside its memory or pids cgroup."""
        out = []
        for pid in self.own_pids():
            lines = proc_cgroups(pid)
            if lines is None or exiting(pid):
                continue  # exited meanwhile (read after the cgroups: exiting stays set)
            paths = {c: path for _, cs, path in lines for c in (cs.split(",") if cs else [""])}
            for c in ("memory", "pids") if not self.v2 else ("",):
                if not paths.get(c, "").endswith("/moat-" + self.id):
                    out.append((pid, c, paths.get(c)))
        return out

    def exec(self, argv, timeout_ms=30000, client=None, **extra):
        body = dict({"cmd": argv, "timeout_ms": timeout_ms}, **extra)
        status, r = (client or self.client).call("POST", f"/v1/environments/{self.id}/exec", body)
        if status != 200:
            raise AssertionError(f"exec failed: {status} {r}")
        return r

    def sh(self, script, timeout_ms=30000, **extra):
        return self.exec(["sh", "-c", script], timeout_ms, **extra)

    def python(self, code, timeout_ms=30000, **extra):
        return self.exec(["python3", "-c", code], timeout_ms, **extra)

    def start(self, argv, **extra):
        status, r = self.client.call("POST", f"/v1/environments/{self.id}/processes",
                                     dict({"cmd": argv, "stdin": False}, **extra))
        if status != 201:
            raise AssertionError(f"process start failed: {status} {r}")
        return r["id"]

    def process(self, pid):
        status, r = self.client.call("GET", f"/v1/environments/{self.id}/processes/{pid}")
        if status != 200:
            raise AssertionError(f"process get failed: {status} {r}")
        return r

    def destroy(self):
        self.client.close()
        if not self.gone:
            self.gone = True
            status, body = self.moatd.call("DELETE", f"/v1/environments/{self.id}", timeout=60)
            if status != 204:
                raise AssertionError(f"destroy failed: {status} {body}")


# --- load and watch ----------------------------------------------------------

def percentile(values, p):
    if not values:
        return float("nan")
    values = sorted(values)
    k = (len(values) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


class Neighbour:
    """Sequential `true` execs in another environment, timed, until stopped.

    A process of its own (this file with --neighbour), so that what the test
    process does meanwhile (its sampling, its flood threads: one interpreter
    lock) does not show in the neighbour's latency."""

    def __init__(self, env):
        self.env = env
        self.latencies = []
        self.failures = []

    def start(self):
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--neighbour", self.env.moatd.sock,
             self.env.client.token or self.env.moatd.token, self.env.id],
            stdout=subprocess.PIPE, text=True)
        if self.proc.stdout.readline().strip() != "ready":
            raise AssertionError("the neighbour did not start")

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            out, _ = self.proc.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            # Never left behind: it holds the test's output pipe, and ctest
            # would wait for that to close.
            self.proc.kill()
            self.proc.communicate()
            raise
        data = json.loads(out)
        self.latencies, self.failures = data["latencies"], data["failures"]


def neighbour_main(sock, token, env_id):
    # A plain flag: the handler runs on this thread, between its bytecodes;
    # an Event's set() there deadlocks when it interrupts the Event's own
    # wait(), which holds the same lock (seen: a neighbour that never ended).
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))

    class Target:
        pass
    target = Target()
    target.sock, target.token = sock, token
    client = Client(target, token, timeout=60)
    latencies, failures = [], []
    print("ready", flush=True)
    while not stopping:
        t = time.monotonic()
        try:
            status, r = client.call("POST", f"/v1/environments/{env_id}/exec", {"cmd": ["true"], "timeout_ms": 30000})
            if status != 200 or r.get("exit_code") != 0:
                failures.append([status, r])
                time.sleep(0.01)
                continue
        except (OSError, http.client.HTTPException) as e:
            failures.append(["exception", repr(e)])
            time.sleep(0.01)
            continue
        latencies.append((time.monotonic() - t) * 1000)
        # At most one exec per NEIGHBOUR_PERIOD_S: a probe of latency, and
        # under moatd's per-key rate limit (--key-rate) so it measures no wait
        # of its own making.
        time.sleep(max(0.0, t + NEIGHBOUR_PERIOD_S - time.monotonic()))
    client.close()
    json.dump({"latencies": latencies, "failures": failures}, sys.stdout)
    return 0


class Watch(threading.Thread):
    """Samples moatd (/healthz, RSS, threads, fds), the victim's cgroup and the host every 50 ms."""

    def __init__(self, moatd, victim=None):
        super().__init__(daemon=True)
        self.moatd = moatd
        self.victim = victim
        self.stopping = threading.Event()
        self.health_failures = []
        self.health_ms = []
        self.rss = self.threads = self.fds = 0
        self.pids = self.memory = 0
        self.escapes = []
        self.file_nr = 0
        base = proc_status(moatd.pid)
        self.base_rss, self.base_threads, self.base_fds = base
        self.cpu0 = proc_cpu_s(moatd.pid)
        self.cpu_s = 0.0

    def sample(self):
        s = proc_status(self.moatd.pid)
        if s:
            self.rss, self.threads, self.fds = max(self.rss, s[0]), max(self.threads, s[1]), max(self.fds, s[2])
        self.file_nr = max(self.file_nr, file_nr())
        if self.victim and not self.victim.gone:
            self.pids = max(self.pids, self.victim.pids_current() or 0)
            self.memory = max(self.memory, self.victim.memory_current() or 0)

    def run(self):
        n = 0
        while not self.stopping.wait(0.05):
            self.sample()
            t = time.monotonic()
            try:
                status, _ = self.moatd.call("GET", "/healthz", token=False, timeout=5)
                if status != 200:
                    self.health_failures.append(status)
            except (OSError, http.client.HTTPException) as e:
                self.health_failures.append(repr(e))
            self.health_ms.append((time.monotonic() - t) * 1000)
            n += 1
            if self.victim and not self.victim.gone and n % 40 == 0:  # every 2 s: a scan of /proc
                self.escapes += self.victim.escaped()

    def stop(self):
        self.stopping.set()
        self.join(60)
        self.sample()
        self.cpu_s = proc_cpu_s(self.moatd.pid) - self.cpu0


class ExhaustionTest(unittest.TestCase):
    """Every attack runs under the attacker's key; the neighbour has a key of its own."""
    moatd = None
    neighbour = None
    attacker = None  # Client factory for the attacker's key

    @classmethod
    def setUpClass(cls):
        cls.moatd = Moatd(BIN_DIR)
        scopes = ["create", "read", "exec", "destroy"]
        cls.keys = {}
        for name in ("attacker", "neighbour"):
            status, key = cls.moatd.call("POST", "/v1/keys", {"name": name, "scopes": scopes})
            if status != 201:
                raise AssertionError(f"key create failed: {status} {key}")
            cls.keys[name] = key["token"]
        cls.neighbour = Env(cls.moatd, Client(cls.moatd, cls.keys["neighbour"]), ram_mb=512, pids=256)
        # A first exec warms its overlay (the first command in a fresh one pays cold lookups).
        cls.neighbour.exec(["true"])

    @classmethod
    def tearDownClass(cls):
        if cls.neighbour:
            cls.neighbour.client.close()
        if cls.moatd:
            cls.moatd.stop()
            cls.moatd.remove()

    def setUp(self):
        self.envs = []
        self.before = proc_status(self.moatd.pid)

    def tearDown(self):
        for e in self.envs:
            try:
                e.destroy()
            except (AssertionError, OSError):
                pass

    def client(self, timeout=120):
        return Client(self.moatd, self.keys["attacker"], timeout)

    def victim(self, **spec):
        e = Env(self.moatd, self.client(), **spec)
        self.envs.append(e)
        return e

    @contextlib.contextmanager
    def attack(self, name, victim, fds_allowance=0, threads_allowance=0, rss_allowance=256 * MIB):
        """Runs the body as the attack; then checks the host and the neighbour."""
        watch = Watch(self.moatd, victim)
        neighbour = Neighbour(self.neighbour)
        watch.start()
        neighbour.start()
        t0 = time.monotonic()
        try:
            yield watch
        finally:
            seconds = time.monotonic() - t0
            neighbour.stop()
            watch.stop()
        lat = neighbour.latencies
        result = {"attack": name, "seconds": round(seconds, 2), "execs": len(lat),
                  "p50_ms": round(percentile(lat, 50), 2), "p99_ms": round(percentile(lat, 99), 2),
                  "max_ms": round(max(lat), 2) if lat else None,
                  "neighbour_failures": len(neighbour.failures),
                  "healthz_max_ms": round(max(watch.health_ms), 1) if watch.health_ms else None,
                  "moatd_rss_mib": round(watch.base_rss / MIB, 1),
                  "moatd_rss_peak_mib": round(watch.rss / MIB, 1),
                  "moatd_cpu_s": round(watch.cpu_s, 2),
                  "moatd_threads_peak": watch.threads, "moatd_fds_peak": watch.fds,
                  "victim_pids_peak": watch.pids, "victim_memory_peak_mib": round(watch.memory / MIB, 1)}
        result.update(getattr(watch, "extra", {}))
        RESULTS.append(result)
        print(f"\n  {name}: {json.dumps(result)}", file=sys.stderr)
        # The host: moatd answered throughout and stayed bounded.
        self.assertEqual(watch.health_failures[:5], [], "moatd stopped answering /healthz")
        self.assertIsNone(self.moatd.proc.poll(), "moatd exited")
        self.assertLess(watch.rss - watch.base_rss, rss_allowance, "moatd's memory grew beyond its bound")
        self.assertLess(watch.threads, watch.base_threads + MOATD_THREADS_SLACK + threads_allowance)
        self.assertLess(watch.fds, watch.base_fds + MOATD_FDS_SLACK + fds_allowance)
        # The neighbour kept working: every exec succeeded, and some ran.
        self.assertEqual(neighbour.failures[:5], [], "the neighbour's execs failed")
        self.assertGreater(len(lat), 0, "the neighbour ran nothing during the attack")
        # Nothing of the victim's left its cgroup.
        self.assertEqual(watch.escapes, [], "a process left the environment's cgroup")
        if victim is not None and not victim.gone:
            self.assertEqual(victim.escaped(), [])

    def assertDestroyedClean(self, env):
        """Destroy works (whatever runs inside) and leaves no process of its uids."""
        env.destroy()
        deadline = time.monotonic() + 15
        while env.own_pids() and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertEqual(env.own_pids(), [], "processes outlived their environment")
        for path in set(env.cgroups.values()):
            self.assertFalse(os.path.exists(path), f"{path} outlived its environment")
        # moatd gave back the threads and descriptors the attack made it use.
        _, threads0, fds0 = self.before
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            _, threads, fds = proc_status(self.moatd.pid)
            if threads <= threads0 + 2 and fds <= fds0 + 4:
                break
            time.sleep(0.1)
        self.assertLessEqual(threads, threads0 + 2, "moatd kept threads after the attack")
        self.assertLessEqual(fds, fds0 + 4, "moatd kept descriptors after the attack")

    # --- the attacks ---------------------------------------------------------

    def test_baseline(self):
        """No attack: the neighbour's latency to compare the others with."""
        with self.attack("none (baseline)", None):
            time.sleep(ATTACK_S)

    def test_fork_bomb(self):
        e = self.victim()
        hits = e.pids_limit_hits()
        # Counted: fork until the kernel refuses; every child sleeps.
        counter = ("import os, time, signal\nkids = []\nerr = 0\n"
                   "while True:\n"
                   "    try:\n        pid = os.fork()\n"
                   "    except OSError as ex:\n        err = ex.errno\n        break\n"
                   "    if pid == 0:\n        time.sleep(60)\n        os._exit(0)\n"
                   "    kids.append(pid)\n"
                   "print(len(kids), err)\n"
                   "for k in kids:\n    os.kill(k, signal.SIGKILL)\n    os.waitpid(k, 0)\n")
        with self.attack("fork bomb", e) as w:
            r = e.python(counter)
            forks, err = map(int, r["stdout"].split())
            # The classic: each b starts two more in the background, so it
            # outlives the exec that started it; only the destroy ends it.
            bomb = e.sh("b() { b | b & }; b", timeout_ms=5000)
            # Its population comes and goes as dash fails to fork: sampled
            # here every few milliseconds too (the watcher's 50 ms missed
            # the peak under a loaded ctest -j2), into the watcher's peak.
            until = time.monotonic() + ATTACK_S
            while time.monotonic() < until:
                w.pids = max(w.pids, e.pids_current() or 0)
                time.sleep(0.005)
            # moat-init still answers: a command runs or fails to fork, but returns.
            t = time.monotonic()
            probe = e.exec(["true"], timeout_ms=10000)
            w.extra = {"forks_before_EAGAIN": forks, "probe_exit": probe["exit_code"],
                       "probe_s": round(time.monotonic() - t, 2)}
        self.assertEqual(err, errno.EAGAIN, r)
        self.assertLess(forks, LIMITS["pids"], "more processes than the pids limit")
        self.assertGreater(forks, LIMITS["pids"] // 2, r)
        self.assertFalse(bomb["timed_out"], bomb)  # it started (dash says "Cannot fork" at the limit)
        self.assertLessEqual(w.pids, LIMITS["pids"])
        # and the bomb did fill it (0 processes from a failure elsewhere
        # would pass the bound above)
        self.assertGreaterEqual(w.pids, LIMITS["pids"] * 3 // 4, "the bomb never came near the pids limit")
        self.assertGreater(e.pids_limit_hits(), hits, "the bomb never hit the pids limit")
        self.assertDestroyedClean(e)

    def test_memory_bomb(self):
        e = self.victim()
        kills = e.oom_kills()
        bomb = ("chunks = []\n"
                "while True:\n    chunks.append(b'\\x01' * (16 << 20))\n")
        with self.attack("memory bomb", e) as w:
            deadline = time.monotonic() + ATTACK_S - 1
            bombs = []
            while not bombs or time.monotonic() < deadline:
                bombs.append(e.python(bomb, timeout_ms=60000))
            r = bombs[0]
            # Memory the OOM killer cannot take back: tmpfs pages (no swap).
            shm = e.sh("dd if=/dev/zero of=/dev/shm/fill bs=1M 2>/dev/null; echo $?; du -m /dev/shm/fill",
                       timeout_ms=30000)
            at_full_shm = e.exec(["true"], timeout_ms=10000)
            e.exec(["rm", "-f", "/dev/shm/fill"])
            w.extra = {"bombs": len(bombs), "bomb_exits": sorted({b["exit_code"] for b in bombs}),
                       "oom_kills": e.oom_kills() - kills, "shm_dd_exit_and_mib": shm["stdout"].split()[:2],
                       "exec_at_full_shm": at_full_shm["exit_code"]}
        for b in bombs:
            self.assertEqual(b["exit_code"], 128 + signal.SIGKILL, b)
        self.assertGreaterEqual(e.oom_kills() - kills, len(bombs), "no OOM kill in the environment's cgroup")
        self.assertLessEqual(e.memory_peak(), LIMITS["ram_mb"] * MIB)
        self.assertLessEqual(w.memory, LIMITS["ram_mb"] * MIB)
        self.assertLessEqual(int(shm["stdout"].split()[1]), LIMITS["ram_mb"], shm)
        # pid 1 survived: the environment still runs commands.
        self.assertEqual(e.exec(["true"])["exit_code"], 0)
        self.assertDestroyedClean(e)

    def test_disk_fill(self):
        e = self.victim()
        image0, free0 = allocated_bytes(self.moatd.pool_image), free_bytes(self.moatd.state)
        fill = ("import os\nn = 0\nb = b'x' * (1 << 20)\n"
                "f = open('/workspace/fill', 'wb', buffering=0)\n"
                "try:\n    while True:\n        n += f.write(b)\n"
                "except OSError as ex:\n    print(n, ex.errno)\n")
        with self.attack("disk fill", e) as w:
            deadline = time.monotonic() + ATTACK_S - 1
            fills = 0
            while True:
                r = e.python(fill, timeout_ms=120000)
                written, err = map(int, r["stdout"].split())
                fills += 1
                if fills == 1:
                    grown = allocated_bytes(self.moatd.pool_image) - image0
                    dropped = free0 - free_bytes(self.moatd.state)
                    used = qgroup_referenced(self.moatd, e)
                    # The neighbour's storage is untouched: it still writes.
                    wrote = self.neighbour.sh("head -c 1048576 /dev/zero > /workspace/x && wc -c < /workspace/x "
                                              "&& rm /workspace/x")
                if time.monotonic() > deadline or err not in (errno.EDQUOT, errno.ENOSPC):
                    break
                e.exec(["rm", "/workspace/fill"])  # and again
            # Freed extents go back to the host only when btrfs's asynchronous
            # discard punches them out of the image: refills grow it meanwhile.
            grown_all = allocated_bytes(self.moatd.pool_image) - image0
            w.extra = {"fills": fills, "written_mib": round(written / MIB, 1), "errno": errno.errorcode.get(err, err),
                       "quota_used_mib": round(used / MIB, 1), "pool_image_grown_mib": round(grown / MIB, 1),
                       "host_free_drop_mib": round(dropped / MIB, 1),
                       "pool_image_grown_after_all_fills_mib": round(grown_all / MIB, 1)}
        quota = LIMITS["storage_gb"] * 1024 * MIB
        self.assertIn(err, (errno.EDQUOT, errno.ENOSPC), r)
        self.assertLessEqual(written, quota)
        self.assertGreater(written, quota * 0.8, "stopped well before its quota")
        self.assertLessEqual(used, quota)
        self.assertEqual(wrote["stdout"].strip(), "1048576", wrote)
        self.assertLess(grown, quota + 64 * MIB, "the pool grew by more than the environment's storage")
        # Other work on the machine writes too: the host's free space is only checked loosely.
        self.assertLess(dropped, quota + 1024 * MIB)
        self.assertDestroyedClean(e)

    def test_inode_fill(self):
        # Metadata counts against the quota (btrfs simple quotas own metadata
        # blocks too): ~350 bytes per empty file, so a small quota is filled
        # in seconds. The benchmark uses a larger one.
        storage_gb = 0.01 if ATTACK_S < 10 else 0.1
        e = self.victim(storage_gb=storage_gb)
        image0 = allocated_bytes(self.moatd.pool_image)
        fill = ("import os\nos.mkdir('/workspace/i')\nn = 0\n"
                "try:\n    while True:\n"
                "        os.close(os.open('/workspace/i/%d' % n, os.O_CREAT | os.O_WRONLY, 0o644))\n        n += 1\n"
                "except OSError as ex:\n    print(n, ex.errno)\n")
        with self.attack("inode fill", e) as w:
            r = e.python(fill, timeout_ms=300000)
            files, err = map(int, r["stdout"].split())
            wrote = self.neighbour.sh("touch /workspace/y && rm /workspace/y && echo ok")
            grown = allocated_bytes(self.moatd.pool_image) - image0
            used = qgroup_referenced(self.moatd, e)
            w.extra = {"files": files, "errno": errno.errorcode.get(err, err), "quota_used_mib": round(used / MIB, 1),
                       "pool_image_grown_mib": round(grown / MIB, 1)}
        quota = storage_gb * 1024 * MIB
        self.assertIn(err, (errno.EDQUOT, errno.ENOSPC), r)
        self.assertGreater(files, 1000, r)
        self.assertLessEqual(used, quota)
        self.assertEqual(wrote["stdout"].strip(), "ok", wrote)
        # The pool's image: metadata is written twice (DUP), and btrfs's
        # commits near a full quota cycle through the whole metadata block
        # group (256 MiB, so 512 MiB written), once per pool (docs/SECURITY.md).
        self.assertLess(grown, 2 * quota + 512 * MIB + 64 * MIB)
        self.assertDestroyedClean(e)

    def test_fd_exhaustion(self):
        e = self.victim()
        procs = 8
        flood = ("import os, resource, sys\n"
                 "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
                 "resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))\n"
                 "kids = []\n"
                 f"for i in range({procs}):\n"
                 "    r, w = os.pipe()\n"
                 "    pid = os.fork()\n"
                 "    if pid == 0:\n"
                 "        os.close(r)\n        n = 0\n        err = 0\n"
                 "        try:\n            while True:\n                os.open('/dev/null', os.O_RDONLY)\n                n += 1\n"
                 "        except OSError as ex:\n            err = ex.errno\n"
                 "        os.write(w, b'%d %d\\n' % (n, err))\n        os._exit(0)\n"
                 "    os.close(w)\n    kids.append((pid, r))\n"
                 "for pid, r in kids:\n    sys.stdout.write(os.read(r, 100).decode())\n    os.waitpid(pid, 0)\n"
                 "print('limit', hard)\n")
        nr0 = file_nr()
        with self.attack("fd exhaustion", e) as w:
            deadline = time.monotonic() + ATTACK_S - 1
            rounds = 0
            while not rounds or time.monotonic() < deadline:
                r = e.python(flood, timeout_ms=120000)
                rounds += 1
                lines = r["stdout"].split("\n")
                results = [tuple(map(int, line.split())) for line in lines if line and not line.startswith("limit")]
                hard = int([line for line in lines if line.startswith("limit")][0].split()[1])
                if len(results) != procs:
                    break
            w.extra = {"rounds": rounds, "processes": procs, "fds_each": sorted({n for n, _ in results}),
                       "errnos": sorted({errno.errorcode.get(x, x) for _, x in results}),
                       "host_file_nr_rise": w.file_nr - nr0, "nofile_hard": hard}
        self.assertEqual(len(results), procs, r)
        for n, err in results:
            # EMFILE at the per-process limit, or ENOMEM when the cgroup's
            # memory (open files are charged to it) runs out first: inside, either way.
            self.assertIn(err, (errno.EMFILE, errno.ENOMEM), r)
            self.assertLess(n, hard, r)
        self.assertIn(errno.EMFILE, [err for _, err in results], r)
        self.assertEqual(e.exec(["true"])["exit_code"], 0)
        self.assertDestroyedClean(e)

    def test_output_flood_exec(self):
        e = self.victim()
        flood = "yes & yes >&2 & wait"
        # moatd holds an exec's output, then its JSON answer (1.5x for lines of
        # `yes`): ~100 MiB at the peak for each of the 8 execs at 16 MiB a
        # stream that the attacker's budget admits, and the neighbour's one.
        with self.attack("output flood (exec)", e, rss_allowance=1536 * MIB, fds_allowance=16,
                         threads_allowance=16) as w:
            t_ms = int(ATTACK_S * 1000)
            r = e.sh(flood, timeout_ms=t_ms)
            # At the largest output limit (16 MiB a stream) the attacker's execs
            # in flight may reserve 256 MiB: 8 of them. A ninth is refused.
            results = []

            def big():
                c = self.client()
                try:
                    results.append(e.exec(["sh", "-c", "sleep 1; " + flood], timeout_ms=t_ms + 1000,
                                          client=c, output_limit=16 * MIB))
                finally:
                    c.close()
            threads = [threading.Thread(target=big) for _ in range(8)]
            for t in threads:
                t.start()
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                status, listed = e.client.call("GET", f"/v1/environments/{e.id}/processes")
                if len([p for p in listed["processes"] if p["kind"] == "exec"]) >= 8:
                    break
                time.sleep(0.02)
            c = self.client()
            status9, ninth = c.call("POST", f"/v1/environments/{e.id}/exec", {"cmd": ["true"], "output_limit": 16 * MIB})
            c.close()
            # Another caller's execs are not counted against the attacker's.
            other = self.neighbour.exec(["true"], output_limit=16 * MIB)
            for t in threads:
                t.join()
            w.extra = {"stdout_kept": len(r["stdout"]), "stderr_kept": len(r["stderr"]),
                       "big_stdout_kept": sorted({len(x["stdout"]) for x in results}), "ninth": status9}
        self.assertTrue(r["timed_out"], r["timed_out"])
        self.assertEqual(len(r["stdout"]), MIB)
        self.assertEqual(len(r["stderr"]), MIB)
        self.assertTrue(r["stdout_truncated"] and r["stderr_truncated"])
        self.assertEqual(len(results), 8)
        for x in results:
            self.assertEqual(len(x["stdout"]), 16 * MIB)
            self.assertTrue(x["stdout_truncated"])
        self.assertEqual(status9, 429, ninth)
        self.assertEqual(ninth["error"]["code"], "capacity", ninth)
        self.assertEqual(other["exit_code"], 0)
        # Once answered, what the flood held is given back (the connections'
        # threads end after their clients close: wait for it, 10 s at most).
        deadline = time.monotonic() + 10
        while proc_status(self.moatd.pid)[0] - w.base_rss >= 64 * MIB and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertLess(proc_status(self.moatd.pid)[0] - w.base_rss, 64 * MIB)
        self.assertDestroyedClean(e)

    def test_output_flood_process(self):
        e = self.victim()
        # A follower that never reads: moatd must not buffer for it.
        stuck = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stuck.connect(self.moatd.sock)
        with self.attack("output flood (process)", e, fds_allowance=8, threads_allowance=8) as w:
            pid = e.start(["sh", "-c", "cat /dev/zero & cat /dev/zero >&2 & wait"])
            stuck.sendall((f"GET /v1/environments/{e.id}/processes/{pid}/output?follow=1 HTTP/1.1\r\n"
                           f"Host: x\r\nAuthorization: Bearer {self.keys['attacker']}\r\n\r\n").encode())
            # A follower that reads everything, as fast as it can.
            got = {"bytes": 0, "dropped": 0, "final": None}

            def follow():
                conn = UnixHTTPConnection(self.moatd.sock, timeout=60)
                conn.request("GET", f"/v1/environments/{e.id}/processes/{pid}/output?follow=1&encoding=base64",
                             headers={"Authorization": "Bearer " + self.keys["attacker"]})
                resp = conn.getresponse()
                for line in resp:
                    ev = json.loads(line)
                    if ev["type"] == "output":
                        got["bytes"] += len(base64.b64decode(ev["data"]))
                    elif ev["type"] == "dropped":
                        got["dropped"] += ev["bytes"]
                    elif ev["type"] in ("exit", "end"):
                        got["final"] = ev["type"]
                        break
                conn.close()
            follower = threading.Thread(target=follow, daemon=True)
            follower.start()
            time.sleep(ATTACK_S)
            info = e.process(pid)
            status, _ = e.client.call("POST", f"/v1/environments/{e.id}/processes/{pid}/signal", {"signal": "KILL"})
            follower.join(30)
            w.extra = {"stdout_mib": round(info["stdout_bytes"] / MIB), "stderr_mib": round(info["stderr_bytes"] / MIB),
                       "follower_read_mib": round(got["bytes"] / MIB),
                       "follower_told_dropped_mib": round(got["dropped"] / MIB)}
        stuck.close()
        self.assertEqual(status, 204)
        self.assertGreater(info["stdout_bytes"], 64 * MIB, info)
        self.assertGreater(info["stderr_bytes"], 64 * MIB, info)
        # What moatd kept: the last 1 MiB of each stream.
        self.assertLessEqual(info["stdout_bytes"] - info["stdout_dropped"], MIB, info)
        self.assertLessEqual(info["stderr_bytes"] - info["stderr_dropped"], MIB, info)
        self.assertFalse(follower.is_alive(), "the follower never got the final event")
        self.assertEqual(got["final"], "exit")
        self.assertDestroyedClean(e)

    def test_output_flood_many_processes(self):
        # The per-environment maximum of background processes, all flooding:
        # moatd holds at most 1 MiB per stream of each.
        e = self.victim()
        with self.attack("output flood (32 processes)", e, rss_allowance=32 * 2 * MIB + 64 * MIB) as w:
            ids = [e.start(["sh", "-c", "cat /dev/zero & cat /dev/zero >&2 & wait"]) for _ in range(32)]
            status, over = e.client.call("POST", f"/v1/environments/{e.id}/processes", {"cmd": ["true"]})
            time.sleep(ATTACK_S)
            infos = [e.process(i) for i in ids]
            w.extra = {"total_mib": round(sum(i["stdout_bytes"] + i["stderr_bytes"] for i in infos) / MIB)}
        self.assertEqual(status, 429, over)
        for info in infos:
            self.assertLessEqual(info["stdout_bytes"] - info["stdout_dropped"], MIB, info)
            self.assertLessEqual(info["stderr_bytes"] - info["stderr_dropped"], MIB, info)
        self.assertDestroyedClean(e)

    def test_pty_flood(self):
        e = self.victim()
        with self.attack("pty flood", e, fds_allowance=8, threads_allowance=8) as w:
            # An interactive shell over the WebSocket, told to print as fast as it can.
            ws = WebSocket(self.moatd, self.keys["attacker"], f"/v1/environments/{e.id}/shell?rows=24&cols=80")
            hello = ws.recv_control()
            ws.send_binary(b"cat /dev/zero | tr '\\0' x\n")
            # A second viewer that never reads.
            stuck = WebSocket(self.moatd, self.keys["attacker"],
                              f"/v1/environments/{e.id}/shell?process={hello['process']}")
            deadline = time.monotonic() + ATTACK_S
            got = 0
            while time.monotonic() < deadline:
                got += len(ws.recv_binary())
            info = e.process(hello["process"])
            ws.send_text(json.dumps({"type": "signal", "signal": "KILL"}))
            w.extra = {"viewer_read_mib": round(got / MIB), "terminal_output_mib": round(info["stdout_bytes"] / MIB)}
            ws.close()
            stuck.close()
        self.assertGreater(got, 16 * MIB)
        self.assertGreater(info["stdout_bytes"], 16 * MIB)
        self.assertLessEqual(info["stdout_bytes"] - info["stdout_dropped"], MIB, info)
        self.assertDestroyedClean(e)

    def exec_flooders(self, e, n):
        """n threads (not started) running `true` in e back to back under the
        attacker's key until `stopping` is set; `counts` tallies ok, refused
        (any other status) and errors (a broken connection)."""
        stopping = threading.Event()
        counts = {"ok": 0, "refused": 0, "errors": 0}
        lock = threading.Lock()

        def flood():
            c = self.client(timeout=30)
            while not stopping.is_set():
                try:
                    status, _ = c.call("POST", f"/v1/environments/{e.id}/exec", {"cmd": ["true"]})
                    with lock:
                        counts["ok" if status == 200 else "refused"] += 1
                except (OSError, http.client.HTTPException):
                    with lock:
                        counts["errors"] += 1
                    time.sleep(0.01)
            c.close()
        return stopping, counts, [threading.Thread(target=flood, daemon=True) for _ in range(n)]

    def test_api_exec_flood(self):
        # One key, 32 clients running `true` back to back in its environment:
        # the key gets its rate (moatd --key-rate) and no more of moatd's time.
        e = self.victim()
        stopping, counts, threads = self.exec_flooders(e, 32)
        with self.attack("API exec flood", e, fds_allowance=4 * 32 + 64, threads_allowance=32 + 16) as w:
            started = time.monotonic()
            for t in threads:
                t.start()
            time.sleep(ATTACK_S)
            stopping.set()
            for t in threads:
                t.join(30)
            flood_s = time.monotonic() - started
            w.extra = dict(counts, flood_s=round(flood_s, 1), execs_per_s=round(counts["ok"] / flood_s))
        self.assertEqual(counts["errors"], 0, counts)
        self.assertLessEqual(counts["ok"], KEY_RATE * flood_s + 2 * KEY_RATE, counts)
        # Limited, not starved: the key got a good part of its rate.
        self.assertGreater(counts["ok"], KEY_RATE * flood_s / 4, counts)
        self.assertDestroyedClean(e)

    def test_api_flood(self):
        # One key, everything at once: clients running `true` back to back in
        # its environment, more followers holding a request open than it may
        # have, and more idle or stalled connections than moatd serves.
        e = self.victim()
        quiet = e.start(["sleep", "3600"])
        stopping, counts, threads = self.exec_flooders(e, 32)

        def raw(request=None):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(self.moatd.sock)  # blocking: waits while the listen backlog is full
            s.settimeout(30)
            if request:
                s.sendall(request.encode())
            return s
        followers, idle, answers = [], [], {}
        # Each connection costs moatd a thread and four descriptors (the socket, asio's epoll, eventfd, timerfd).
        with self.attack("API flood", e, fds_allowance=4 * 512 + 64, threads_allowance=512 + 16) as w, \
                contextlib.ExitStack() as cleanup:
            cleanup.callback(lambda: [s.close() for s in followers + idle])
            cleanup.callback(lambda: [t.join(30) for t in threads])
            cleanup.callback(stopping.set)
            flood_started = time.monotonic()
            for t in threads:
                t.start()
            for _ in range(300):
                followers.append(raw(f"GET /v1/environments/{e.id}/processes/{quiet}/output?follow=1 HTTP/1.1\r\n"
                                     f"Host: x\r\nAuthorization: Bearer {self.keys['attacker']}\r\n\r\n"))
            for s in followers:
                try:
                    head = s.recv(4096).split(b"\r\n", 1)[0].decode()
                except OSError as ex:
                    head = repr(ex)
                answers[head] = answers.get(head, 0) + 1
            # Idle connections, and (as many) unauthenticated requests that
            # declare a body and never send it: moatd reads a refused request's
            # small body to keep its connection, and must count such a
            # connection as idle (closable for a newcomer), not busy.
            stalled = "POST /v1/environments HTTP/1.1\r\nHost: x\r\nContent-Length: 65536\r\n\r\n"
            for i in range(600):
                idle.append(raw(stalled if i % 2 else None))
            time.sleep(ATTACK_S)
            # Another caller is served, on a fresh connection.
            t = time.monotonic()
            status_other, _ = self.moatd.call("GET", "/v1/environments", bearer=self.keys["neighbour"])
            other_ms = (time.monotonic() - t) * 1000
            cleanup.close()
            flood_s = time.monotonic() - flood_started
            w.extra = dict(counts, follow_answers=answers, other_caller=status_other,
                           other_caller_ms=round(other_ms, 1), flood_s=round(flood_s, 1))
        self.assertEqual(status_other, 200)
        self.assertGreater(counts["ok"], 0)
        # The key got at most its share of requests in progress; the rest were refused.
        accepted = answers.get("HTTP/1.1 200 OK", 0)
        self.assertLessEqual(accepted, 256, answers)
        self.assertGreater(answers.get("HTTP/1.1 429 Too Many Requests", 0), 0, answers)
        # And no more than its rate: moatd's default --key-rate (200 per
        # second, bursts of 400), whatever number of connections it used.
        self.assertLessEqual(counts["ok"] + accepted, KEY_RATE * flood_s + 2 * KEY_RATE, counts)
        self.assertDestroyedClean(e)


# --- a minimal WebSocket client (RFC 6455) -----------------------------------

class WebSocket:
    def __init__(self, moatd, token, path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(30)
        self.sock.connect(moatd.sock)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
                           f"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                           f"Sec-WebSocket-Version: 13\r\n\r\n").encode())
        self.buf = b""
        while b"\r\n\r\n" not in self.buf:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise AssertionError("connection closed during the handshake")
            self.buf += chunk
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        if not head.startswith(b"HTTP/1.1 101"):
            raise AssertionError(f"no upgrade: {head[:200]!r}")

    def _read(self, n):
        while len(self.buf) < n:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise EOFError
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def frame(self):
        b0, b1 = self._read(2)
        n = b1 & 0x7f
        if n == 126:
            n = struct.unpack(">H", self._read(2))[0]
        elif n == 127:
            n = struct.unpack(">Q", self._read(8))[0]
        return b0 & 0x0f, self._read(n)

    def recv_control(self):
        while True:
            op, data = self.frame()
            if op == 1:
                return json.loads(data)

    def recv_binary(self):
        while True:
            op, data = self.frame()
            if op == 2:
                return data
            if op == 8:
                raise EOFError

    def send(self, op, data):
        mask = os.urandom(4)
        head = bytes([0x80 | op])
        n = len(data)
        if n < 126:
            head += bytes([0x80 | n])
        elif n < 65536:
            head += bytes([0x80 | 126]) + struct.pack(">H", n)
        else:
            head += bytes([0x80 | 127]) + struct.pack(">Q", n)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
        self.sock.sendall(head + mask + masked)

    def send_binary(self, data):
        self.send(2, data)

    def send_text(self, text):
        self.send(1, text.encode())

    def close(self):
        try:
            self.send(8, struct.pack(">H", 1000))
        except OSError:
            pass
        self.sock.close()


def main():
    global BIN_DIR, ATTACK_S, REPORT
    if len(sys.argv) == 5 and sys.argv[1] == "--neighbour":
        return neighbour_main(*sys.argv[2:])
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin-dir", required=True)
    parser.add_argument("--seconds", type=float, default=ATTACK_S, help="how long each attack runs")
    parser.add_argument("--report", help="write the measurements as JSON to this file")
    args, rest = parser.parse_known_args()
    if os.geteuid() != 0:
        print("SKIP: the exhaustion tests need root (moatd creates namespaces)")
        return 77  # CTest's "skipped" (SKIP_RETURN_CODE), not a pass
    BIN_DIR = os.path.abspath(args.bin_dir)
    ATTACK_S = args.seconds
    REPORT = args.report
    result = unittest.main(argv=[sys.argv[0], "-v", *rest], exit=False).result
    if REPORT:
        with open(REPORT, "w") as f:
            json.dump(RESULTS, f, indent=1)
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
