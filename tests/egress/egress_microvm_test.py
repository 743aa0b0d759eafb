#!/usr/bin/env python3
"""Egress control for microVM environments (docs/MICROVM.md, "Network").

The same test internet as egress_test.py (its own network namespace, test
hosts on its loopback, moatd inside it). Each environment here is a microVM
(TCG) on a busybox-static template: the guest's NIC is on QEMU's user-mode
network, and QEMU's connections leave from QEMU's own network namespace,
where moatd links the environment's egress veth when it has a policy. What a
program in the guest sees is asserted with busybox's wget, nslookup and nc:
allowlisted hosts answer through the proxy and directly, nothing else does,
mode changes on a running guest take effect, two guests with the same guest
address keep to their own policies, and no link outlives its environment.

  egress_microvm_test.py --bin-dir build/bin [-k NAME]

Needs root (exits 77, CTest's "skipped", with SKIP otherwise), QEMU, a guest
kernel and busybox-static (make deps installs them: their absence fails).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "support"))
import busybox_tree as busybox  # noqa: E402
import egress_test as base  # noqa: E402
from egress_test import (API, API_IP, HOST_SERVICE_PORT, LOOPBACK_NAME, OTHER, OTHER_IP, PLAIN_IP,  # noqa: E402
                         Env, allow)

VM_SPEC = {"isolation": "microvm", "ram_mb": 256, "storage_gb": 1}
QEMU_HOST_ALIAS = "10.0.2.2"  # what QEMU's user-mode network calls the host: QEMU's own loopback
QEMU_DNS = "10.0.2.3"         # its DNS forwarder
TREE = None


class MicroVmEgressTest(base.MoatdCase):
    def env(self, **create):
        e = Env(self.moatd, base.WORLD, template=TREE, spec=VM_SPEC, **create)
        self.envs.append(e)
        self.assertEqual(e.body["spec"]["isolation"], "microvm", e.body)
        return e

    def wget(self, env, url, *args):
        """busybox wget in the guest: (exit code, body, stderr). Bounded by
        timeout(1): Debian 12's busybox wget crashes on its own -T."""
        return env.exec(["timeout", "10", "wget", "-q", "-O", "-", *args, url])

    def links(self):
        netns = os.path.join(self.moatd.state, "run", "egress.netns")
        out = subprocess.run(["nsenter", "--net=" + netns, "ip", "-o", "link"], check=True, capture_output=True,
                             text=True).stdout
        return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ": mx" in line]

    def assert_reaches(self, env, host, path, *args):
        code, out, err = self.wget(env, f"http://{host}{path}", *args)
        self.assertEqual(code, 0, f"{env.id} could not reach {host}{path} {args}: {err}")
        answer = json.loads(out)
        self.assertEqual((answer["server"], answer["path"]), (host, path))

    def assert_reaches_nothing(self, env, target):
        code, out, err = self.wget(env, target, "-Y", "off")
        self.assertNotEqual(code, 0, f"{env.id} reached {target}: {out}")
        self.assertNotIn('"server"', out)

    # --- mode none ---------------------------------------------------------

    def test_mode_none_reaches_nothing(self):
        e = self.env()
        self.assertEqual(e.body["network"], "none")
        self.assert_reaches_nothing(e, f"http://{API_IP}/")
        code, out, _ = e.sh(f"nc -w 3 {API_IP} 80 </dev/null && echo connected || echo refused")
        self.assertIn("refused", out)
        code, out, _ = e.sh(f"nslookup {API} {QEMU_DNS} || echo unresolved")
        self.assertIn("unresolved", out)
        # The guest itself has loopback and its NIC up.
        code, out, err = e.sh("ip -o addr")
        self.assertEqual(code, 0, err)
        self.assertIn("127.0.0.1/8", out)
        self.assertIn("10.0.2.15/24", out)
        self.assertEqual(self.links(), [], "a guest without a policy has an egress link")

    # --- allowed -----------------------------------------------------------

    def test_an_allowed_host_through_the_proxy_and_directly(self):
        e = self.env(network=allow(API))
        code, out, _ = e.sh("echo $http_proxy")
        self.assertTrue(out.strip().startswith("http://100.64."), out)
        self.assert_reaches(e, API, "/proxied")
        self.assert_reaches(e, API, "/direct", "-Y", "off")
        allowed = self.wait_event(e, "egress.allowed", lambda d: d.get("host") == API)
        self.assertTrue(allowed, "no egress.allowed event")

    def test_names_resolve_only_when_allowed(self):
        e = self.env(network=allow(API))
        code, out, err = e.sh(f"nslookup {API}")
        self.assertEqual(code, 0, out + err)
        self.assertIn(API_IP, out)
        code, out, _ = e.sh(f"nslookup {OTHER} || echo unresolved")
        self.assertIn("unresolved", out)
        self.assertNotIn(OTHER_IP, out)
        # QEMU's own DNS forwarder goes the same way (or nowhere).
        code, out, _ = e.sh(f"nslookup {OTHER} {QEMU_DNS} || echo unresolved")
        self.assertNotIn(OTHER_IP, out)

    # --- refused -----------------------------------------------------------

    def test_off_the_allowlist_and_direct_addresses_are_refused(self):
        e = self.env(network=allow(API))
        code, out, err = self.wget(e, f"http://{OTHER}/")
        self.assertNotEqual(code, 0)
        self.assertNotIn('"server"', out)
        self.assert_reaches_nothing(e, f"http://{OTHER}/")
        denied = self.wait_event(e, "egress.denied", lambda d: d.get("host") == OTHER)
        self.assertTrue(denied, "no egress.denied event")
        for target in (f"http://{PLAIN_IP}/", f"http://{OTHER_IP}/"):
            code, out, _ = self.wget(e, target, "-Y", "off")
            self.assertTrue(code != 0 or out.startswith("moat:"), f"{target}: {out}")
            self.assertNotIn('"server"', out)

    def test_host_and_qemu_services_are_unreachable(self):
        e = self.env(network=allow(API))
        # The test namespace's loopback service (moatd's host's, here), by
        # name, through QEMU's host alias, and by address.
        for target in (f"http://{LOOPBACK_NAME}:{HOST_SERVICE_PORT}/", f"http://{QEMU_HOST_ALIAS}:{HOST_SERVICE_PORT}/",
                       f"http://127.0.0.1:{HOST_SERVICE_PORT}/"):
            self.assert_reaches_nothing(e, target)
            code, out, _ = self.wget(e, target)
            self.assertNotIn("host-service", out)
        code, out, _ = e.sh(f"nc -w 3 {QEMU_HOST_ALIAS} {HOST_SERVICE_PORT} </dev/null && echo connected || echo no")
        self.assertIn("no", out)
        self.assertNotIn("connected", out)

    # --- changes and identity ----------------------------------------------

    def test_mode_changes_on_a_running_guest(self):
        e = self.env()
        self.assert_reaches_nothing(e, f"http://{API}/")
        status, body = e.set_network(allow(API))
        self.assertEqual(status, 200, body)
        self.assertIn("link", body)
        self.assertEqual(len(self.links()), 1)
        # Linked after the guest started: the proxy variables come with the
        # next command.
        self.assert_reaches(e, API, "/on")
        status, body = e.set_network("none")
        self.assertEqual(status, 200, body)
        self.assert_reaches_nothing(e, f"http://{API_IP}/")
        self.assertEqual(self.links(), [])

    def test_guests_with_the_same_guest_address_keep_to_their_own_policies(self):
        a = self.env(network=allow(API))
        b = self.env(network=allow(OTHER))
        for env, own, theirs in ((a, API, OTHER), (b, OTHER, API)):
            self.assert_reaches(env, own, "/mine", "-Y", "off")
            code, out, _ = self.wget(env, f"http://{theirs}/", "-Y", "off")
            self.assertNotEqual(code, 0, f"{env.id} reached {theirs} under the other's policy")
            self.assertNotIn('"server"', out)

    # --- ports ----------------------------------------------------------------

    def test_a_port_reaches_the_guests_server_and_opens_nothing_else(self):
        e = self.env(network=allow(API))  # a link into QEMU's namespace, to attack the forward through
        code, _, err = e.sh("mkdir -p /srv && echo hello-from-the-guest > /srv/hello.txt")
        self.assertEqual(code, 0, err)
        status, body = self.moatd.call("POST", f"/v1/environments/{e.id}/processes",
                                       {"cmd": ["httpd", "-f", "-p", "8080", "-h", "/srv"]})
        self.assertEqual(status, 201, body)
        deadline = time.monotonic() + 20  # bounded: until httpd listens
        while True:
            status, body = self.moatd.call("GET", f"/v1/environments/{e.id}/ports/8080/hello.txt")
            if status == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        self.assertEqual(status, 200, body)
        self.assertEqual(body, b"hello-from-the-guest\n")
        # Nothing listens on another port: an error, never another server.
        status, body = self.moatd.call("GET", f"/v1/environments/{e.id}/ports/8081/")
        self.assertEqual(status, 502, body)
        # QEMU's loopback now holds the forward (on 127.0.0.2): the guest's
        # 10.0.2.2 (QEMU's 127.0.0.1) leads neither to it nor to the host's.
        self.assert_reaches_nothing(e, f"http://{QEMU_HOST_ALIAS}:8080/hello.txt")
        self.assert_reaches_nothing(e, f"http://{QEMU_HOST_ALIAS}:{HOST_SERVICE_PORT}/")
        # The forward listens on QEMU's loopback alone: from the egress
        # side, the environment's address has no such port.
        status, network = self.moatd.call("GET", f"/v1/environments/{e.id}/network")
        self.assertEqual(status, 200, network)
        address = network["link"]["address"]
        netns = os.path.join(self.moatd.state, "run", "egress.netns")
        probe = subprocess.run(["nsenter", "--net=" + netns, "python3", "-c",
                                "import socket,sys\ns=socket.socket(); s.settimeout(3)\n"
                                f"sys.exit(7 if s.connect_ex(('{address}', 8080)) else 0)"], capture_output=True)
        self.assertEqual(probe.returncode, 7, f"the egress namespace reached {address}:8080: {probe.stderr}")

    def qemu_of(self, env):
        """The pid of the QEMU that holds the environment's files (its disk
        and console, in its volume) open."""
        mark = f"/storage/envs/{env.id}/"
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                fds = os.listdir(f"/proc/{pid}/fd")
                if any(mark in os.readlink(f"/proc/{pid}/fd/{fd}") for fd in fds):
                    with open(f"/proc/{pid}/comm") as f:
                        if f.read().startswith("qemu-system"):
                            return int(pid)
            except OSError:
                continue
        self.fail(f"no QEMU for {env.id}")

    def get_port(self, env, port, path="/hello.txt", until=None, timeout=20):
        """GET through the port; with `until`, again (bounded) until that status."""
        deadline = time.monotonic() + timeout
        while True:
            status, body = self.moatd.call("GET", f"/v1/environments/{env.id}/ports/{port}{path}")
            if until is None or status == until or time.monotonic() > deadline:
                return status, body
            time.sleep(0.1)

    def test_a_monitor_that_stalls_does_not_break_later_ports(self):
        e = self.env()
        code, _, err = e.sh("mkdir -p /srv && echo hello-from-the-guest > /srv/hello.txt")
        self.assertEqual(code, 0, err)
        for port in (8082, 8083, 8084):
            status, body = self.moatd.call("POST", f"/v1/environments/{e.id}/processes",
                                           {"cmd": ["httpd", "-f", "-p", str(port), "-h", "/srv"]})
            self.assertEqual(status, 201, body)
        self.assertEqual(self.get_port(e, 8084, until=200)[0], 200)  # the monitor's session is open
        deadline = time.monotonic() + 20  # bounded: until the other two listen too
        while time.monotonic() < deadline:
            listening = e.sh("netstat -ltn")[1]
            if ":8082 " in listening and ":8083 " in listening:
                break
            time.sleep(0.1)
        qemu = self.qemu_of(e)
        os.kill(qemu, signal.SIGSTOP)  # QEMU answers nothing while stopped
        try:
            started = time.monotonic()
            status, body = self.get_port(e, 8082)
            self.assertGreaterEqual(status, 500, body)
            self.assertLess(time.monotonic() - started, 30, "a stalled QEMU held the request")
        finally:
            os.kill(qemu, signal.SIGCONT)
        # The late answer to that forward must not be taken for a later
        # one's (the port asked for again, then one never asked for): each
        # serves at its first request.
        for port in (8082, 8083):
            status, body = self.get_port(e, port)
            self.assertEqual((status, body), (200, b"hello-from-the-guest\n"), f"port {port}")

    def test_a_port_and_the_network_still_serve_after_a_moatd_restart(self):
        e = self.env(network=allow(API))
        code, _, err = e.sh("mkdir -p /srv && echo hello-from-the-guest > /srv/hello.txt")
        self.assertEqual(code, 0, err)
        status, body = self.moatd.call("POST", f"/v1/environments/{e.id}/processes",
                                       {"cmd": ["httpd", "-f", "-p", "8085", "-h", "/srv"]})
        self.assertEqual(status, 201, body)
        self.assertEqual(self.get_port(e, 8085, until=200)[0], 200)
        qemu = self.qemu_of(e)
        self.moatd.kill9()
        self.moatd.start()  # the same state: the guest is adopted and re-attached
        self.assertEqual(self.qemu_of(e), qemu, "the same QEMU")
        # QEMU still forwards the port an earlier moatd asked for; this one
        # asks again and gets it.
        self.assertEqual(self.get_port(e, 8085), (200, b"hello-from-the-guest\n"))
        self.assert_reaches(e, API, "/after-restart")

    def test_at_most_64_ports_of_a_guest_are_forwarded(self):
        e = self.env()
        for port in range(9000, 9064):  # nothing listens: each forwarded, then 502
            status, body = self.get_port(e, port, path="/")
            self.assertEqual(status, 502, f"port {port}: {body}")
        status, body = self.get_port(e, 9064, path="/")
        self.assertEqual(status, 429, body)
        self.assertIn("at most 64 ports", body["error"]["message"])
        self.assertEqual(self.get_port(e, 9000, path="/")[0], 502, "a forwarded port still answers")

    def test_checkpoints_keep_one_copy_of_moatds_ca_in_the_system_bundle(self):
        """Each resume from disk links the guest again, which writes moatd's CA
        into the guest's own bundle: once, however many times, and a bundle
        the read could not hold whole is not written back cut."""
        e = self.env(network=allow(API))
        system = "/etc/ssl/certs/ca-certificates.crt"
        _, ca, _ = e.exec(["cat", "/etc/moat/ca.crt"])
        first = ca.strip().splitlines()[0]
        code, _, err = e.sh(f"mkdir -p /etc/ssl/certs && echo SYSTEM > {system}")
        self.assertEqual(code, 0, err)
        for _ in range(2):
            status, body = self.moatd.call("POST", f"/v1/environments/{e.id}/pause", {"memory": "disk"})
            self.assertEqual((status, body.get("paused_memory")), (200, "disk"), body)
            status, body = self.moatd.call("POST", f"/v1/environments/{e.id}/resume")
            self.assertEqual((status, body.get("state")), (200, "running"), body)
        _, bundle, _ = e.exec(["cat", system])
        self.assertTrue(bundle.startswith("SYSTEM\n"), bundle[:200])
        self.assertEqual(bundle.count(first), 1, "moatd's CA once in the system bundle")
        self.assert_reaches(e, API, "/after-resumes")

    def test_links_go_with_their_environments(self):
        e = self.env(network=allow(API))
        self.assertEqual(len(self.links()), 1)
        e.destroy()
        self.envs.remove(e)
        deadline = time.monotonic() + 10
        while self.links() and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertEqual(self.links(), [])


def main():
    global TREE
    if os.geteuid() == 0 and busybox.missing():
        print("FAIL: " + busybox.missing())
        return 1
    if os.geteuid() == 0:
        TREE = busybox.busybox_tree(prefix="moat-egress-vm-tree-")
    try:
        return base.main()
    finally:
        if TREE:
            shutil.rmtree(TREE, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
