"""Shared by the stress suites (soak, load, crash recovery): a moatd of the
test's own on a scratch state directory, an HTTP client for its unix socket,
and a census of everything a moatd holds or leaves on the host.

Every count is scoped to this test's moatd (its state directory, its
spawner's process tree, the ids it was asked about), because other work
(other moatds, other test runs) shares the machine.
"""

import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def is_root():
    return os.geteuid() == 0


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout=120):
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.unix_path)


class Client:
    """One client of moatd: a keep-alive connection (keep=True) or a fresh
    connection per request. call() returns (status, body): JSON decoded when
    it is JSON, bytes otherwise. Transport errors raise OSError or
    http.client.HTTPException."""

    def __init__(self, sock_path, token, keep=True, timeout=120):
        self.sock_path = sock_path
        self.token = token
        self.keep = keep
        self.timeout = timeout
        self.conn = None

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def call(self, method, path, body=None, raw=False, headers=None):
        if self.conn is None:
            self.conn = UnixHTTPConnection(self.sock_path, self.timeout)
        h = {"Authorization": "Bearer " + self.token}
        if headers:
            h.update(headers)
        data = None
        if isinstance(body, (bytes, bytearray)):
            data = bytes(body)
            h["Content-Type"] = "application/octet-stream"
        elif body is not None:
            data = json.dumps(body).encode()
            h["Content-Type"] = "application/json"
        try:
            self.conn.request(method, path, body=data, headers=h)
            r = self.conn.getresponse()
            payload = r.read()
        except BaseException:
            self.close()
            raise
        if not self.keep or r.getheader("Connection", "").lower() == "close":
            self.close()
        if raw:
            return r.status, payload
        if payload and (r.getheader("Content-Type") or "").startswith("application/json"):
            return r.status, json.loads(payload)
        return r.status, payload


class Moatd:
    """A moatd on a scratch state directory (MOAT_STORAGE_GB=8, like the
    other tests), started at construction; kill9() and start() again reuse
    the state, as a crashed and restarted service would."""

    def __init__(self, bin_dir, args=(), storage_gb=8, prefix="moatd-stress-"):
        self.bin_dir = os.path.abspath(bin_dir)
        self.args = list(args)
        self.storage_gb = storage_gb
        self.state = tempfile.mkdtemp(prefix=prefix)
        self.log_path = self.state + ".log"
        self.proc = None
        self._token = None
        self.start()

    def start(self):
        env = {"PATH": PATH, "MOAT_STORAGE_GB": str(self.storage_gb)}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [os.path.join(self.bin_dir, "moatd"), "--state", self.state, "--listen", "127.0.0.1:0"]
                + self.args, stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=env)
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"moatd exited at start:\n{self.log()}")
            try:
                c = Client(self.sock_path, "", keep=False, timeout=5)
                if c.call("GET", "/healthz")[0] == 200:
                    break
            except (OSError, http.client.HTTPException):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"moatd did not start:\n{self.log()}")
            time.sleep(0.02)
        with open(os.path.join(self.state, "master-token")) as f:
            self._token = f.read().strip()

    def start_and_kill(self, after_s):
        """Starts moatd and kills it with SIGKILL after_s seconds later,
        whatever it is doing by then (re-attaching, serving)."""
        env = {"PATH": PATH, "MOAT_STORAGE_GB": str(self.storage_gb)}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [os.path.join(self.bin_dir, "moatd"), "--state", self.state, "--listen", "127.0.0.1:0"]
                + self.args, stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=env)
        time.sleep(after_s)
        self.kill9()

    @property
    def pid(self):
        return self.proc.pid

    @property
    def sock_path(self):
        return os.path.join(self.state, "moatd.sock")

    @property
    def token(self):
        return self._token

    def client(self, keep=True, timeout=120):
        return Client(self.sock_path, self._token, keep=keep, timeout=timeout)

    def call(self, method, path, body=None, raw=False, timeout=120):
        return self.client(keep=False, timeout=timeout).call(method, path, body, raw=raw)

    def log(self, tail=6000):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()[-tail:]
        except OSError:
            return ""

    def stop(self, timeout=120):
        """SIGTERM: moatd destroys its environments and the spawner exits."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise RuntimeError("moatd did not stop within %d s after SIGTERM" % timeout)

    def kill9(self):
        self.proc.kill()
        self.proc.wait()

    def spawner_pids(self):
        """The spawner: a fork of moatd (same command line), not moatd."""
        me = self.proc.pid if self.proc and self.proc.poll() is None else -1
        found = []
        for pid in all_pids():
            if pid == me:
                continue
            if read(f"/proc/{pid}/comm").strip() == "moatd" and self.state in cmdline(pid):
                found.append(pid)
        return found

    def remove(self):
        """After stop(): whatever a failed test left, then the state itself.
        moatd keeps its storage pool mounted by design, and a moatd killed
        with SIGKILL leaves its egress namespace mounted (the next adopts it)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pid in self.spawner_pids():
            # A spawner left behind by a failed test: ask it to destroy its
            # environments and exit (its shutdown request), as the C++ fixture does.
            try:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                s.settimeout(60)
                s.connect(os.path.join(self.state, "spawner.sock"))
                s.send(b"\x05")
                s.recv(64)
                s.close()
            except OSError:
                pass
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for m in ("storage", "run/egress.netns"):
            path = os.path.join(self.state, m)
            if os.path.ismount(path) or m == "run/egress.netns":
                subprocess.run(["umount", "-l", path], capture_output=True)
        shutil.rmtree(self.state, ignore_errors=True)
        try:
            os.unlink(self.log_path)
        except OSError:
            pass


# --- /proc helpers ---------------------------------------------------------

def read(path, default=""):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return default


def cmdline(pid):
    return read(f"/proc/{pid}/cmdline").replace("\0", " ")


def all_pids():
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def parent_map():
    parents = {}
    for pid in all_pids():
        stat = read(f"/proc/{pid}/stat")
        if not stat:
            continue
        # The command name may hold spaces and parentheses: fields after the last ')'.
        fields = stat[stat.rfind(")") + 2:].split()
        parents[pid] = int(fields[1])
    return parents


def descendants(roots):
    parents = parent_map()
    children = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = [], list(roots)
    while todo:
        p = todo.pop()
        for c in children.get(p, []):
            out.append(c)
            todo.append(c)
    return out


def status_field(pid, name):
    for line in read(f"/proc/{pid}/status").splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1])
    return -1


def fd_count(pid):
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


def netns_inode(pid):
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def cgroup_parents(pid):
    """Where moat puts its cgroups for a moatd of this pid (layout.cc): on
    v1, <mount of controller>/<moatd's cgroup>/moat for cpu, memory, pids; on
    pure v2, <mount>/moat."""
    parents = []
    v1 = {}
    unified = None
    for line in read("/proc/self/mountinfo").splitlines():
        left, _, right = line.partition(" - ")
        fstype = right.split()[0] if right else ""
        mount_point = left.split()[4]
        if fstype == "cgroup":
            for opt in right.split()[2].split(","):
                if opt in ("cpu", "memory", "pids"):
                    v1[opt] = mount_point
        elif fstype == "cgroup2":
            unified = mount_point
    if v1:
        where = {}
        for line in read(f"/proc/{pid}/cgroup").splitlines():
            _, controllers, path = line.split(":", 2)
            for c in controllers.split(","):
                where[c] = path
        for c, mount_point in sorted(v1.items()):
            parents.append(os.path.join(mount_point, where.get(c, "/").lstrip("/"), "moat"))
    elif unified:
        parents.append(os.path.join(unified, "moat"))
    return parents


def census(moatd, ids=(), parents=None):
    """Everything moatd holds or leaves behind, now. `ids`: environment ids
    this test knows of (their cgroup directories are counted)."""
    pid = moatd.proc.pid if moatd.proc and moatd.proc.poll() is None else None
    c = {}
    if pid:
        c["moatd_fds"] = fd_count(pid)
        c["moatd_rss_kib"] = status_field(pid, "VmRSS")
        c["moatd_threads"] = status_field(pid, "Threads")
    spawners = moatd.spawner_pids()
    c["spawners"] = len(spawners)
    if spawners:
        sp = spawners[0]
        c["spawner_fds"] = fd_count(sp)
        c["spawner_rss_kib"] = status_field(sp, "VmRSS")
    tree = descendants(spawners)
    c["env_processes"] = len(tree)
    c["env_pid1s"] = sum(1 for p in tree if read(f"/proc/{p}/comm").strip() == "moat-init")
    netns = {netns_inode(p) for p in tree} - {None}
    if spawners:
        netns.discard(netns_inode(spawners[0]))
    c["env_netns"] = len(netns)
    mountinfo = read("/proc/self/mountinfo").splitlines()
    c["host_mounts"] = len(mountinfo)
    c["state_mounts"] = sum(1 for line in mountinfo if moatd.state in line.split(" - ")[0])
    egress = os.path.join(moatd.state, "run", "egress.netns")
    c["egress_links"] = -1
    if os.path.ismount(egress):
        r = subprocess.run(["nsenter", "--net=" + egress, "ip", "-o", "link"], capture_output=True, text=True)
        if r.returncode == 0:
            c["egress_links"] = sum(1 for line in r.stdout.splitlines() if ": lo:" not in line)
    r = subprocess.run(["losetup", "-a"], capture_output=True, text=True)
    c["loop_devices"] = sum(1 for line in r.stdout.splitlines() if moatd.state + "/" in line)
    run_dir = os.path.join(moatd.state, "run")
    c["lock_files"] = len([n for n in os.listdir(run_dir) if n.endswith(".lock")]) if os.path.isdir(run_dir) else 0
    # Growing by design (reported, not expected back): the store with the
    # audit log, and the storage pool (btrfs frees deleted subvolumes' extents
    # in the background).
    c["store_kib"] = sum(os.path.getsize(os.path.join(moatd.state, n)) // 1024
                         for n in ("moat.db", "moat.db-wal") if os.path.exists(os.path.join(moatd.state, n)))
    storage = os.path.join(moatd.state, "storage")
    if os.path.ismount(storage):
        st = os.statvfs(storage)
        c["pool_used_kib"] = (st.f_blocks - st.f_bfree) * st.f_frsize // 1024
    if parents is None:
        parents = cgroup_parents(pid or os.getpid())
    names = {"moat-" + i for i in ids}
    count = 0
    for p in parents:
        try:
            count += sum(1 for n in os.listdir(p) if n in names)
        except OSError:
            pass
    c["cgroups"] = count
    return c


def list_all(moatd_or_client):
    """Every environment the store has, whatever its state: {id: record}."""
    out = {}
    for state in ("creating", "running", "destroying", "gone", "failed"):
        status, body = moatd_or_client.call("GET", "/v1/environments?state=" + state)
        if status != 200:
            raise AssertionError(f"list state={state}: {status} {body}")
        for e in body["environments"]:
            out[e["id"]] = e
    return out


def percentile(values, p):
    if not values:
        return float("nan")
    s = sorted(values)
    k = (len(s) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def nearest_rank(values, p):
    """The p-th percentile as one of the values (no interpolation): what
    the benchmarks print."""
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def expect_status(answer, want):
    """The body of `answer` (a Moatd.call's (status, body)) when its status
    is `want`; otherwise the run stops, saying what came instead."""
    status, body = answer
    if status != want:
        raise SystemExit(f"unexpected answer {status}: {body}")
    return body


def wait_until(predicate, timeout, step=0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(step)
