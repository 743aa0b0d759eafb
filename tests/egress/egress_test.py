#!/usr/bin/env python3
"""Egress control end to end (docs/EGRESS.md).

The whole test runs in a network namespace of its own (unshare at start):
its loopback carries the test "internet" (203.0.113.0/24 and 198.51.100.0/24
addresses, HTTP and HTTPS servers with a test CA) and a "host service" on
127.0.0.1. moatd runs inside it with --egress-hosts naming the test hosts
and --egress-ca-bundle trusting the test CA, so nothing here touches the
machine's own network. Environments reach those servers only through moatd's
egress proxy and resolver; every test checks what a program inside sees and,
where it matters, the audit events.

  egress_test.py --bin-dir build/bin [-k NAME]

Needs root (exits 77, CTest's "skipped", with SKIP otherwise (77, CTest's "skipped"): moatd creates namespaces).
"""

import argparse
import base64
import ctypes
import http.client
import http.server
import json
import os
import shutil
import signal
import socket
import sqlite3
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import unittest

CLONE_NEWNET = 0x40000000
API = "api.example.test"      # 203.0.113.10: HTTPS and HTTP, allowlisted by most tests
OTHER = "other.example.test"  # 203.0.113.20: same servers, never bound to a secret
API_IP, OTHER_IP, PLAIN_IP = "203.0.113.10", "203.0.113.20", "198.51.100.30"
LOOPBACK_NAME, METADATA_NAME = "private.example.test", "metadata.example.test"
HOST_SERVICE_PORT = 8099      # on 127.0.0.1 of the test namespace: must stay unreachable
SECRET_VALUE = "s3cr3t-value-that-never-enters"
BIN_DIR = None
WORLD = None


def run(argv, **kw):
    return subprocess.run(argv, check=True, capture_output=True, text=True, **kw)


def enter_private_network():
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET)")
    run(["ip", "link", "set", "lo", "up"])
    for address in (API_IP, OTHER_IP, PLAIN_IP):
        run(["ip", "addr", "add", address + "/32", "dev", "lo"])


class Echo(http.server.BaseHTTPRequestHandler):
    """Answers every request with what it received, as JSON."""
    protocol_version = "HTTP/1.1"
    server_version = "test-internet"

    def handle_any(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if self.path.startswith("/big/"):
            size = int(self.path[5:])
            self.send_response(200)
            self.send_header("Content-Length", str(size))
            self.end_headers()
            chunk = b"x" * 65536
            while size > 0:
                self.wfile.write(chunk[:min(size, len(chunk))])
                size -= min(size, len(chunk))
            return
        out = json.dumps({"server": self.server.name, "method": self.command, "path": self.path,
                          "headers": {k.lower(): v for k, v in self.headers.items()},
                          "body": body.decode("latin-1")}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST = do_PUT = do_DELETE = handle_any

    def log_message(self, *args):
        pass


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class World:
    """The test internet: a CA, servers, and the files moatd is started with."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="moat-egress-world-")
        self.servers = []
        self.udp_seen = []
        self.make_ca()
        self.hosts = os.path.join(self.dir, "hosts")
        with open(self.hosts, "w") as f:
            f.write(f"{API_IP} {API}\n{OTHER_IP} {OTHER}\n127.0.0.1 {LOOPBACK_NAME}\n"
                    f"169.254.169.254 {METADATA_NAME}\n")
        for name, address in ((API, API_IP), (OTHER, OTHER_IP)):
            self.serve(name, address, 80, None)
            self.serve(name, address, 443, self.tls)
        self.serve("plain", PLAIN_IP, 80, None)
        self.serve("host-service", "127.0.0.1", HOST_SERVICE_PORT, None)
        banner = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        banner.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        banner.bind((API_IP, 2222))
        banner.listen(16)
        threading.Thread(target=self.banner_loop, args=(banner,), daemon=True).start()
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        udp.bind((API_IP, 9999))
        threading.Thread(target=self.udp_loop, args=(udp,), daemon=True).start()

    def make_ca(self):
        d = self.dir
        ca_ext = os.path.join(d, "ca.ext")
        with open(ca_ext, "w") as f:
            f.write("basicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign,cRLSign\n")
        run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", f"{d}/ca.key", "-out", f"{d}/ca.crt", "-days", "2", "-subj", "/CN=moat test internet CA",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"])
        with open(f"{d}/leaf.ext", "w") as f:
            f.write(f"subjectAltName=DNS:{API},DNS:{OTHER},IP:{API_IP},IP:{OTHER_IP}\n"
                    "extendedKeyUsage=serverAuth\n")
        run(["openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", f"{d}/leaf.key", "-out", f"{d}/leaf.csr", "-subj", f"/CN={API}"])
        run(["openssl", "x509", "-req", "-in", f"{d}/leaf.csr", "-CA", f"{d}/ca.crt", "-CAkey", f"{d}/ca.key",
             "-CAcreateserial", "-out", f"{d}/leaf.crt", "-days", "2", "-extfile", f"{d}/leaf.ext"])
        self.ca = f"{d}/ca.crt"
        with open(self.ca) as f:
            self.ca_pem = f.read()
        self.tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.tls.load_cert_chain(f"{d}/leaf.crt", f"{d}/leaf.key")

    def serve(self, name, address, port, tls):
        server = Server((address, port), Echo)
        server.name = name
        if tls:
            server.socket = tls.wrap_socket(server.socket, server_side=True)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self.servers.append(server)

    def banner_loop(self, sock):
        # A server that speaks first, like ssh.
        while True:
            conn, _ = sock.accept()
            conn.sendall(b"SSH-2.0-test-internet\r\n")
            conn.close()

    def udp_loop(self, sock):
        while True:
            data, _ = sock.recvfrom(2048)
            self.udp_seen.append(data)


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout=120):
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


class Moatd:
    def __init__(self, bin_dir, world, extra_args=()):
        self.bin_dir = bin_dir
        self.world = world
        self.extra_args = list(extra_args)
        self.state = tempfile.mkdtemp(prefix="moatd-egress-")
        self.log_path = self.state + ".log"
        self.start()

    def start(self):
        world = self.world
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "MOAT_STORAGE_GB": "8"}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [os.path.join(self.bin_dir, "moatd"), "--state", self.state, "--listen", "127.0.0.1:0",
                 "--egress-hosts", world.hosts, "--egress-ca-bundle", world.ca, "--approval-timeout", "60", *self.extra_args],
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

    @property
    def token(self):
        with open(os.path.join(self.state, "master-token")) as f:
            return f.read().strip()

    def log(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()[-4000:]

    def call(self, method, path, body=None, token=True, timeout=120):
        conn = UnixHTTPConnection(os.path.join(self.state, "moatd.sock"), timeout=timeout)
        # token: True for the master token, a string for that token, False for none.
        headers = {"Authorization": "Bearer " + (token if isinstance(token, str) else self.token)} if token else {}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        conn.request(method, path, body=data, headers=headers)
        r = conn.getresponse()
        raw = r.read()
        conn.close()
        try:
            return r.status, json.loads(raw) if raw else None
        except ValueError:
            return r.status, raw

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def kill9(self):
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


class Env:
    """One environment; exec() runs a command in it and returns (code, out, err)."""

    def __init__(self, moatd, world, token=True, **create):
        self.moatd = moatd
        status, body = moatd.call("POST", "/v1/environments", create, token=token)
        if status != 201:
            raise AssertionError(f"create failed: {status} {body}")
        self.id = body["id"]
        self.body = body
        if create.get("network", "none") != "none":
            self.trust(world)

    def trust(self, world):
        # The test internet's CA is one more public CA to this environment.
        for path in ("/etc/moat/ca-bundle.crt", "/etc/moat/ca.crt"):
            self.sh(f"cat >> {path} <<'EOF'\n{world.ca_pem}EOF")

    def exec(self, argv, timeout_ms=30000, stdin=None):
        body = {"cmd": argv, "timeout_ms": timeout_ms}
        if stdin is not None:
            body["stdin"] = stdin
        status, r = self.moatd.call("POST", f"/v1/environments/{self.id}/exec", body)
        if status != 200:
            raise AssertionError(f"exec failed: {status} {r}")
        return r["exit_code"], r["stdout"], r["stderr"]

    def sh(self, script, timeout_ms=30000):
        return self.exec(["sh", "-c", script], timeout_ms)

    def python(self, code, timeout_ms=30000):
        return self.exec(["python3", "-c", code], timeout_ms)

    def set_network(self, network):
        return self.moatd.call("PUT", f"/v1/environments/{self.id}/network", {"network": network})

    def destroy(self):
        self.moatd.call("DELETE", f"/v1/environments/{self.id}")


def allow(*hosts, **extra):
    return dict({"mode": "allowlist", "allow": list(hosts)}, **extra)


class MoatdCase(unittest.TestCase):
    """One moatd for the class (started with `moatd_args`), the
    environments a test makes destroyed after it, and the audit events
    of one. No tests of its own: egress_microvm_test.py's cases are
    made of it too."""
    moatd = None
    moatd_args = ()

    @classmethod
    def setUpClass(cls):
        cls.moatd = Moatd(BIN_DIR, WORLD, cls.moatd_args)

    @classmethod
    def tearDownClass(cls):
        if cls.moatd:
            cls.moatd.stop()
            cls.moatd.remove()

    def setUp(self):
        self.envs = []

    def tearDown(self):
        for e in self.envs:
            e.destroy()

    def env(self, **create):
        e = Env(self.moatd, WORLD, **create)
        self.envs.append(e)
        return e

    def events(self, env, type_=None):
        status, body = self.moatd.call("GET", f"/v1/events?environment={env.id}")
        self.assertEqual(status, 200, body)
        text = body.decode() if isinstance(body, bytes) else json.dumps(body)
        events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
        return [e for e in events if type_ is None or e["type"] == type_]

    def wait_event(self, env, type_, predicate, timeout=10):
        deadline = time.monotonic() + timeout
        while True:
            found = [e for e in self.events(env, type_) if predicate(e["data"])]
            if found or time.monotonic() > deadline:
                return found
            time.sleep(0.05)


class EgressTest(MoatdCase):
    def curl(self, env, *args):
        return env.exec(["curl", "-sS", "-m", "10", *args])

    # --- mode none -------------------------------------------------------

    def test_mode_none_has_nothing(self):
        e = self.env()
        self.assertEqual(e.body["network"], "none")
        code, _, err = self.curl(e, f"http://{API_IP}/")
        self.assertNotEqual(code, 0)
        code, out, _ = e.python(
            "import socket\ntry:\n socket.create_connection(('%s', 80), timeout=3)\n print('connected')\n"
            "except OSError as x:\n print(x.errno)" % API_IP)
        self.assertNotIn("connected", out)
        code, out, _ = e.sh(f"getent hosts {API} || echo unresolved")
        self.assertIn("unresolved", out)

    # --- allowed hosts ---------------------------------------------------

    def test_allowed_host_with_curl_over_https(self):
        e = self.env(network=allow(API))
        code, out, err = self.curl(e, f"https://{API}/hello")
        self.assertEqual(code, 0, err)
        self.assertEqual(json.loads(out)["server"], API)
        allowed = self.wait_event(e, "egress.allowed", lambda d: d.get("host") == API)
        self.assertTrue(allowed, "no egress.allowed event")
        self.assertGreater(allowed[0]["data"]["bytes_down"], 0)

    def test_allowed_host_with_python_urllib(self):
        e = self.env(network=allow(API))
        code, out, err = e.python(
            f"import urllib.request, json\nprint(json.load(urllib.request.urlopen('https://{API}/py'))['path'])")
        self.assertEqual(code, 0, err)
        self.assertEqual(out.strip(), "/py")

    def test_allowed_host_with_node_fetch(self):
        if not os.path.exists("/usr/bin/node"):
            self.skipTest("node is not installed on this host")
        e = self.env(network=allow(API))
        # Node's fetch ignores proxy variables: it resolves through moat's
        # resolver and connects to the address; interception takes it.
        code, out, err = e.exec(["node", "-e", f"fetch('https://{API}/node').then(r => r.json())"
                                 ".then(j => console.log(j.path)).catch(e => {{ console.error(e); process.exit(3) }})"])
        self.assertEqual(code, 0, err)
        self.assertEqual(out.strip(), "/node")

    def test_plain_http_through_the_proxy_and_directly(self):
        e = self.env(network=allow(API))
        code, out, err = self.curl(e, f"http://{API}/plain")
        self.assertEqual(code, 0, err)
        self.assertEqual(json.loads(out)["path"], "/plain")
        code, out, err = self.curl(e, "--noproxy", "*", f"http://{API}/direct")
        self.assertEqual(code, 0, err)
        self.assertEqual(json.loads(out)["path"], "/direct")

    # --- refused ---------------------------------------------------------

    def test_host_off_the_allowlist_is_refused_and_audited(self):
        e = self.env(network=allow(API))
        code, out, err = self.curl(e, f"https://{OTHER}/")
        self.assertNotEqual(code, 0)
        self.assertIn("403", err)
        code, out, err = self.curl(e, "--noproxy", "*", f"https://{OTHER}/")
        self.assertNotEqual(code, 0)
        denied = self.wait_event(e, "egress.denied", lambda d: d.get("host") == OTHER)
        self.assertTrue(denied)
        self.assertIn("not on the allowlist", json.dumps(denied))

    def test_direct_ip_is_refused(self):
        e = self.env(network=allow(API))
        for args in ([f"https://{API_IP}/"], ["--noproxy", "*", "-k", f"https://{API_IP}/"],
                     [f"http://{PLAIN_IP}/"], ["--noproxy", "*", f"http://{PLAIN_IP}/"]):
            code, out, err = self.curl(e, *args)
            self.assertTrue(code != 0 or out.startswith("moat:"), f"{args}: {out}")
            self.assertNotIn('"server"', out)

    def test_connect_to_an_ip_is_refused(self):
        e = self.env(network=allow(API))
        code, out, err = e.python(
            "import socket,os\nhost,port=os.environ['HTTP_PROXY'][7:].split(':')\n"
            "s=socket.create_connection((host,int(port)),timeout=5)\n"
            f"s.sendall(b'CONNECT {API_IP}:443 HTTP/1.1\\r\\nHost: {API_IP}:443\\r\\n\\r\\n')\n"
            "print(s.recv(200).decode().splitlines()[0])")
        self.assertEqual(code, 0, err)
        self.assertIn("403", out)

    def test_sni_that_differs_from_the_connect_target_is_refused(self):
        e = self.env(network=allow(API, OTHER))
        code, out, err = e.python(
            "import socket,ssl,os\nhost,port=os.environ['HTTP_PROXY'][7:].split(':')\n"
            "s=socket.create_connection((host,int(port)),timeout=5)\n"
            f"s.sendall(b'CONNECT {API}:443 HTTP/1.1\\r\\nHost: {API}:443\\r\\n\\r\\n')\n"
            "assert b' 200 ' in s.recv(200)\n"
            "ctx=ssl.create_default_context()\n"
            "try:\n"
            f" t=ctx.wrap_socket(s, server_hostname='{OTHER}')\n"
            " print('handshake done')\n"
            "except (OSError, ssl.SSLError) as x:\n print('refused', x)")
        self.assertEqual(code, 0, err)
        self.assertIn("refused", out)
        denied = self.wait_event(e, "egress.denied", lambda d: d.get("rule") == "sni")
        self.assertTrue(denied)

    def test_host_header_smuggling_is_refused(self):
        e = self.env(network=allow(API))
        # Through the proxy: URL says one host, Host header another.
        code, out, err = self.curl(e, "-H", f"Host: {OTHER}", f"http://{API}/smuggle")
        self.assertNotIn(OTHER, out.split('"server"')[-1] if '"server"' in out else "")
        self.assertIn("moat:", out)
        # Directly: resolved as the allowed host, Host header names another.
        code, out, err = self.curl(e, "--noproxy", "*", "-H", f"Host: {OTHER}", f"http://{API}/smuggle")
        self.assertIn("moat:", out)
        self.assertNotIn('"server"', out)
        # Two Host headers.
        code, out, err = e.python(
            "import socket\n"
            f"s=socket.create_connection(('{API}',80),timeout=5)\n"
            f"s.sendall(b'GET / HTTP/1.1\\r\\nHost: {API}\\r\\nHost: {OTHER}\\r\\n\\r\\n')\n"
            "print(s.recv(300).decode().splitlines()[0])")
        self.assertIn("400", out)

    def test_ipv6_udp_and_icmp_go_nowhere(self):
        e = self.env(network=allow(API))
        code, out, err = e.python(
            "import socket,errno\n"
            "s=socket.socket(socket.AF_INET6, socket.SOCK_STREAM)\ns.settimeout(3)\n"
            "try:\n s.connect(('2001:db8::1', 443)); print('v6 connected')\n"
            "except OSError as x: print('v6', x.errno)\n"
            f"u=socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\nu.settimeout(3)\nu.connect(('{API_IP}', 9999))\n"
            "try:\n u.send(b'leak'); u.recv(10); print('udp answered')\n"
            "except OSError as x: print('udp', type(x).__name__)\n"
            "for kind in (socket.SOCK_RAW, socket.SOCK_DGRAM):\n"
            " try:\n  i=socket.socket(socket.AF_INET, kind, socket.IPPROTO_ICMP); i.settimeout(2)\n"
            f"  i.sendto(b'\\x08\\x00\\xf7\\xff\\x00\\x00\\x00\\x00', ('{API_IP}', 0)); i.recv(100); print('icmp answered')\n"
            " except OSError as x: print('icmp', type(x).__name__)\n")
        self.assertEqual(code, 0, err)
        self.assertNotIn("v6 connected", out)
        self.assertNotIn("udp answered", out)
        self.assertNotIn("icmp answered", out)
        self.assertEqual(WORLD.udp_seen, [])

    def test_dns_answers_only_allowlisted_names(self):
        e = self.env(network=allow(API))
        code, out, err = e.python(
            "import socket\n"
            f"print(socket.gethostbyname('{API}'))\n"
            "for n in ('random-7f3a.example.test', 'exfil-deadbeef.attacker.test', '%s'):\n"
            " try:\n  print('resolved', n, socket.gethostbyname(n))\n"
            " except OSError as x:\n  print('refused', n)" % OTHER)
        self.assertEqual(code, 0, err)
        self.assertIn(API_IP, out)
        self.assertNotIn("resolved", out)
        denied = self.wait_event(e, "egress.denied", lambda d: d.get("via") == "dns" and "attacker" in d.get("host", ""))
        self.assertTrue(denied)

    def test_names_pointing_at_loopback_or_metadata_are_refused(self):
        e = self.env(network=allow(API, LOOPBACK_NAME, METADATA_NAME))
        for name in (LOOPBACK_NAME, METADATA_NAME):
            code, out, err = e.sh(f"getent hosts {name} || echo unresolved")
            self.assertIn("unresolved", out, name)
            code, out, err = self.curl(e, f"http://{name}:{HOST_SERVICE_PORT}/")
            self.assertTrue(code != 0 or out.startswith("moat:"), out)
            self.assertNotIn("host-service", out)
        denied = self.wait_event(e, "egress.denied", lambda d: "special address" in d.get("rule", ""))
        self.assertTrue(denied)

    def test_host_services_on_loopback_are_unreachable(self):
        # The host service listens on 127.0.0.1 of moatd's namespace; "plain"
        # on PLAIN_IP:80, an address of moatd's host that no --egress-hosts
        # line names. Open mode allows every other destination.
        e = self.env(network={"mode": "open"})
        proxy = e.exec(["printenv", "HTTP_PROXY"])[1].strip()
        for url in (f"http://127.0.0.1:{HOST_SERVICE_PORT}/", f"http://localhost:{HOST_SERVICE_PORT}/"):
            # --noproxy "": the environment's NO_PROXY names these, and curl
            # would go to the environment's own loopback instead.
            code, out, err = self.curl(e, "--noproxy", "", "--proxy", proxy, url)
            self.assertNotIn("host-service", out)
            self.assertTrue(out.startswith("moat:"), f"{url} through the proxy: {code} {out} {err}")
            code, out, err = self.curl(e, "--noproxy", "", "--proxy", proxy, "--proxytunnel", url)
            self.assertNotIn("host-service", out)
            self.assertIn("CONNECT tunnel failed, response 403", err, f"{url} through a tunnel: {code} {out}")
        # Directly: the transparent listener takes it, and the address decides.
        code, out, err = self.curl(e, "--noproxy", "*", f"http://{PLAIN_IP}/")
        self.assertNotIn('"server"', out)
        self.assertIn("address of moatd's host", out, err)
        # What open mode allows answers on the same way.
        code, out, err = self.curl(e, "--noproxy", "*", f"http://{API}/")
        self.assertEqual(code, 0, err)
        self.assertEqual(json.loads(out)["server"], API)

    # --- secrets ---------------------------------------------------------

    def secret_env(self, *hosts):
        return self.env(network=allow(*hosts), secrets=[
            {"name": "API_TOKEN", "value": SECRET_VALUE, "hosts": [API], "header": "Authorization: Bearer {value}"}])

    def test_secret_is_injected_for_its_host_only(self):
        e = self.secret_env(API, OTHER)
        placeholder = e.exec(["printenv", "API_TOKEN"])[1].strip()
        self.assertTrue(placeholder.startswith("moat-secret-"), placeholder)
        code, out, err = e.sh(f'curl -sS -m 10 -H "X-Token: $API_TOKEN" https://{API}/echo')
        self.assertEqual(code, 0, err)
        seen = json.loads(out)["headers"]
        self.assertEqual(seen["x-token"], SECRET_VALUE)
        self.assertEqual(seen["authorization"], "Bearer " + SECRET_VALUE)
        # Another host gets neither the value nor the placeholder.
        for url in (f"https://{OTHER}/leak", f"http://{OTHER}/leak"):
            code, out, err = e.sh(f'curl -sS -m 10 -H "X-Token: $API_TOKEN" {url}')
            self.assertNotIn(SECRET_VALUE, out)
            self.assertNotIn('"server"', out)
            self.assertIn("moat:", out)
        blocked = self.wait_event(e, "egress.denied", lambda d: d.get("secret") == "API_TOKEN")
        self.assertTrue(blocked)

    def test_secret_value_never_enters_the_environment(self):
        e = self.secret_env(API)
        # The command must not carry the value itself: it is rebuilt inside.
        encoded = base64.b64encode(SECRET_VALUE.encode()).decode()
        code, out, err = e.sh(
            f'v=$(echo {encoded} | base64 -d); grep -rl "$v" /etc /workspace /tmp /proc/self/environ '
            '/proc/1/environ 2>/dev/null && echo FOUND; env; cat /proc/self/cmdline')
        self.assertNotIn("FOUND", out)
        self.assertNotIn(SECRET_VALUE, out + err)
        status, body = self.moatd.call("GET", f"/v1/environments/{e.id}")
        self.assertNotIn(SECRET_VALUE, json.dumps(body))
        self.assertEqual(body["secrets"][0]["name"], "API_TOKEN")
        with open(self.moatd.log_path, errors="replace") as f:
            self.assertNotIn(SECRET_VALUE, f.read())
        events = json.dumps(self.events(e))
        self.assertNotIn(SECRET_VALUE, events)

    # --- rules and changes -----------------------------------------------

    def test_method_and_path_rules(self):
        e = self.env(network={"mode": "allowlist",
                              "allow": [{"host": API, "methods": ["GET"], "paths": ["/repos/**"]}]})
        code, out, err = self.curl(e, f"https://{API}/repos/moat/issues")
        self.assertEqual(code, 0, err)
        self.assertEqual(json.loads(out)["path"], "/repos/moat/issues")
        code, out, err = self.curl(e, "-X", "POST", f"https://{API}/repos/moat/issues")
        self.assertIn("moat:", out)
        code, out, err = self.curl(e, f"https://{API}/admin")
        self.assertIn("moat:", out)
        # --path-as-is: curl would resolve the ".." itself and send /admin.
        code, out, err = self.curl(e, "--path-as-is", f"https://{API}/repos/../admin")
        self.assertNotIn('"server"', out)
        self.assertIn("moat:", out)
        # The same way, a ".." that stays under /repos/ reaches the server as it was written.
        code, out, err = self.curl(e, "--path-as-is", f"https://{API}/repos/x/../moat")
        self.assertEqual(code, 0, err)
        self.assertEqual(json.loads(out)["path"], "/repos/x/../moat")

    def test_a_refused_upload_still_gets_its_reason(self):
        # The proxy refuses after the head, with the body still on its way:
        # closing with it unread would reset the connection under a client
        # that is still sending, and the reason would be lost. ("Expect:" off:
        # curl would otherwise wait for an answer before sending the body.)
        e = self.env(network={"mode": "allowlist", "allow": [{"host": API, "methods": ["GET"]}]})
        code, _, err = e.sh("head -c 8000000 /dev/zero > /tmp/upload")
        self.assertEqual(code, 0, err)
        for url in (f"http://{OTHER}/upload", f"http://{API}/upload", f"https://{API}/upload"):
            for attempt in range(3):
                code, out, err = self.curl(e, "-X", "POST", "-H", "Expect:", "-H", "Content-Type: application/octet-stream",
                                           "--data-binary", "@/tmp/upload", "-w", "\n%{http_code}", url)
                self.assertEqual(code, 0, f"{url}, attempt {attempt}: curl failed: {err}")
                self.assertIn("moat:", out, url)
                self.assertTrue(out.endswith("\n403"), f"{url}: {out}")
            # Python's urllib sends the whole body before it reads an answer.
            code, out, err = e.python(
                "import urllib.request, urllib.error\n"
                f"r = urllib.request.Request('{url}', data=open('/tmp/upload', 'rb').read(), method='POST')\n"
                "try:\n    urllib.request.urlopen(r, timeout=10)\n"
                "except urllib.error.HTTPError as e:\n    print(e.code, e.read().decode().strip())")
            self.assertEqual(code, 0, f"{url}: {err}")
            self.assertTrue(out.startswith("403 moat:"), f"{url}: {out}")

    def test_allowlist_changes_apply_to_new_connections(self):
        e = self.env(network=allow(API))
        self.assertNotEqual(self.curl(e, f"https://{OTHER}/")[0], 0)
        status, body = e.set_network(allow(API, OTHER))
        self.assertEqual(status, 200, body)
        code, out, err = self.curl(e, f"https://{OTHER}/now")
        self.assertEqual(code, 0, err)
        status, body = e.set_network(allow(API))
        self.assertNotEqual(self.curl(e, f"https://{OTHER}/")[0], 0)

    def test_mode_changes_on_a_running_environment(self):
        e = self.env()
        self.assertNotEqual(self.curl(e, f"http://{API}/")[0], 0)
        status, body = e.set_network(allow(API))
        self.assertEqual(status, 200, body)
        self.assertIn("link", body)
        e.trust(WORLD)
        code, out, err = self.curl(e, f"https://{API}/on")
        self.assertEqual(code, 0, err)
        status, body = e.set_network("none")
        self.assertEqual(status, 200, body)
        self.assertNotEqual(e.exec(["curl", "-sS", "-m", "5", "--noproxy", "*", f"http://{API_IP}/"])[0], 0)

    def pending_approvals(self, e):
        """Waits (up to 20 s) for the environment's first pending approval."""
        deadline = time.monotonic() + 20
        pending = []
        while not pending and time.monotonic() < deadline:
            status, body = self.moatd.call("GET", f"/v1/approvals?state=pending&environment={e.id}")
            pending = body["approvals"]
            time.sleep(0.05)
        self.assertTrue(pending, "no approval was requested")
        return pending

    def process_end(self, e, pid):
        """The process as it exited; fails if it has not within 30 s."""
        status, body = self.moatd.call("GET", f"/v1/environments/{e.id}/processes/{pid}")
        deadline = time.monotonic() + 30
        while body.get("state") in ("starting", "running") and time.monotonic() < deadline:
            status, body = self.moatd.call("GET", f"/v1/environments/{e.id}/processes/{pid}")
            time.sleep(0.05)
        self.assertEqual(body.get("state"), "exited", f"process {pid}: {status} {body}")
        return body

    def key(self, scopes, ceiling=None):
        body = {"name": "agent", "scopes": scopes}
        if ceiling is not None:
            body["permissions"] = ceiling
        status, body = self.moatd.call("POST", "/v1/keys", body)
        self.assertEqual(status, 201, body)
        return body["token"]

    def test_a_keys_ceiling_holds_for_its_environments_connections(self):
        # The key's environments can never do more than its ceiling allows,
        # whatever policy and permissions it creates them with: listed
        # destinations, open mode and unlisted ones alike.
        agent = self.key(["create", "read", "exec"],
                         {"network": [{"host": API, "action": "allow"}, {"action": "deny"}]})
        opened = self.env(token=agent, network="open", permissions={"network": "allow"})
        self.assertEqual(self.curl(opened, f"https://{API}/in-ceiling")[0], 0)
        code, out, err = self.curl(opened, f"https://{OTHER}/open-mode")
        self.assertNotEqual(code, 0, out)
        listed = self.env(token=agent, network=allow(OTHER), permissions={"network": "allow"})
        self.assertNotEqual(self.curl(listed, f"https://{OTHER}/listed")[0], 0)
        unlisted = self.env(token=agent, network=allow(), permissions={"network": "allow"})
        self.assertNotEqual(self.curl(unlisted, f"https://{OTHER}/unlisted")[0], 0)
        self.assertEqual(self.curl(unlisted, f"https://{API}/unlisted-in-ceiling")[0], 0)
        # Nor does the name go upstream: the resolver refuses it too.
        self.assertNotEqual(opened.exec(["getent", "hosts", OTHER])[0], 0)
        self.assertEqual(opened.exec(["getent", "hosts", API])[0], 0)
        refused = [e["data"] for e in self.events(opened) if e["data"].get("rule") == "ceiling"]
        self.assertTrue(refused, self.events(opened))
        self.assertIn("ceiling of the API key", json.dumps(refused))
        # The same policy made by the master (no ceiling) reaches OTHER.
        mine = self.env(network="open")
        self.assertEqual(self.curl(mine, f"https://{OTHER}/master")[0], 0)

    def test_a_key_cannot_approve_its_own_environments_connections(self):
        agent = self.key(["create", "read", "exec", "approve"])
        e = self.env(token=agent, network=allow(), permissions={"network": "ask"})
        status, body = self.moatd.call(
            "POST", f"/v1/environments/{e.id}/processes",
            {"cmd": ["curl", "-sS", "-m", "50", f"https://{OTHER}/self-approved"]}, token=agent)
        self.assertEqual(status, 201, body)
        pid = body["id"]
        pending = self.pending_approvals(e)
        approval = pending[0]["id"]
        status, body = self.moatd.call("POST", f"/v1/approvals/{approval}", {"decision": "approve", "remember": True},
                                       token=agent)
        self.assertEqual(status, 403, body)
        self.assertIn("environments it created", body["error"]["message"])
        status, body = self.moatd.call("POST", f"/v1/approvals/{approval}", {"decision": "deny"})
        self.assertEqual(status, 200, body)
        body = self.process_end(e, pid)
        self.assertNotIn(body.get("exit_code"), (None, 0), body)

    def test_refusals_an_environment_causes_keep_to_its_share_of_the_log(self):
        """Ten threads inside, each asking the proxy for host after host the
        gate denies: the gate's refusals were recorded one by one (~1,400 a
        second, so a million events in 12 minutes pushed every other
        environment's history out). They are paced now, the rest counted."""
        e = self.env(network=allow(), permissions={"network": "deny"})
        flood = (
            "import os, socket, threading, time, urllib.parse\n"
            "proxy = urllib.parse.urlparse(os.environ['HTTPS_PROXY'])\n"
            "count = [0]\n"
            "def run(t):\n"
            "    end = time.monotonic() + 3\n"
            "    i = 0\n"
            "    while time.monotonic() < end:\n"
            "        s = socket.create_connection((proxy.hostname, proxy.port))\n"
            "        s.sendall(f'CONNECT h{t}-{i}.flood.test:443 HTTP/1.1\\r\\n\\r\\n'.encode())\n"
            "        s.recv(4096)\n"
            "        s.close()\n"
            "        i += 1\n"
            "    count[0] += i\n"
            "threads = [threading.Thread(target=run, args=(t,)) for t in range(10)]\n"
            "[t.start() for t in threads]\n"
            "[t.join() for t in threads]\n"
            "print(count[0])\n")
        code, out, err = e.python(flood, timeout_ms=60000)
        self.assertEqual(code, 0, err)
        attempts = int(out)
        self.assertGreater(attempts, 1000, "too few attempts to flood anything")
        denied = self.wait_event(e, "gate.denied", lambda d: d.get("suppressed", 0) > 0, timeout=5) or []
        gate = self.events(e, "gate.denied")
        # The pace: a burst of 100 and 20 a second (the 3 s and the reading).
        self.assertLessEqual(len(gate), 100 + 20 * 10, f"{len(gate)} gate.denied for {attempts} attempts")
        e.destroy()
        self.envs.remove(e)
        summaries = self.wait_event(e, "audit.summarized", lambda d: "gate.denied" in d.get("counts", {}))
        counted = sum(ev["data"].get("suppressed", 0) for ev in gate) + \
            sum(s["data"]["counts"]["gate.denied"] for s in summaries)
        self.assertEqual(len(gate) + counted, attempts, "every refusal kept or counted")

    def test_an_environment_asks_at_most_16_network_questions_at_once(self):
        e = self.env(network=allow(), permissions={"network": "ask"})
        asker = (
            "import os, socket, threading, urllib.parse\n"
            "proxy = urllib.parse.urlparse(os.environ['HTTPS_PROXY'])\n"
            "def ask(i):\n"
            "    s = socket.create_connection((proxy.hostname, proxy.port))\n"
            "    s.sendall(f'CONNECT q{i}.ask.test:443 HTTP/1.1\\r\\n\\r\\n'.encode())\n"
            "    s.recv(4096)\n"
            "for i in range(24): threading.Thread(target=ask, args=(i,), daemon=True).start()\n"
            "import time; time.sleep(600)\n")
        status, body = self.moatd.call("POST", f"/v1/environments/{e.id}/processes", {"cmd": ["python3", "-c", asker]})
        self.assertEqual(status, 201, body)
        refused = self.wait_event(e, "gate.denied", lambda d: "already wait for a person" in d.get("reason", ""),
                                  timeout=20)
        self.assertTrue(refused, "no question was refused")
        status, body = self.moatd.call("GET", f"/v1/approvals?state=pending&environment={e.id}")
        self.assertEqual(len(body["approvals"]), 16, body)

    def test_network_ask_waits_for_a_person(self):
        e = self.env(network={"mode": "allowlist", "allow": []}, permissions={"network": "ask"})
        status, body = self.moatd.call(
            "POST", f"/v1/environments/{e.id}/processes",
            {"cmd": ["curl", "-sS", "-m", "50", f"https://{OTHER}/asked"]})
        self.assertEqual(status, 201, body)
        pid = body["id"]
        pending = self.pending_approvals(e)
        self.assertEqual(pending[0]["action"]["host"], OTHER)
        status, body = self.moatd.call("POST", f"/v1/approvals/{pending[0]['id']}", {"decision": "approve"})
        self.assertEqual(status, 200, body)
        body = self.process_end(e, pid)
        self.assertEqual(body.get("exit_code"), 0, body)

    def test_connection_limit(self):
        # Two connections held open, each known to the proxy (it answered a
        # request on it); the third is refused at once with a 503, before it
        # sends anything; once the two are closed, a new one is served.
        e = self.env(network=allow(API, max_connections=2))
        code, out, err = e.python(
            "import socket,os,time\nhost,port=os.environ['HTTP_PROXY'][7:].split(':')\n"
            f"get=b'GET http://{API}/ HTTP/1.1\\r\\nHost: {API}\\r\\n\\r\\n'\n"
            "def first_line(s):\n"
            " data=b''\n"
            " while b'\\r\\n' not in data:\n"
            "  d=s.recv(100)\n"
            "  if not d: return 'closed'\n"
            "  data+=d\n"
            " return data.split(b'\\r\\n')[0].decode()\n"
            "held=[socket.create_connection((host,int(port)),timeout=5) for _ in range(2)]\n"
            "for s in held: s.sendall(get); print('held', first_line(s))\n"
            "s=socket.create_connection((host,int(port)),timeout=5)\n"
            "print('third', first_line(s))\n"
            "for s in held: s.close()\n"
            "deadline=time.monotonic()+10\n"
            "while True:\n"
            " s=socket.create_connection((host,int(port)),timeout=5)\n"
            " s.sendall(get); line=first_line(s)\n"
            " if ' 503 ' not in line or time.monotonic()>deadline: break\n"
            " time.sleep(0.05)\n"
            "print('after', line)")
        self.assertEqual(code, 0, err)
        self.assertEqual(out.splitlines(), ["held HTTP/1.1 200 OK", "held HTTP/1.1 200 OK",
                                            "third HTTP/1.1 503 Service Unavailable", "after HTTP/1.1 200 OK"], out)

    def test_open_mode_relays_other_protocols_through_connect(self):
        script = ("import socket,os\nhost,port=os.environ['HTTP_PROXY'][7:].split(':')\n"
                  "s=socket.create_connection((host,int(port)),timeout=5)\n"
                  f"s.sendall(b'CONNECT {API}:2222 HTTP/1.1\\r\\nHost: {API}:2222\\r\\n\\r\\n')\n"
                  "head=s.recv(39)\nprint(head.split(b'\\r\\n')[0].decode())\n"
                  "s.settimeout(3)\n"
                  "try:\n print(s.recv(100).decode().strip() or 'closed')\n"
                  "except OSError:\n print('no banner')")
        e = self.env(network={"mode": "open"})
        code, out, err = e.python(script)
        self.assertEqual(code, 0, err)
        self.assertIn("SSH-2.0-test-internet", out)
        raw = self.wait_event(e, "egress.allowed", lambda d: d.get("via") == "connect-raw")
        self.assertTrue(raw)
        # An allowlist lets only TLS through a tunnel.
        e2 = self.env(network=allow(API))
        code, out, err = e2.python(script)
        self.assertNotIn("SSH-2.0", out)

    def test_bandwidth_limit_holds(self):
        # 8 Mbit/s is 1 MB/s: 3 MB cannot arrive in much less than 3 s (the
        # bucket starts empty; allow for a second of burst). A lower bound
        # only: a slow machine makes it slower, never faster.
        e = self.env(network=allow(API, bandwidth_mbps=8))
        code, out, err = e.sh(f"curl -sS -m 60 -o /dev/null -w '%{{size_download}} %{{time_total}}' "
                              f"http://{API}/big/3000000")
        self.assertEqual(code, 0, err)
        size, seconds = out.split()
        self.assertEqual(int(size), 3000000)
        self.assertGreater(float(seconds), 1.8, "the download beat the bandwidth limit")

    def test_bad_policies_are_refused_with_the_field(self):
        for network, field in (({"mode": "sometimes"}, "network.mode"),
                               ({"allow": ["[::1]:80"]}, "network.allow[0]"),
                               ({"allow": [{"host": API, "verbs": ["GET"]}]}, "network.allow[0].verbs"),
                               ({"allow": ["10.0.0.0/33"]}, "network.allow[0]")):
            status, body = self.moatd.call("POST", "/v1/environments", {"network": network})
            self.assertEqual(status, 400, body)
            self.assertEqual(body["error"]["field"], field, body)
        status, body = self.moatd.call("POST", "/v1/environments", {
            "secrets": [{"name": "X", "value": "v", "hosts": ["*"]}]})
        self.assertEqual(status, 400, body)

    def test_links_go_with_their_environments(self):
        e = self.env(network=allow(API))
        netns = os.path.join(self.moatd.state, "run", "egress.netns")
        links = run(["nsenter", "--net=" + netns, "ip", "-o", "link"]).stdout
        self.assertIn("mx", links)
        e.destroy()
        self.envs.remove(e)
        deadline = time.monotonic() + 10
        while "mx" in links and time.monotonic() < deadline:
            time.sleep(0.05)
            links = run(["nsenter", "--net=" + netns, "ip", "-o", "link"]).stdout
        self.assertNotIn("mx", links)


class EgressRestartTest(unittest.TestCase):
    """A moatd of its own: killed and restarted, then stopped."""

    def test_links_and_secrets_survive_a_moatd_crash_and_go_at_stop(self):
        moatd = Moatd(BIN_DIR, WORLD)
        try:
            e = Env(moatd, WORLD, network=allow(API), secrets=[
                {"name": "API_TOKEN", "value": SECRET_VALUE, "hosts": [API], "header": "X-Key: {value}"}])
            code, out, err = e.exec(["curl", "-sS", "-m", "10", f"https://{API}/before"])
            self.assertEqual(code, 0, err)
            moatd.kill9()
            netns = os.path.join(moatd.state, "run", "egress.netns")
            self.assertTrue(os.path.exists(netns), "the egress namespace went with moatd")
            moatd.start()
            code, out, err = e.exec(["curl", "-sS", "-m", "10", f"https://{API}/after"])
            self.assertEqual(code, 0, err)
            self.assertEqual(json.loads(out)["headers"]["x-key"], SECRET_VALUE)
            self.assertNotEqual(e.exec(["curl", "-sS", "-m", "10", f"https://{OTHER}/"])[0], 0)
        finally:
            moatd.stop()
        self.assertFalse(os.path.exists(os.path.join(moatd.state, "run", "egress.netns")),
                         "an orderly stop leaves the egress namespace behind")
        with open("/proc/self/mountinfo") as f:
            mounts = [line for line in f if moatd.state in line]
        moatd.remove()
        # The storage pool (and the skeletons tmpfs in it) stays mounted by
        # design; nothing else may.
        self.assertEqual([m for m in mounts if not m.split()[4].endswith(("/storage", "/storage/skeletons"))], [])


    def test_a_slot_two_records_name_is_relinked_for_both(self):
        """What a moatd killed between freeing a link's slot and storing so
        could leave: two records naming one slot. Neither is adopted (which
        namespace holds the device is not known): both are relinked, and each
        environment is judged by its own policy."""
        moatd = Moatd(BIN_DIR, WORLD)
        try:
            a = Env(moatd, WORLD, network=allow(API))
            b = Env(moatd, WORLD, network=allow(OTHER))
            moatd.kill9()
            db = sqlite3.connect(os.path.join(moatd.state, "moat.db"))
            with db:
                (slot,) = db.execute("SELECT net_slot FROM environments WHERE id = ?", (a.id,)).fetchone()
                self.assertGreaterEqual(slot, 0)
                db.execute("UPDATE environments SET net_slot = ? WHERE id = ?", (slot, b.id))
            db.close()
            moatd.start()
            for env, mine, theirs in ((a, API, OTHER), (b, OTHER, API)):
                env.trust(WORLD)  # a relink writes moatd's CA files afresh
                code, out, err = env.exec(["curl", "-sS", "-m", "10", f"https://{mine}/"])
                self.assertEqual(code, 0, f"{env.id} to {mine}: {err}")
                code, out, err = env.exec(["curl", "-sS", "-m", "10", f"https://{theirs}/"])
                self.assertNotEqual(code, 0, f"{env.id} reached {theirs} under the other's policy")
        finally:
            moatd.stop()
            moatd.remove()


def main(prepare_world=None):
    """Runs the unittest cases of __main__ in a test internet of their own
    (`prepare_world(world)` may add to it first); egress_abuse_test.py too."""
    global BIN_DIR, WORLD
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin-dir", required=True)
    args, rest = parser.parse_known_args()
    if os.geteuid() != 0:
        print("SKIP: egress tests need root (moatd creates namespaces)")
        return 77  # CTest's "skipped" (SKIP_RETURN_CODE), not a pass
    for tool in ("ip", "openssl", "nsenter"):
        if not shutil.which(tool):
            print(f"FAIL: {tool} is missing (scripts/install-deps.sh installs it)")
            return 1
    BIN_DIR = os.path.abspath(args.bin_dir)
    enter_private_network()
    WORLD = World()
    try:
        if prepare_world:
            prepare_world(WORLD)
        result = unittest.main(argv=[sys.argv[0], "-v", *rest], exit=False).result
    finally:
        shutil.rmtree(WORLD.dir, ignore_errors=True)  # its CA key, certificates, hosts file
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
