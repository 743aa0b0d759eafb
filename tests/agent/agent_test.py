#!/usr/bin/env python3
"""Agent runs end to end: POST /v1/agents against a provider double.

moatd runs on a fresh state directory and calls a local provider double
(provider_double.py) that speaks the OpenAI Chat Completions and Anthropic
Messages wire formats from a script; every case runs once per provider
kind, streamed (moatd always streams). The test drives moatd's API over
<state>/moatd.sock with the master token (or API keys it makes) and checks
what the run reports, its transcript, its environment, and what reached the
provider: the tools offered, the tool results sent back, the key.

moatd is started with SSL_CERT_FILE naming the system's CAs plus a test CA
(for the HTTPS cases) and with MOAT_AGENT_TEST_PROVIDER_KEY set (for
api_key_env).

  agent_test.py --bin-dir build/bin [-k NAME]

Needs root (exits 77, CTest's "skipped", with a SKIP line otherwise: moatd
creates namespaces).
"""

import argparse
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from provider_double import ProviderDouble, make_test_certs  # noqa: E402

# Everything a run offers the model: docs/MCP.md's tools without the
# environment management ones, and none takes an environment_id.
RUN_TOOLS = {"run_command", "read_file", "write_file", "edit_file", "list_files", "search_files",
             "start_process", "read_process_output", "send_input", "kill_process"}
ENDED = {"completed", "failed", "max_iterations", "stopped"}
MODELS = {"openai": "gpt-double-1", "anthropic": "claude-double-1"}
MODEL_PATHS = {"openai": "/v1/chat/completions", "anthropic": "/v1/messages"}
PROVIDER_KEY = "sk-moat-agent-test-5f1c0e7a9b2d4c6e80a1"
ENV_KEY_NAME = "MOAT_AGENT_TEST_PROVIDER_KEY"
ENV_KEY = "sk-moat-agent-env-8a3d91c4e27b5f06d1c3"
KEY_SCOPES = ["create", "read", "exec", "files", "destroy"]
INSTRUCTION = "Write 'hi from the model' to /workspace/hello.txt, then say 'wrote it'."
HELLO = {"path": "/workspace/hello.txt", "content": "hi from the model"}

BIN_DIR = None
MOATD = None
CERTS = None      # a test CA in moatd's SSL_CERT_FILE, and a certificate for 127.0.0.1
UNTRUSTED = None  # another CA, unknown to moatd


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout=120):
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.path)


class Moatd:
    """moatd on a fresh state directory, with `extra_env` in its environment."""

    def __init__(self, bin_dir, extra_env):
        self.bin = os.path.join(bin_dir, "moatd")
        self.state = tempfile.mkdtemp(prefix="moatd-agent-")
        self.log_path = self.state + ".log"
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "MOAT_STORAGE_GB": "8",
               **extra_env}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                # The doubles listen on 127.0.0.1: keys' runs may call them only
                # with --agent-local-providers (the refusal without it is
                # tests/unit/api_test.cc's).
                [self.bin, "--state", self.state, "--listen", "127.0.0.1:0", "--approval-timeout", "60",
                 "--agent-local-providers"],
                stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=env)
        deadline = time.monotonic() + 30
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"moatd exited at start:\n{self.log()}")
            try:
                if self.raw("GET", "/healthz", token=False)[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"moatd did not start:\n{self.log()}")
            time.sleep(0.02)
        with open(os.path.join(self.state, "master-token")) as f:
            self.token = f.read().strip()

    def log(self, tail=4000):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()[-tail:] if tail else f.read()
        except OSError:
            return ""

    def raw(self, method, path, body=None, token=True):
        """(status, body bytes). token: True for the master token, a string
        for that token, False for none."""
        conn = UnixHTTPConnection(os.path.join(self.state, "moatd.sock"))
        headers = {}
        if token:
            headers["Authorization"] = "Bearer " + (token if isinstance(token, str) else self.token)
        data = None
        if isinstance(body, bytes):
            data = body
            headers["Content-Type"] = "application/octet-stream"
        elif body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        try:
            conn.request(method, path, body=data, headers=headers)
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    def call(self, method, path, body=None, token=True):
        """(status, JSON body, or the bytes when it is not JSON)."""
        status, raw = self.raw(method, path, body, token)
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw

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


def list_runs(test, token=True):
    """GET /v1/agents as `token`: the runs it lists."""
    status, body = MOATD.call("GET", "/v1/agents", token=token)
    test.assertEqual(status, 200, body)
    return body["agents"]


def text_of(content):
    """The text of a message's or block's content: a string, or text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content if isinstance(p, dict))


def arguments_of(call):
    """A transcript tool call's arguments as an object (sent as one or as a JSON string)."""
    args = call.get("arguments")
    return json.loads(args) if isinstance(args, str) else args


class AgentCases:
    """The cases; the subclasses name the provider kind."""

    kind = None

    def setUp(self):
        self.doubles = []

    # --- helpers ----------------------------------------------------------------

    def double(self, script, api_key=PROVIDER_KEY, certs=None):
        d = ProviderDouble(script, api_key=api_key, tls_cert=certs.cert if certs else None,
                           tls_key=certs.key if certs else None)
        d.start()
        self.doubles.append(d)
        self.addCleanup(d.stop)  # after the run's cleanup (cleanups run last added first)
        return d

    def provider(self, double, **fields):
        """The provider object of a create; a field given as None is left out."""
        p = {"kind": self.kind, "model": MODELS[self.kind], "base_url": double.url(self.kind), "api_key": PROVIDER_KEY}
        p.update(fields)
        return {k: v for k, v in p.items() if v is not None}

    def two_step_script(self):
        return [{"tool_calls": [{"name": "write_file", "arguments": HELLO}], "usage": {"input": 11, "output": 5}},
                {"text": "wrote it", "usage": {"input": 13, "output": 3}}]

    def start_run(self, provider, instruction=INSTRUCTION, token=True, states=("running",), **fields):
        body = {"instruction": instruction, "provider": provider, **fields}
        status, run = MOATD.call("POST", "/v1/agents", body, token=token)
        self.assertEqual(status, 201, run)
        self.addCleanup(self.end_run, run)
        for field in ("id", "state", "environment", "iterations", "max_iterations", "usage", "provider",
                      "created_at", "labels"):
            self.assertIn(field, run)
        self.assertIn(run["state"], states)
        self.assertEqual(run["max_iterations"], fields.get("max_iterations", 30))
        self.assertEqual(set(run["usage"]), {"input_tokens", "output_tokens"})
        self.assertEqual({k: run["provider"].get(k) for k in ("kind", "model", "base_url")},
                         {k: provider.get(k) for k in ("kind", "model", "base_url")})
        self.assertNotIn("api_key", run["provider"])
        return run

    def end_run(self, run):
        """Cleanup: stop the run if it still goes, destroy its environment."""
        status, now = MOATD.call("GET", f"/v1/agents/{run['id']}")
        if status == 200 and now.get("state") not in ENDED:
            MOATD.call("POST", f"/v1/agents/{run['id']}/stop")
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                status, now = MOATD.call("GET", f"/v1/agents/{run['id']}")
                if status != 200 or now.get("state") in ENDED:
                    break
                time.sleep(0.05)
        MOATD.call("DELETE", f"/v1/environments/{run['environment']}")

    def diagnosis(self):
        lines = []
        for i, d in enumerate(self.doubles):
            for r in d.requests():
                lines.append(f"double {i}: {r['method']} {r['path']} -> {r.get('status')}"
                             + (f" rejected: {r['rejected']}" if "rejected" in r else ""))
            if d.tls_failures:
                lines.append(f"double {i}: TLS handshakes failed: {d.tls_failures}")
        return "\n".join(lines) + "\n---- moatd log (tail) ----\n" + MOATD.log()

    def wait_for(self, predicate, timeout, what):
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                self.fail(f"timed out after {timeout} s waiting for {what}\n{self.diagnosis()}")
            time.sleep(0.05)

    def get_run(self, run_id, token=True):
        status, run = MOATD.call("GET", f"/v1/agents/{run_id}", token=token)
        self.assertEqual(status, 200, run)
        return run

    def wait_run(self, run_id, until=ENDED, timeout=60, token=True):
        """The run once its state is in `until`; fails if it ends otherwise."""
        seen = {}

        def reached():
            seen["run"] = run = self.get_run(run_id, token)
            if run["state"] in ENDED and run["state"] not in until:
                self.fail(f"run ended {run['state']}, expected {sorted(until)}: {run}\n{self.diagnosis()}")
            return run if run["state"] in until else None
        return self.wait_for(reached, timeout, f"run {run_id} to be {sorted(until)} (last: {seen.get('run')})")

    def transcript(self, run_id):
        status, body = MOATD.call("GET", f"/v1/agents/{run_id}/transcript")
        self.assertEqual(status, 200, body)
        steps = body["steps"]
        seqs = [s["seq"] for s in steps]
        self.assertEqual(seqs, sorted(set(seqs)), "seq increases")
        self.assertTrue(all("at" in s for s in steps), steps)
        return steps

    def model_requests(self, double):
        """The requests that reached the double, each checked against the run's
        provider settings: path, key, model, streamed, well-formed."""
        requests = double.requests()
        for r in requests:
            self.assertEqual(r["path"], MODEL_PATHS[self.kind], r)
            self.assertNotIn("rejected", r, f"the double refused a malformed request: {r.get('rejected')}")
            self.assertEqual(r["body"]["model"], MODELS[self.kind])
            self.assertIs(r["body"].get("stream"), True, "moatd streams")
        return requests

    def assert_key_sent(self, request, key):
        if self.kind == "openai":
            self.assertEqual(request["headers"].get("authorization"), f"Bearer {key}")
        else:
            self.assertEqual(request["headers"].get("x-api-key"), key)
            self.assertEqual(request["headers"].get("anthropic-version"), "2023-06-01")

    def offered_tools(self, body):
        """{name: parameters schema} of the tools a request offers."""
        if self.kind == "openai":
            return {t["function"]["name"]: t["function"].get("parameters", {}) for t in body["tools"]}
        return {t["name"]: t.get("input_schema", {}) for t in body["tools"]}

    def first_user_text(self, body):
        return text_of(next(m for m in body["messages"] if m["role"] == "user")["content"])

    def tool_calls_sent_back(self, body):
        """The assistant's tool calls a request repeats: [(id, name, arguments)]."""
        out = []
        for m in body["messages"]:
            if m["role"] != "assistant":
                continue
            if self.kind == "openai":
                out += [(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
                        for c in m.get("tool_calls") or []]
            elif isinstance(m["content"], list):
                out += [(b["id"], b["name"], b["input"]) for b in m["content"] if b.get("type") == "tool_use"]
        return out

    def tool_results(self, body):
        """The tool results a request carries: [(id, text, is_error or None)]."""
        out = []
        for m in body["messages"]:
            if self.kind == "openai" and m["role"] == "tool":
                out.append((m["tool_call_id"], text_of(m["content"]), None))
            elif self.kind == "anthropic" and m["role"] == "user" and isinstance(m["content"], list):
                out += [(b["tool_use_id"], text_of(b.get("content")), bool(b.get("is_error")))
                        for b in m["content"] if b.get("type") == "tool_result"]
        return out

    def first_call_id(self):
        return "call_1" if self.kind == "openai" else "toolu_1"

    def all_events(self):
        """Every audit event so far, as the raw event stream."""
        out, since = b"", 0
        while True:
            status, raw = MOATD.raw("GET", f"/v1/events?since={since}")
            self.assertEqual(status, 200, raw)
            ids = [int(line[4:]) for line in raw.decode(errors="replace").splitlines() if line.startswith("id: ")]
            if not ids:
                return out
            out += raw
            since = ids[-1]

    def assert_key_hidden(self, run, key):
        """The provider key appears in nothing moatd shows or records."""
        places = {
            "GET /v1/agents/{id}": MOATD.raw("GET", f"/v1/agents/{run['id']}")[1],
            "GET /v1/agents": MOATD.raw("GET", "/v1/agents")[1],
            "the transcript": MOATD.raw("GET", f"/v1/agents/{run['id']}/transcript")[1],
            "the environment's events": MOATD.raw("GET", f"/v1/events?environment={run['environment']}")[1],
            "the audit log": self.all_events(),
            "moatd's log": MOATD.log(tail=None).encode(),
        }
        for where, data in places.items():
            self.assertNotIn(key.encode(), data, f"the provider key leaks into {where}")

    def assert_environment_gone(self, env_id, timeout=15):
        def gone():
            status, body = MOATD.call("GET", f"/v1/environments/{env_id}")
            return status == 404 or (status == 200 and body.get("state") == "gone")
        self.wait_for(gone, timeout, f"environment {env_id} to be destroyed")

    def read_file(self, env_id, path):
        return MOATD.raw("GET", f"/v1/environments/{env_id}/files?path={path}")

    def assert_two_steps(self, run, double, max_tokens=None, key=PROVIDER_KEY):
        """A completed write-then-answer run (two_step_script): its report,
        transcript and the two model requests."""
        self.assertEqual(run["state"], "completed", run)
        self.assertEqual(run["result"], "wrote it")
        self.assertEqual(run["iterations"], 2)
        self.assertEqual(run["usage"], {"input_tokens": 24, "output_tokens": 8})
        self.assertIn("ended_at", run)
        first, second = self.model_requests(double)
        for r in (first, second):
            self.assert_key_sent(r, key)
        tools = self.offered_tools(first["body"])
        self.assertEqual(set(tools), RUN_TOOLS)
        for name, schema in tools.items():
            self.assertNotIn("environment_id", schema.get("properties", {}), name)
        self.assertIn(INSTRUCTION, self.first_user_text(first["body"]))
        if max_tokens is not None:
            sent = first["body"].get("max_tokens", first["body"].get("max_completion_tokens"))
            self.assertEqual(sent, max_tokens)
        call_id = self.first_call_id()
        self.assertEqual(self.tool_calls_sent_back(second["body"]), [(call_id, "write_file", HELLO)])
        results = self.tool_results(second["body"])
        self.assertEqual([r[0] for r in results], [call_id], "the second request carries the tool result")
        self.assertNotEqual(results[0][2], True, results)
        steps = self.transcript(run["id"])
        self.assertEqual([s["kind"] for s in steps], ["instruction", "model", "tool_result", "model", "end"], steps)
        self.assertEqual(steps[0]["text"], INSTRUCTION)
        [call] = steps[1]["tool_calls"]
        self.assertEqual((call["id"], call["name"], arguments_of(call)), (call_id, "write_file", HELLO))
        self.assertEqual((steps[2]["id"], steps[2]["name"], steps[2]["is_error"]), (call_id, "write_file", False))
        self.assertEqual(steps[3]["text"], "wrote it")
        self.assertFalse(steps[3].get("tool_calls"))
        self.assertEqual(steps[4]["state"], "completed")

    # --- the cases ------------------------------------------------------------------------

    def test_two_step_run_keeps_its_environment(self):
        d = self.double(self.two_step_script())
        run = self.start_run(self.provider(d, max_tokens=1000), keep_environment=True,
                             labels={"case": "two-step"})
        self.assertEqual(run["labels"], {"case": "two-step"})
        run = self.wait_run(run["id"])
        self.assert_two_steps(run, d, max_tokens=1000)
        self.assertEqual(self.read_file(run["environment"], HELLO["path"]), (200, HELLO["content"].encode()))
        self.assertIn(run["id"], [r["id"] for r in list_runs(self)])
        self.assert_key_hidden(run, PROVIDER_KEY)

    def test_two_step_run_destroys_its_environment_by_default(self):
        d = self.double(self.two_step_script())
        run = self.start_run(self.provider(d))
        run = self.wait_run(run["id"])
        self.assert_two_steps(run, d)
        self.assert_environment_gone(run["environment"])
        self.assert_key_hidden(run, PROVIDER_KEY)

    def test_max_iterations_ends_a_model_that_never_stops(self):
        d = self.double({"entries": [{"tool_calls": [{"name": "run_command", "arguments": {"command": "true"}}]}],
                         "repeat_last": True})
        run = self.start_run(self.provider(d), max_iterations=3)
        run = self.wait_run(run["id"], {"max_iterations"})
        self.assertEqual(run["iterations"], 3)
        self.assertEqual(len(self.model_requests(d)), 3)
        steps = self.transcript(run["id"])
        self.assertEqual(steps[-1]["kind"], "end")
        self.assertEqual(steps[-1]["state"], "max_iterations")
        self.assert_environment_gone(run["environment"])

    def test_a_denied_tool_call_is_an_error_result(self):
        d = self.double([{"tool_calls": [{"name": "write_file", "arguments": HELLO}]}, {"text": "could not write"}])
        run = self.start_run(self.provider(d), permissions={"write_file": "deny"}, keep_environment=True)
        run = self.wait_run(run["id"])
        self.assertEqual((run["state"], run["result"]), ("completed", "could not write"), run)
        second = self.model_requests(d)[1]
        [(call_id, text, is_error)] = self.tool_results(second["body"])
        self.assertEqual(call_id, self.first_call_id())
        self.assertIn("denied", text.lower())
        if self.kind == "anthropic":
            self.assertIs(is_error, True)
        steps = self.transcript(run["id"])
        [result] = [s for s in steps if s["kind"] == "tool_result"]
        self.assertIs(result["is_error"], True)
        self.assertEqual(self.read_file(run["environment"], HELLO["path"])[0], 404, "the file was written")

    def test_a_429_is_retried_after_retry_after(self):
        d = self.double([{"status": 429, "retry_after": 1}] + self.two_step_script())
        run = self.start_run(self.provider(d))
        run = self.wait_run(run["id"])
        self.assertEqual((run["state"], run.get("result")), ("completed", "wrote it"), run)
        self.assertEqual(run["iterations"], 2)
        requests = self.model_requests(d)
        self.assertEqual([r["status"] for r in requests], [429, 200, 200])
        self.assertEqual(requests[0]["body"], requests[1]["body"], "the retry is the same request")
        self.assertGreaterEqual(requests[1]["time"] - requests[0]["time"], 0.9, "Retry-After: 1 was not waited")

    def test_stop_ends_a_run_whose_provider_hangs(self):
        d = self.double([{"hang": True}])
        run = self.start_run(self.provider(d))
        self.wait_for(lambda: d.requests(), 30, "the model request")
        self.assertEqual(self.get_run(run["id"])["state"], "running")
        stopped_at = time.monotonic()
        status, body = MOATD.call("POST", f"/v1/agents/{run['id']}/stop")
        self.assertEqual(status, 200, body)
        self.assertEqual(body["id"], run["id"])
        run = self.wait_run(run["id"], {"stopped"}, timeout=10)
        self.assertLessEqual(time.monotonic() - stopped_at, 10)
        self.assertIn("ended_at", run)
        self.assertEqual(self.transcript(run["id"])[-1]["state"], "stopped")
        self.assert_environment_gone(run["environment"])
        self.wait_for(lambda: d.requests()[0].get("hang_ended") == "closed", 10,
                      "moatd to close its connection to the provider")
        self.assertEqual(len(d.requests()), 1)

    def test_a_wrong_api_key_fails_the_run(self):
        d = self.double(self.two_step_script())
        # A 401 can end the run before its create answers.
        run = self.start_run(self.provider(d, api_key="sk-not-the-right-key"), states=("running", "failed"))
        run = self.wait_run(run["id"], {"failed"})
        self.assertIn("401", run["error"])
        self.assertIn("ended_at", run)
        self.assertEqual(len(d.requests()), 1, "a 401 is not retried")
        self.assertEqual(d.requests()[0]["status"], 401)
        self.assert_key_hidden(run, "sk-not-the-right-key")

    def test_https_with_a_trusted_ca(self):
        d = self.double(self.two_step_script(), certs=CERTS)
        self.assertTrue(d.url(self.kind).startswith("https://127.0.0.1:"))
        run = self.start_run(self.provider(d))
        run = self.wait_run(run["id"])
        self.assert_two_steps(run, d)

    def test_https_with_an_untrusted_certificate_fails(self):
        d = self.double(self.two_step_script(), certs=UNTRUSTED)
        run = self.start_run(self.provider(d))
        run = self.wait_run(run["id"], {"failed"})
        self.assertRegex(run["error"], re.compile(r"certificate|verif", re.IGNORECASE))
        self.assertEqual(d.requests(), [], "a request went to a server moatd does not trust")

    def test_ask_waits_for_a_person(self):
        d = self.double(self.two_step_script())
        run = self.start_run(self.provider(d), permissions={"write_file": "ask"}, keep_environment=True)
        run = self.wait_run(run["id"], {"waiting_approval"}, timeout=30)
        env = run["environment"]
        status, body = MOATD.call("GET", f"/v1/approvals?state=pending&environment={env}")
        self.assertEqual(status, 200, body)
        [approval] = body["approvals"]
        self.assertEqual(approval["scope"], "write_file")
        self.assertEqual(approval["action"].get("path"), HELLO["path"])
        self.assertEqual(len(d.requests()), 1, "the model is not asked again while the tool waits")
        self.assertEqual(self.get_run(run["id"])["state"], "waiting_approval")
        status, body = MOATD.call("POST", f"/v1/approvals/{approval['id']}", {"decision": "approve"})
        self.assertEqual(status, 200, body)
        run = self.wait_run(run["id"])
        self.assert_two_steps(run, d)
        self.assertEqual(self.read_file(env, HELLO["path"]), (200, HELLO["content"].encode()))

    def test_a_key_sees_only_its_own_runs(self):
        def make_key(name):
            status, body = MOATD.call("POST", "/v1/keys", {"name": name, "scopes": KEY_SCOPES})
            self.assertEqual(status, 201, body)
            self.addCleanup(MOATD.call, "DELETE", f"/v1/keys/{body['id']}")
            return body["token"]
        mine, theirs = make_key(f"agent-owner-{self.kind}"), make_key(f"agent-other-{self.kind}")
        d = self.double([{"text": "ok"}])
        run = self.start_run(self.provider(d), token=mine)
        run = self.wait_run(run["id"], token=mine)
        self.assertEqual((run["state"], run["result"]), ("completed", "ok"), run)
        for method, path in (("GET", f"/v1/agents/{run['id']}"), ("GET", f"/v1/agents/{run['id']}/transcript"),
                             ("POST", f"/v1/agents/{run['id']}/stop")):
            status, body = MOATD.call(method, path, token=theirs)
            self.assertEqual(status, 404, f"{method} {path} by another key: {body}")
        self.assertNotIn(run["id"], [r["id"] for r in list_runs(self, theirs)])
        self.assertIn(run["id"], [r["id"] for r in list_runs(self, mine)])
        self.assertEqual(self.get_run(run["id"])["state"], "completed", "the master token sees every run")

    def moat_agent(self, *args, key_env=None):
        """`moat agent ARGS...` against the test's moatd: (exit code, stdout, stderr)."""
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
               "MOAT_URL": "unix:" + os.path.join(MOATD.state, "moatd.sock"), "MOAT_TOKEN": MOATD.token}
        if key_env:
            env.update(key_env)
        p = subprocess.run([os.path.join(BIN_DIR, "moat"), "agent", *args], env=env, capture_output=True,
                           text=True, timeout=120)
        return p.returncode, p.stdout, p.stderr

    def test_moat_agent_run_follows_the_steps_and_exits_by_the_final_state(self):
        d = self.double(self.two_step_script())
        code, out, err = self.moat_agent("run", "--provider", self.kind, "--model", MODELS[self.kind],
                                         "--base-url", d.url(self.kind), "--api-key-env", "THE_KEY", "--keep",
                                         INSTRUCTION, key_env={"THE_KEY": PROVIDER_KEY})
        self.assertEqual(code, 0, f"stdout:\n{out}\nstderr:\n{err}")
        self.assertIn("> write_file", out)
        self.assertIn("wrote it\n", out)
        self.assertIn("[completed after 2 iteration(s)]", out)
        run_id = re.search(r"run ([0-9a-f]{12}) in environment ([0-9a-f]{12})", err)
        self.assertTrue(run_id, err)
        self.addCleanup(MOATD.call, "DELETE", f"/v1/environments/{run_id.group(2)}")
        self.assertEqual(self.read_file(run_id.group(2), HELLO["path"]), (200, HELLO["content"].encode()))
        self.assertNotIn(PROVIDER_KEY, out + err)
        # The same run afterwards: its transcript, its record.
        code, out, _ = self.moat_agent("transcript", run_id.group(1))
        self.assertEqual(code, 0)
        self.assertIn("[completed after 2 iteration(s)]", out)
        code, out, _ = self.moat_agent("get", run_id.group(1))
        self.assertIn("state: completed\n", out)
        code, out, _ = self.moat_agent("ls")
        self.assertIn(run_id.group(1), out)

        looping = self.double([{"tool_calls": [{"name": "run_command", "arguments": {"command": "true"}}]}],
                              api_key=PROVIDER_KEY)
        code, out, err = self.moat_agent("run", "--provider", self.kind, "--model", MODELS[self.kind],
                                         "--base-url", looping.url(self.kind), "--max-iterations", "1",
                                         "--api-key-env", "THE_KEY", INSTRUCTION, key_env={"THE_KEY": PROVIDER_KEY})
        self.assertEqual(code, 3, f"max_iterations: stdout:\n{out}\nstderr:\n{err}")
        code, _, err = self.moat_agent("run", "--provider", self.kind, INSTRUCTION)
        self.assertEqual(code, 2, err)
        self.assertIn("--model", err)

    def test_moat_agent_fleet_runs_every_task_and_leaves_nothing_behind(self):
        d = self.double([])  # every request: the final text "done"
        tasks = os.path.join(MOATD.state, f"tasks-{self.kind}.jsonl")
        with open(tasks, "w") as f:
            for i in range(20):
                f.write(json.dumps({"id": f"{self.kind}-{i}", "instruction": f"task {i}",
                                    "labels": {"fleet": self.kind}}) + "\n")
        code, out, err = self.moat_agent("fleet", tasks, "--parallel", "4", "--provider", self.kind,
                                         "--model", MODELS[self.kind], "--base-url", d.url(self.kind),
                                         "--api-key-env", "THE_KEY", key_env={"THE_KEY": PROVIDER_KEY})
        self.assertEqual(code, 0, f"stdout:\n{out}\nstderr:\n{err}")
        lines = [json.loads(line) for line in out.splitlines()]
        self.assertEqual(sorted(line["task"] for line in lines), sorted(f"{self.kind}-{i}" for i in range(20)))
        self.assertTrue(all(line["state"] == "completed" and line["result"] == "done" for line in lines), lines)
        self.assertEqual(len({line["run"] for line in lines}), 20)
        self.assertIn("[20/20]", err)
        self.assertEqual(len(d.requests()), 20)
        # Every environment went with its run.
        status, body = MOATD.call("GET", f"/v1/environments?label=fleet={self.kind}&state=running")
        self.assertEqual((status, body["environments"]), (200, []))
        # A run's environment is destroyed once the run ends (asynchronously:
        # the last may still be "destroying" when the fleet reports).
        deadline = time.monotonic() + 30
        while True:
            status, body = MOATD.call("GET", f"/v1/environments?label=fleet={self.kind}")
            self.assertEqual(status, 200)
            if all(e["state"] == "gone" for e in body["environments"]) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        self.assertTrue(all(e["state"] == "gone" for e in body["environments"]), body)
        code, _, err = self.moat_agent("fleet", "/nonexistent.jsonl", "--model", "m")
        self.assertNotEqual(code, 0)
        with open(tasks, "w") as f:
            f.write('{"instruction": "x", "colour": 1}\n')
        code, _, err = self.moat_agent("fleet", tasks, "--model", "m")
        self.assertEqual(code, 2, err)
        self.assertIn(":1: unknown field \"colour\"", err)

    def test_moat_agent_fleet_forks_each_task_from_a_snapshot(self):
        # The source: an environment with a file, snapshotted, then destroyed
        # (a snapshot outlives its environment).
        status, env = MOATD.call("POST", "/v1/environments", {"task_id": f"fleet-source-{self.kind}"})
        self.assertEqual(status, 201, env)
        status, _ = MOATD.raw("PUT", f"/v1/environments/{env['id']}/files?path=/workspace/seed.txt", b"from the snapshot")
        self.assertEqual(status, 200)
        status, snap = MOATD.call("POST", f"/v1/environments/{env['id']}/snapshots", {"name": "fleet base"})
        self.assertEqual(status, 201, snap)
        self.addCleanup(MOATD.call, "DELETE", f"/v1/snapshots/{snap['id']}")
        self.assertEqual(MOATD.call("DELETE", f"/v1/environments/{env['id']}")[0], 204)
        # Each task reads the snapshot's file, writes its own, and answers.
        script = []
        for i in range(2):
            script += [{"tool_calls": [{"name": "read_file", "arguments": {"path": "seed.txt"}},
                                       {"name": "write_file", "arguments": {"path": "mine.txt", "content": f"{i}"}}]},
                       {"text": "done"}]
        d = self.double(script)
        tasks = os.path.join(MOATD.state, f"snapshot-tasks-{self.kind}.jsonl")
        with open(tasks, "w") as f:
            for i in range(2):
                f.write(json.dumps({"id": f"snap-{self.kind}-{i}", "instruction": f"task {i}", "keep_environment": True,
                                    "labels": {"fleet": f"snap-{self.kind}"}}) + "\n")
        code, out, err = self.moat_agent("fleet", tasks, "--parallel", "1", "--snapshot", snap["id"],
                                         "--provider", self.kind, "--model", MODELS[self.kind],
                                         "--base-url", d.url(self.kind), "--api-key-env", "THE_KEY",
                                         key_env={"THE_KEY": PROVIDER_KEY})
        self.assertEqual(code, 0, f"stdout:\n{out}\nstderr:\n{err}")
        lines = [json.loads(line) for line in out.splitlines()]
        self.assertEqual(len(lines), 2, out)
        environments = set()
        for line in lines:
            self.assertEqual(line["state"], "completed", line)
            run = self.get_run(line["run"])
            environments.add(run["environment"])
            self.addCleanup(MOATD.call, "DELETE", f"/v1/environments/{run['environment']}")
            results = [s for s in self.transcript(line["run"]) if s["kind"] == "tool_result"]
            self.assertIn("from the snapshot", results[0]["content"], results)
        self.assertEqual(len(environments), 2, "each task has an environment of its own")
        # Each kept environment holds the snapshot's file and only its own write.
        written = {self.read_file(e, "/workspace/mine.txt")[1] for e in environments}
        self.assertEqual(written, {b"0", b"1"})
        for e in environments:
            self.assertEqual(self.read_file(e, "/workspace/seed.txt"), (200, b"from the snapshot"))
        code, _, err = self.moat_agent("fleet", tasks, "--snapshot", "snap-000000000000", "--provider", self.kind,
                                       "--model", MODELS[self.kind], "--base-url", d.url(self.kind))
        self.assertNotEqual(code, 0)
        self.assertIn("snap-000000000000", err)

    def test_a_spent_token_budget_stops_the_run_before_its_tools(self):
        d = self.double(self.two_step_script())  # the first turn: 11 + 5 tokens and a write_file
        run = self.start_run(self.provider(d), token_budget=16, keep_environment=True)
        run = self.wait_run(run["id"])
        self.assertEqual(run["state"], "stopped", run)
        self.assertIn("token budget of 16 is spent (16 used)", run["error"])
        self.assertEqual(run["iterations"], 1)
        self.assertEqual(len(d.requests()), 1)
        self.assertEqual(self.read_file(run["environment"], HELLO["path"])[0], 404, "its tool call was not run")
        status, body = MOATD.call("POST", "/v1/agents", {"instruction": "x", "provider": self.provider(d),
                                                           "token_budget": 0})
        self.assertEqual((status, body["error"]["field"]), (400, "token_budget"), body)

    def test_a_replay_answers_a_new_run_with_the_recorded_turns(self):
        d = self.double(self.two_step_script())
        first = self.wait_run(self.start_run(self.provider(d))["id"])
        self.assertEqual(first["state"], "completed", first)
        asked = len(d.requests())
        status, replay = MOATD.call("POST", "/v1/agents", {"instruction": INSTRUCTION, "keep_environment": True,
                                                           "provider": {"kind": "replay", "run": first["id"]}})
        self.assertEqual(status, 201, replay)
        self.addCleanup(MOATD.call, "DELETE", f"/v1/environments/{replay['environment']}")
        self.assertEqual(replay["provider"]["kind"], "replay")
        replay = self.wait_run(replay["id"])
        self.assertEqual((replay["state"], replay["result"], replay["iterations"]), ("completed", "wrote it", 2), replay)
        self.assertEqual(len(d.requests()), asked, "a replay asks no provider")
        self.assertEqual(self.read_file(replay["environment"], HELLO["path"]), (200, HELLO["content"].encode()),
                         "its tools ran for real in its own environment")
        status, body = MOATD.call("POST", "/v1/agents", {"instruction": "x",
                                                         "provider": {"kind": "replay", "run": "0123456789ab"}})
        self.assertEqual((status, body["error"]["field"]), (404, "provider.run"), body)

    def test_destroying_its_environment_stops_the_run(self):
        d = self.double([{"hang": True}])
        run = self.start_run(self.provider(d))
        status, _ = MOATD.call("DELETE", f"/v1/environments/{run['environment']}")
        self.assertEqual(status, 204)
        run = self.wait_run(run["id"])
        self.assertEqual(run["state"], "stopped", run)
        self.assertEqual(run["error"], "the environment was destroyed")

    def test_the_key_from_moatds_environment(self):
        d = self.double(self.two_step_script(), api_key=ENV_KEY)
        run = self.start_run(self.provider(d, api_key=None, api_key_env=ENV_KEY_NAME))
        run = self.wait_run(run["id"])
        self.assert_two_steps(run, d, key=ENV_KEY)
        self.assert_key_hidden(run, ENV_KEY)


class OpenAIAgentTest(AgentCases, unittest.TestCase):
    kind = "openai"


class AnthropicAgentTest(AgentCases, unittest.TestCase):
    kind = "anthropic"


class AgentRequestTest(unittest.TestCase):
    """Creates that are refused before anything runs."""

    PROVIDER = {"kind": "openai", "model": "m", "base_url": "http://127.0.0.1:9/v1", "api_key": "sk-unused"}

    def refused(self, body, code, field):
        status, answer = MOATD.call("POST", "/v1/agents", body)
        self.assertEqual(status, 400, answer)
        self.assertEqual((answer["error"]["code"], answer["error"].get("field")), (code, field), answer)

    def test_bad_creates_are_refused(self):
        before = list_runs(self)
        self.refused({"instruction": "x", "provider": self.PROVIDER, "colour": "blue"}, "unknown_field", "colour")
        self.refused({"instruction": "x", "provider": dict(self.PROVIDER, temperature=0.5)}, "unknown_field",
                     "provider.temperature")
        self.refused({"instruction": "x", "provider": dict(self.PROVIDER, kind="gemini")}, "invalid_request",
                     "provider.kind")
        self.assertEqual(list_runs(self), before, "a refused create started a run")

    def test_an_unknown_run_is_404(self):
        for method, path in (("GET", "/v1/agents/0123456789ab"), ("GET", "/v1/agents/0123456789ab/transcript"),
                             ("POST", "/v1/agents/0123456789ab/stop")):
            status, body = MOATD.call(method, path)
            self.assertEqual(status, 404, f"{method} {path}: {body}")


def main():
    global BIN_DIR, MOATD, CERTS, UNTRUSTED
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin-dir", required=True)
    args, rest = parser.parse_known_args()
    if os.geteuid() != 0:
        print("SKIP: agent tests need root (moatd creates namespaces)")
        return 77  # CTest's "skipped" (SKIP_RETURN_CODE), not a pass
    if not shutil.which("openssl"):
        print("FAIL: openssl is missing (scripts/install-deps.sh installs it)")
        return 1
    BIN_DIR = os.path.abspath(args.bin_dir)
    if not os.access(os.path.join(BIN_DIR, "moatd"), os.X_OK):
        print(f"FAIL: {BIN_DIR}/moatd is not built")
        return 1

    def terminated(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, terminated)
    work = tempfile.mkdtemp(prefix="moat-agent-test-")
    try:
        CERTS = make_test_certs(os.path.join(work, "trusted"))
        UNTRUSTED = make_test_certs(os.path.join(work, "untrusted"), common_name="moat untrusted test CA")
        MOATD = Moatd(BIN_DIR, {"SSL_CERT_FILE": CERTS.bundle, ENV_KEY_NAME: ENV_KEY})
        try:
            result = unittest.main(argv=[sys.argv[0], "-v", *rest], exit=False).result
        finally:
            MOATD.stop()
            if MOATD.proc.returncode not in (0, None):
                print(f"moatd exited {MOATD.proc.returncode} on SIGTERM\n{MOATD.log()}")
            MOATD.remove()
    finally:
        shutil.rmtree(work, ignore_errors=True)  # the CA keys and certificates
    return 0 if result.wasSuccessful() and MOATD.proc.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
