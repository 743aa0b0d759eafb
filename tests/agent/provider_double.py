#!/usr/bin/env python3
"""A provider double: a local HTTP(S) server that answers as two model
providers' public APIs do, from a script, and keeps every request it got.

  - OpenAI Chat Completions: POST {prefix}/chat/completions (a client whose
    base_url is http://HOST:PORT/v1 sends /v1/chat/completions), key in
    `Authorization: Bearer KEY`.
  - Anthropic Messages: POST /v1/messages, key in `x-api-key: KEY`, with
    `anthropic-version: 2023-06-01`.

A request's "stream" field picks the answer's form: one JSON body, or
Server-Sent Events sent with chunked transfer encoding, text and tool
arguments split over several events and events split over several chunks
(as the real services do), so a client has to reassemble both.

Requests are checked the way the real services check them (required fields,
tool calls answered by tool results in the right place, no empty text
blocks, ...): a malformed one is answered 400 in the provider's error shape
and uses up no script entry; requests() shows it with its "rejected" reason.

The script, a JSON object (or just its list of entries):

  {"entries": [ENTRY, ...], "repeat_last": false}

Each entry answers the next model request, in order:

  {"text": "..."}                                a final answer
  {"tool_calls": [{"name": "write_file", "arguments": {...}}, ...]}
                                                 tool calls (ids call_N / toolu_N; "id" overrides);
                                                 "text" may come with them
  {"status": 429, "retry_after": 1}, {"status": 500}, ...
                                                 an error in the provider's error shape
  {"context_length": true}                       400: the prompt is too long
  {"hang": true}                                 accepted, never answered until stop()

An answer entry may add "usage": {"input": N, "output": M} (default 10 and 5)
and "finish": "length" (the output token limit was hit). When the entries run
out the double answers {"text": "done"} for ever; with "repeat_last" it
repeats the last entry for ever. A wrong or missing key is 401 and uses up no
entry either.

  provider_double.py SCRIPT.json [--port N] [--api-key KEY] [--tls-cert F --tls-key F] [--log FILE]
  provider_double.py --make-certs DIR    # a test CA and a certificate for 127.0.0.1 / localhost
  provider_double.py --self-test         # both formats, streamed and not; exits 0 or 1

In-process: ProviderDouble(script, tls_cert=None, tls_key=None).start() ->
port; .requests() -> [{path, method, headers (lower-case names), body, time,
status, ...}]; .stop(). make_test_certs(directory) makes the certificates.
Python 3 standard library only.
"""

import argparse
import copy
import http.client
import http.server
import json
import os
import re
import select
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import unittest

DEFAULT_API_KEY = "sk-double-0123456789abcdef"
ANTHROPIC_VERSION = "2023-06-01"
DEFAULT_USAGE = {"input": 10, "output": 5}
TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
ENTRY_KEYS = {"text", "tool_calls", "status", "retry_after", "message", "hang", "context_length", "usage", "finish"}
SYSTEM_CA_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt")


class Rejected(Exception):
    """A request the real service would refuse: (status, message)."""

    def __init__(self, status, message, param=None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


# --- the script ----------------------------------------------------------------


class Script:
    """The entries, handed out one per model request (thread-safe)."""

    def __init__(self, script):
        if isinstance(script, str):
            with open(script) as f:
                script = json.load(f)
        if isinstance(script, list):
            script = {"entries": script}
        unknown = set(script) - {"entries", "repeat_last"}
        if unknown:
            raise ValueError(f"unknown script fields: {sorted(unknown)}")
        self.entries = [self._check(e, i) for i, e in enumerate(script.get("entries", []))]
        self.repeat_last = bool(script.get("repeat_last", False))
        if self.repeat_last and not self.entries:
            raise ValueError("repeat_last needs at least one entry")
        self.used = 0
        self.lock = threading.Lock()

    @staticmethod
    def _check(entry, i):
        if not isinstance(entry, dict):
            raise ValueError(f"entries[{i}]: not an object")
        unknown = set(entry) - ENTRY_KEYS
        if unknown:
            raise ValueError(f"entries[{i}]: unknown fields {sorted(unknown)}")
        kinds = [k for k in ("status", "hang", "context_length") if k in entry]
        if len(kinds) > 1 or (kinds and ("text" in entry or "tool_calls" in entry)):
            raise ValueError(f"entries[{i}]: one of text/tool_calls, status, hang, context_length")
        for call in entry.get("tool_calls", []):
            if not isinstance(call, dict) or not isinstance(call.get("name"), str):
                raise ValueError(f"entries[{i}]: a tool call needs a name")
        return entry

    def next(self):
        with self.lock:
            if self.used < len(self.entries):
                entry = self.entries[self.used]
            elif self.repeat_last:
                entry = self.entries[-1]
            else:
                entry = {"text": "done"}
            self.used += 1
            return entry


def pieces(text, count=3):
    """`text` in up to `count` consecutive non-empty pieces (2 at least when it can)."""
    if not text:
        return []
    size = max(1, -(-len(text) // count))
    return [text[i:i + size] for i in range(0, len(text), size)]


def usage_of(entry):
    u = dict(DEFAULT_USAGE, **entry.get("usage", {}))
    return int(u["input"]), int(u["output"])


# --- OpenAI Chat Completions -----------------------------------------------------


def openai_error(status, message, type_, code=None, param=None):
    return status, {"error": {"message": message, "type": type_, "param": param, "code": code}}


def openai_validate(body):
    """Raises Rejected as the service would (the checks a client can get wrong)."""
    if not isinstance(body, dict):
        raise Rejected(400, "We could not parse the JSON body of your request.")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise Rejected(400, "you must provide a model parameter", "model")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise Rejected(400, "Invalid 'messages': empty array. Expected an array with minimum length 1.", "messages")
    pending = []  # tool call ids of the last assistant message, not yet answered
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise Rejected(400, f"Invalid type for '{where}': expected an object.", where)
        role = m.get("role")
        if role not in ("system", "developer", "user", "assistant", "tool"):
            raise Rejected(400, f"Invalid value: '{role}'. Supported values are: 'system', 'assistant', "
                                f"'user', 'tool', and 'developer'.", f"{where}.role")
        if pending and role != "tool":
            raise Rejected(400, "An assistant message with 'tool_calls' must be followed by tool messages "
                                "responding to each 'tool_call_id'. The following tool_call_ids did not have "
                                f"response messages: {', '.join(pending)}", "messages")
        content = m.get("content")
        if role in ("system", "developer", "user"):
            if not isinstance(content, (str, list)):
                raise Rejected(400, f"Missing required parameter: '{where}.content'.", f"{where}.content")
        elif role == "assistant":
            calls = m.get("tool_calls")
            if content is not None and not isinstance(content, (str, list)):
                raise Rejected(400, f"Invalid type for '{where}.content'.", f"{where}.content")
            if calls is not None:
                if not isinstance(calls, list) or not calls:
                    raise Rejected(400, f"Invalid 'messages[{i}].tool_calls': empty array.", f"{where}.tool_calls")
                for j, c in enumerate(calls):
                    f = c.get("function") if isinstance(c, dict) else None
                    if (not isinstance(c.get("id"), str) or c.get("type") != "function" or not isinstance(f, dict)
                            or not isinstance(f.get("name"), str) or not isinstance(f.get("arguments"), str)):
                        raise Rejected(400, f"Invalid '{where}.tool_calls[{j}]': needs id, type 'function' and "
                                            "function {name, arguments (a string)}.", f"{where}.tool_calls[{j}]")
                    pending.append(c["id"])
            elif content is None:
                raise Rejected(400, f"Invalid value for '{where}.content': expected a string, got null.",
                               f"{where}.content")
        else:  # tool
            if m.get("tool_call_id") not in pending:
                raise Rejected(400, "Invalid parameter: messages with role 'tool' must be a response to a "
                                    "preceeding message with 'tool_calls'.", f"{where}.role")
            pending.remove(m["tool_call_id"])
            if not isinstance(content, (str, list)):
                raise Rejected(400, f"Missing required parameter: '{where}.content'.", f"{where}.content")
    if pending:
        raise Rejected(400, "An assistant message with 'tool_calls' must be followed by tool messages responding "
                            f"to each 'tool_call_id'. The following tool_call_ids did not have response messages: "
                            f"{', '.join(pending)}", "messages")
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise Rejected(400, "Invalid type for 'tools': expected an array.", "tools")
        for i, t in enumerate(tools):
            f = t.get("function") if isinstance(t, dict) else None
            if t.get("type") != "function" or not isinstance(f, dict) or not TOOL_NAME.match(str(f.get("name"))):
                raise Rejected(400, f"Invalid 'tools[{i}]': needs type 'function' and a function name matching "
                                    "'^[a-zA-Z0-9_-]{1,64}$'.", f"tools[{i}]")
            params = f.get("parameters")
            if params is not None and (not isinstance(params, dict) or params.get("type") != "object"):
                raise Rejected(400, f"Invalid schema for function '{f['name']}': schema must be a JSON Schema of "
                                    "'type: \"object\"'.", f"tools[{i}].function.parameters")
    if "stream_options" in body and body.get("stream") is not True:
        raise Rejected(400, "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                       "stream_options")
    for field in ("max_tokens", "max_completion_tokens"):
        if field in body and (not isinstance(body[field], int) or body[field] < 1):
            raise Rejected(400, f"Invalid '{field}': expected an integer of at least 1.", field)


def openai_tool_calls(entry, ids):
    return [{"id": c.get("id") or ids("call"), "type": "function",
             "function": {"name": c["name"], "arguments": json.dumps(c.get("arguments", {}))}}
            for c in entry.get("tool_calls", [])]


def openai_finish(entry):
    if entry.get("finish") == "length":
        return "length"
    return "tool_calls" if entry.get("tool_calls") else "stop"


def openai_completion(entry, calls, model, answer_id):
    input_tokens, output_tokens = usage_of(entry)
    message = {"role": "assistant", "content": entry.get("text"), "refusal": None}
    if calls:
        message["tool_calls"] = calls
    return {"id": answer_id, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": openai_finish(entry)}],
            "usage": {"prompt_tokens": input_tokens, "completion_tokens": output_tokens,
                      "total_tokens": input_tokens + output_tokens},
            "system_fingerprint": "fp_double"}


def openai_chunks(entry, calls, model, answer_id, include_usage):
    """The chunks of a streamed answer, in order (without the [DONE])."""
    created = int(time.time())

    def chunk(delta, finish=None):
        c = {"id": answer_id, "object": "chat.completion.chunk", "created": created, "model": model,
             "system_fingerprint": "fp_double",
             "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
        if include_usage:
            c["usage"] = None
        return c

    out = []
    text = entry.get("text")
    if text is not None:
        out.append(chunk({"role": "assistant", "content": "", "refusal": None}))
        out += [chunk({"content": p}) for p in pieces(text)]
    for i, call in enumerate(calls):
        # The first chunk of a call names it; its arguments follow in pieces.
        first = {"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                                 "function": {"name": call["function"]["name"], "arguments": ""}}]}
        if not out:
            first = dict({"role": "assistant", "content": None}, **first)
        out.append(chunk(first))
        out += [chunk({"tool_calls": [{"index": i, "function": {"arguments": p}}]})
                for p in pieces(call["function"]["arguments"], 4)]
    if not out:
        out.append(chunk({"role": "assistant", "content": ""}))
    out.append(chunk({}, openai_finish(entry)))
    if include_usage:
        input_tokens, output_tokens = usage_of(entry)
        out.append({"id": answer_id, "object": "chat.completion.chunk", "created": created, "model": model,
                    "system_fingerprint": "fp_double", "choices": [],
                    "usage": {"prompt_tokens": input_tokens, "completion_tokens": output_tokens,
                              "total_tokens": input_tokens + output_tokens}})
    return out


# --- Anthropic Messages -----------------------------------------------------------

ANTHROPIC_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                         404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                         500: "api_error", 529: "overloaded_error"}


def anthropic_error(status, message, type_=None):
    return status, {"type": "error", "error": {"type": type_ or ANTHROPIC_ERROR_TYPES.get(status, "api_error"),
                                               "message": message}}


def anthropic_validate(body):
    if not isinstance(body, dict):
        raise Rejected(400, "invalid request: the body is not a JSON object")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise Rejected(400, "model: Field required")
    if not isinstance(body.get("max_tokens"), int) or isinstance(body["max_tokens"], bool) or body["max_tokens"] < 1:
        raise Rejected(400, "max_tokens: Field required (an integer of at least 1)")
    system = body.get("system")
    if system is not None and not isinstance(system, str):
        if not isinstance(system, list) or any(not isinstance(b, dict) or b.get("type") != "text" for b in system):
            raise Rejected(400, "system: Input should be a valid string or a list of text blocks")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise Rejected(400, "messages: Field required (at least one message)")
    previous_uses = []  # tool_use ids of the message before
    for i, m in enumerate(messages):
        where = f"messages.{i}"
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise Rejected(400, f"{where}.role: Input should be 'user' or 'assistant'")
        content = m.get("content")
        if isinstance(content, str):
            if not content and i != len(messages) - 1:
                raise Rejected(400, f"{where}: {m['role']} messages must have non-empty content")
            blocks = []
        elif isinstance(content, list) and content:
            blocks = content
        else:
            raise Rejected(400, f"{where}: {m.get('role')} messages must have non-empty content")
        uses, results = [], []
        for j, b in enumerate(blocks):
            at = f"{where}.content.{j}"
            kind = b.get("type") if isinstance(b, dict) else None
            if kind == "text":
                if not isinstance(b.get("text"), str) or not b["text"]:
                    raise Rejected(400, "messages: text content blocks must be non-empty")
            elif kind == "tool_use":
                if m["role"] != "assistant":
                    raise Rejected(400, f"{at}: tool_use blocks are only allowed in assistant messages")
                if (not isinstance(b.get("id"), str) or not isinstance(b.get("name"), str)
                        or not isinstance(b.get("input"), dict)):
                    raise Rejected(400, f"{at}: a tool_use block needs id, name and an object input")
                uses.append(b["id"])
            elif kind == "tool_result":
                if m["role"] != "user":
                    raise Rejected(400, f"{at}: tool_result blocks are only allowed in user messages")
                if len(results) != j:
                    raise Rejected(400, f"{where}: tool_result blocks must come first in the content, "
                                        "before any other block")
                if b.get("tool_use_id") not in previous_uses:
                    raise Rejected(400, f"{at}: unexpected `tool_use_id` found in `tool_result` blocks: "
                                        f"{b.get('tool_use_id')}. Each `tool_result` block must have a "
                                        "corresponding `tool_use` block in the previous message.")
                rc = b.get("content", "")
                if not isinstance(rc, (str, list)) or (isinstance(rc, list) and any(
                        not isinstance(x, dict) or x.get("type") not in ("text", "image") for x in rc)):
                    raise Rejected(400, f"{at}.content: a string or a list of text and image blocks")
                if "is_error" in b and not isinstance(b["is_error"], bool):
                    raise Rejected(400, f"{at}.is_error: Input should be a valid boolean")
                results.append(b["tool_use_id"])
            elif kind not in ("image", "document", "thinking", "redacted_thinking"):
                raise Rejected(400, f"{at}.type: unknown content block type {kind!r}")
        missing = [u for u in previous_uses if u not in results]
        if missing:
            raise Rejected(400, f"messages.{i - 1}: `tool_use` ids were found without `tool_result` blocks "
                                f"immediately after: {', '.join(missing)}. Each `tool_use` block must have a "
                                "corresponding `tool_result` block in the next message.")
        previous_uses = uses
    if previous_uses:
        raise Rejected(400, f"messages.{len(messages) - 1}: `tool_use` ids were found without `tool_result` "
                            f"blocks immediately after: {', '.join(previous_uses)}.")
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise Rejected(400, "tools: Input should be a valid list")
        for i, t in enumerate(tools):
            if isinstance(t, dict) and t.get("type") not in (None, "custom"):
                continue  # a server tool (web_search, ...)
            if not isinstance(t, dict) or not TOOL_NAME.match(str(t.get("name"))):
                raise Rejected(400, f"tools.{i}.name: String should match pattern '^[a-zA-Z0-9_-]{{1,64}}$'")
            schema = t.get("input_schema")
            if not isinstance(schema, dict) or schema.get("type") != "object":
                raise Rejected(400, f"tools.{i}.input_schema: Input schema must be a JSON Schema of type object")


def anthropic_blocks(entry, ids):
    blocks = []
    if entry.get("text") is not None:
        blocks.append({"type": "text", "text": entry["text"]})
    for c in entry.get("tool_calls", []):
        blocks.append({"type": "tool_use", "id": c.get("id") or ids("toolu"), "name": c["name"],
                       "input": c.get("arguments", {})})
    return blocks


def anthropic_stop(entry):
    if entry.get("finish") == "length":
        return "max_tokens"
    return "tool_use" if entry.get("tool_calls") else "end_turn"


def anthropic_message(entry, blocks, model, answer_id):
    input_tokens, output_tokens = usage_of(entry)
    return {"id": answer_id, "type": "message", "role": "assistant", "model": model, "content": blocks,
            "stop_reason": anthropic_stop(entry), "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens}}


def anthropic_events(entry, blocks, model, answer_id):
    """The (event name, data) pairs of a streamed answer, in order."""
    input_tokens, output_tokens = usage_of(entry)
    out = [("message_start", {"type": "message_start", "message": {
        "id": answer_id, "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": input_tokens, "output_tokens": 1}}})]
    for index, block in enumerate(blocks):
        if block["type"] == "text":
            start = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": p} for p in pieces(block["text"])]
        else:
            start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            # As the service does: an empty piece first, then the JSON in pieces.
            deltas = [{"type": "input_json_delta", "partial_json": p}
                      for p in [""] + pieces(json.dumps(block["input"]), 4)]
        out.append(("content_block_start", {"type": "content_block_start", "index": index, "content_block": start}))
        if index == 0:
            out.append(("ping", {"type": "ping"}))
        out += [("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d}) for d in deltas]
        out.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    if not blocks:
        out.append(("ping", {"type": "ping"}))
    out.append(("message_delta", {"type": "message_delta",
                                  "delta": {"stop_reason": anthropic_stop(entry), "stop_sequence": None},
                                  "usage": {"output_tokens": output_tokens}}))
    out.append(("message_stop", {"type": "message_stop"}))
    return out


# --- the server ---------------------------------------------------------------------


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "provider-double"
    timeout = None

    def do_POST(self):
        self.server.double._handle(self)

    do_GET = do_PUT = do_DELETE = do_POST

    def log_message(self, *args):
        pass


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    double = None
    tls = None

    def finish_request(self, request, client_address):
        # TLS here, in the request's thread: a client that never finishes its
        # handshake holds only its own thread.
        conn = request
        try:
            if self.tls:
                request.settimeout(10)
                conn = self.tls.wrap_socket(request, server_side=True)
                conn.settimeout(None)
        except (ssl.SSLError, OSError) as e:
            self.double._note_tls_failure(e)
            return
        self.double._track(conn, True)
        try:
            self.RequestHandlerClass(conn, client_address, self)
        except (ConnectionError, ssl.SSLError, OSError):
            pass
        finally:
            self.double._track(conn, False)
            if conn is not request:
                try:
                    conn.close()
                except OSError:
                    pass


class ProviderDouble:
    """A scripted OpenAI and Anthropic endpoint on 127.0.0.1 (see the module's docstring)."""

    def __init__(self, script, tls_cert=None, tls_key=None, api_key=DEFAULT_API_KEY, host="127.0.0.1", port=0,
                 chunk_delay=0.003, on_request=None):
        self.script = Script(copy.deepcopy(script) if not isinstance(script, str) else script)
        self.api_key = api_key
        self.host = host
        self.chunk_delay = chunk_delay  # seconds between the pieces of a stream
        self.on_request = on_request    # called with each request's record once answered
        self.tls = None
        if tls_cert:
            self.tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self.tls.load_cert_chain(tls_cert, tls_key)
        self.tls_failures = []  # handshakes that failed (a client that does not trust the certificate)
        self._records = []
        self._lock = threading.Lock()
        self._counters = {}  # per id prefix: call_1, call_2, ...; toolu_1, ...
        self._stopping = threading.Event()
        self._connections = set()
        self._server = None
        self._thread = None
        self.port = port  # 0 until start() picks one

    # --- the Python API ---------------------------------------------------------

    def start(self):
        self._server = _Server((self.host, self.port), _Handler)
        self._server.double = self
        self._server.tls = self.tls
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), name="provider-double",
                                        daemon=True)
        self._thread.start()
        return self.port

    def stop(self):
        """Stops serving; hanging answers end with their connections closed."""
        if not self._server:
            return
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._thread.join(timeout=10)
        self._server = None

    def requests(self):
        """Every request so far, oldest first: {path, method, headers, body, time, status, ...}."""
        with self._lock:
            return copy.deepcopy(self._records)

    def url(self, kind):
        """The base_url a client of `kind` ("openai" or "anthropic") is given."""
        scheme = "https" if self.tls else "http"
        return f"{scheme}://{self.host}:{self.port}" + ("/v1" if kind == "openai" else "")

    # --- the server side -----------------------------------------------------------

    def _track(self, conn, add):
        with self._lock:
            (self._connections.add if add else self._connections.discard)(conn)

    def _note_tls_failure(self, error):
        with self._lock:
            self.tls_failures.append(str(error))

    def _next_id(self, prefix):
        with self._lock:
            n = self._counters[prefix] = self._counters.get(prefix, 0) + 1
            return f"{prefix}_{n}"

    def _read_body(self, h):
        if h.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = b""
            while True:
                size = int(h.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while h.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return data
                data += h.rfile.read(size)
                h.rfile.readline()
        length = int(h.headers.get("Content-Length") or 0)
        return h.rfile.read(length) if length else b""

    def _handle(self, h):
        raw = self._read_body(h)
        record = {"path": h.path, "method": h.command, "time": time.monotonic(),
                  "headers": {k.lower(): v for k, v in h.headers.items()}, "body": None}
        try:
            record["body"] = json.loads(raw) if raw else None
        except ValueError:
            record["raw"] = raw.decode("utf-8", "replace")
        with self._lock:
            self._records.append(record)
        path = h.path.split("?", 1)[0]
        if path.endswith("/chat/completions"):
            kind = "openai"
        elif path == "/v1/messages":
            kind = "anthropic"
        else:
            kind = None
        try:
            self._answer(h, kind, record)
        finally:
            if self.on_request:
                self.on_request(copy.deepcopy(record))

    def _answer(self, h, kind, record):
        headers = record["headers"]
        if kind is None or h.command != "POST":
            status, body = openai_error(404, f"Unknown request URL: {h.command} {h.path}.", "invalid_request_error",
                                        "unknown_url")
            return self._send_json(h, record, status, body)
        # The key first: a wrong one uses up no entry.
        if kind == "openai":
            auth = headers.get("authorization")
            if not auth:
                return self._send_json(h, record, *openai_error(
                    401, "You didn't provide an API key. You need to provide your API key in an Authorization "
                         "header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).", "invalid_request_error"))
            if auth != f"Bearer {self.api_key}":
                return self._send_json(h, record, *openai_error(
                    401, "Incorrect API key provided.", "invalid_request_error", "invalid_api_key"))
        else:
            key = headers.get("x-api-key")
            if not key:
                return self._send_json(h, record, *anthropic_error(401, "x-api-key header is required"))
            if key != self.api_key:
                return self._send_json(h, record, *anthropic_error(401, "invalid x-api-key"))
            if not headers.get("anthropic-version"):
                return self._send_json(h, record, *anthropic_error(400, "anthropic-version: header is required"))
        if "raw" in record or record["body"] is None:
            record["rejected"] = "the body is not JSON"
            if kind == "openai":
                return self._send_json(h, record, *openai_error(
                    400, "We could not parse the JSON body of your request.", "invalid_request_error"))
            return self._send_json(h, record, *anthropic_error(400, "invalid request: the body is not JSON"))
        try:
            (openai_validate if kind == "openai" else anthropic_validate)(record["body"])
        except Rejected as r:
            record["rejected"] = r.message
            if kind == "openai":
                return self._send_json(h, record, *openai_error(r.status, r.message, "invalid_request_error",
                                                                 None, r.param))
            return self._send_json(h, record, *anthropic_error(r.status, r.message))

        entry = self.script.next()
        record["entry"] = entry
        model = record["body"]["model"]
        if entry.get("hang"):
            return self._hang(h, record)
        if entry.get("context_length"):
            if kind == "openai":
                return self._send_json(h, record, *openai_error(
                    400, "This model's maximum context length is 128000 tokens. However, your messages resulted "
                         "in 130000 tokens. Please reduce the length of the messages.", "invalid_request_error",
                    "context_length_exceeded", "messages"))
            return self._send_json(h, record, *anthropic_error(400, "prompt is too long: 210000 tokens > 200000 "
                                                                    "maximum"))
        if "status" in entry:
            status = int(entry["status"])
            extra = {}
            if "retry_after" in entry:
                extra["retry-after"] = str(entry["retry_after"])
            if kind == "openai":
                type_, code = {429: ("requests", "rate_limit_exceeded")}.get(
                    status, ("server_error", None) if status >= 500 else ("invalid_request_error", None))
                message = entry.get("message") or ("Rate limit reached for requests." if status == 429 else
                                                   "The server had an error while processing your request.")
                return self._send_json(h, record, *openai_error(status, message, type_, code), extra=extra)
            message = entry.get("message") or {429: "Number of requests has exceeded your rate limit.",
                                               529: "Overloaded"}.get(status, "Internal server error")
            return self._send_json(h, record, *anthropic_error(status, message), extra=extra)

        stream = record["body"].get("stream") is True
        if kind == "openai":
            calls = openai_tool_calls(entry, self._next_id)
            answer_id = self._next_id("chatcmpl")
            if not stream:
                return self._send_json(h, record, 200, openai_completion(entry, calls, model, answer_id))
            include_usage = bool((record["body"].get("stream_options") or {}).get("include_usage"))
            events = [(None, c) for c in openai_chunks(entry, calls, model, answer_id, include_usage)]
            return self._send_stream(h, record, events, done=True)
        blocks = anthropic_blocks(entry, self._next_id)
        answer_id = self._next_id("msg")
        if not stream:
            return self._send_json(h, record, 200, anthropic_message(entry, blocks, model, answer_id))
        return self._send_stream(h, record, anthropic_events(entry, blocks, model, answer_id), done=False)

    def _send_json(self, h, record, status, body, extra=None):
        data = json.dumps(body).encode()
        record["status"] = status
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.send_header("request-id", self._next_id("req"))
        for k, v in (extra or {}).items():
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(data)

    def _send_stream(self, h, record, events, done):
        """Server-Sent Events in chunked encoding; every other event is split
        over two chunks, so event and chunk boundaries do not line up."""
        record["status"] = 200
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream; charset=utf-8")
        h.send_header("Cache-Control", "no-cache")
        h.send_header("Transfer-Encoding", "chunked")
        h.send_header("request-id", self._next_id("req"))
        h.end_headers()
        frames = [(f"event: {name}\n" if name else "") + "data: " + json.dumps(data, ensure_ascii=False) + "\n\n"
                  for name, data in events]
        if done:
            frames.append("data: [DONE]\n\n")
        for i, frame in enumerate(frames):
            data = frame.encode()
            parts = [data[:len(data) // 2], data[len(data) // 2:]] if i % 2 and len(data) > 8 else [data]
            for part in parts:
                if self._stopping.is_set():
                    return
                h.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
                h.wfile.flush()
                if self.chunk_delay:
                    time.sleep(self.chunk_delay)
        h.wfile.write(b"0\r\n\r\n")
        h.wfile.flush()

    def _hang(self, h, record):
        """Answers nothing until stop() or the client closes the connection;
        record["hang_ended"] says which ("stopped" or "closed")."""
        record["status"] = None
        conn = h.connection
        while not self._stopping.wait(0.05):
            try:
                readable, _, _ = select.select([conn], [], [], 0)
                # Plain: a peek tells a close from data. TLS: anything (a
                # close_notify, a FIN) means the client gave up.
                if readable and (isinstance(conn, ssl.SSLSocket) or not conn.recv(1, socket.MSG_PEEK)):
                    break
            except (OSError, ValueError):
                break
        with self._lock:
            record["hang_ended"] = "stopped" if self._stopping.is_set() else "closed"
            record["hang_ended_at"] = time.monotonic()
        h.close_connection = True


# --- certificates -----------------------------------------------------------------------


class Certs:
    """Files of a test CA and a server certificate signed by it."""

    def __init__(self, directory):
        self.dir = directory
        self.ca = os.path.join(directory, "ca.crt")          # the CA certificate
        self.ca_key = os.path.join(directory, "ca.key")
        self.cert = os.path.join(directory, "server.crt")    # for 127.0.0.1 and localhost
        self.key = os.path.join(directory, "server.key")
        self.bundle = os.path.join(directory, "bundle.crt")  # the system's CAs and this one (SSL_CERT_FILE)


def make_test_certs(directory=None, names=("127.0.0.1", "localhost"), common_name="moat provider double CA"):
    """A CA and a server certificate for `names` (IP addresses or DNS names)
    with the openssl command line, into `directory` (a new temporary one by
    default). Returns Certs; delete its dir when done."""
    directory = directory or tempfile.mkdtemp(prefix="provider-double-certs-")
    os.makedirs(directory, exist_ok=True)
    c = Certs(directory)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]

    def openssl(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True, text=True)

    openssl("req", "-x509", *ec, "-keyout", c.ca_key, "-out", c.ca, "-days", "2", "-subj", f"/CN={common_name}",
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    csr = os.path.join(directory, "server.csr")
    openssl("req", *ec, "-keyout", c.key, "-out", csr, "-subj", f"/CN={names[0]}")
    alt = ",".join(("IP:" if re.fullmatch(r"[0-9.]+|[0-9a-fA-F:]*:[0-9a-fA-F:]*", n) else "DNS:") + n for n in names)
    ext = os.path.join(directory, "server.ext")
    with open(ext, "w") as f:
        f.write(f"subjectAltName={alt}\nbasicConstraints=critical,CA:FALSE\n"
                "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
                "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n")
    openssl("x509", "-req", "-in", csr, "-CA", c.ca, "-CAkey", c.ca_key, "-CAcreateserial", "-out", c.cert,
            "-days", "2", "-extfile", ext)
    with open(c.bundle, "w") as out:
        for system in SYSTEM_CA_BUNDLES:
            if os.path.exists(system):
                with open(system) as f:
                    out.write(f.read().rstrip("\n") + "\n")
                break
        with open(c.ca) as f:
            out.write(f.read())
    return c


# --- the self-test ----------------------------------------------------------------------------


def parse_sse(raw):
    """[(event name or None, data string)] of an event stream."""
    events = []
    for frame in raw.decode().replace("\r\n", "\n").split("\n\n"):
        name, data = None, []
        for line in frame.split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip(" "))
        if data:
            events.append((name, "\n".join(data)))
    return events


class SelfTest(unittest.TestCase):
    """The double against the documented wire formats, with http.client."""

    KEY = "sk-self-test-key"
    TOOLS_OPENAI = [{"type": "function", "function": {"name": "write_file", "description": "Write a file.",
                                                      "parameters": {"type": "object", "properties": {
                                                          "path": {"type": "string"},
                                                          "content": {"type": "string"}}}}}]
    TOOLS_ANTHROPIC = [{"name": "write_file", "description": "Write a file.",
                        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}]
    ARGS = {"path": "/workspace/hello.txt", "content": "hi from the model, with \"quotes\" and ünïcode"}

    def serve(self, script, **kw):
        d = ProviderDouble(script, api_key=self.KEY, **kw)
        d.start()
        self.addCleanup(d.stop)
        return d

    def post(self, d, kind, body, headers=None, context=None, timeout=10):
        if context:
            conn = http.client.HTTPSConnection("127.0.0.1", d.port, context=context, timeout=timeout)
        else:
            conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=timeout)
        if headers is None:
            headers = ({"Authorization": f"Bearer {self.KEY}"} if kind == "openai"
                       else {"x-api-key": self.KEY, "anthropic-version": ANTHROPIC_VERSION})
        path = "/v1/chat/completions" if kind == "openai" else "/v1/messages"
        conn.request("POST", path, json.dumps(body), dict(headers, **{"Content-Type": "application/json"}))
        r = conn.getresponse()
        data = r.read()
        conn.close()
        if r.getheader("Content-Type", "").startswith("text/event-stream"):
            self.assertEqual(r.getheader("Transfer-Encoding"), "chunked")
            return r, parse_sse(data)
        return r, json.loads(data)

    def openai_body(self, messages=None, **kw):
        return dict({"model": "gpt-test", "messages": messages or [
            {"role": "system", "content": "You are terse."}, {"role": "user", "content": "Write the file."}],
            "tools": self.TOOLS_OPENAI}, **kw)

    def anthropic_body(self, messages=None, **kw):
        return dict({"model": "claude-test", "max_tokens": 1024, "system": "You are terse.", "messages": messages or [
            {"role": "user", "content": "Write the file."}], "tools": self.TOOLS_ANTHROPIC}, **kw)

    # --- OpenAI ----------------------------------------------------------------

    def test_openai_not_streamed(self):
        d = self.serve([{"tool_calls": [{"name": "write_file", "arguments": self.ARGS}], "usage": {"input": 7,
                                                                                                 "output": 3}},
                        {"text": "wrote it"}])
        r, body = self.post(d, "openai", self.openai_body())
        self.assertEqual(r.status, 200)
        self.assertEqual(body["object"], "chat.completion")
        self.assertEqual(body["model"], "gpt-test")
        choice = body["choices"][0]
        self.assertEqual(choice["finish_reason"], "tool_calls")
        self.assertIsNone(choice["message"]["content"])
        call = choice["message"]["tool_calls"][0]
        self.assertEqual((call["id"], call["type"], call["function"]["name"]), ("call_1", "function", "write_file"))
        self.assertEqual(json.loads(call["function"]["arguments"]), self.ARGS)
        self.assertEqual(body["usage"], {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10})
        follow = self.openai_body(self.openai_body()["messages"] + [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": "wrote 60 bytes"}])
        r, body = self.post(d, "openai", follow)
        self.assertEqual(r.status, 200, body)
        self.assertEqual(body["choices"][0]["message"]["content"], "wrote it")
        self.assertEqual(body["choices"][0]["finish_reason"], "stop")
        self.assertNotIn("tool_calls", body["choices"][0]["message"])
        seen = d.requests()
        self.assertEqual([s["path"] for s in seen], ["/v1/chat/completions"] * 2)
        self.assertEqual(seen[0]["headers"]["authorization"], f"Bearer {self.KEY}")
        self.assertEqual(seen[1]["body"]["messages"][-1]["tool_call_id"], "call_1")

    def test_openai_streamed(self):
        calls = [{"name": "write_file", "arguments": self.ARGS},
                 {"name": "run_command", "arguments": {"command": "ls -la /workspace"}}]
        d = self.serve([{"text": "Let me write it.", "tool_calls": calls, "usage": {"input": 9, "output": 4}},
                        {"text": "All done: the file is written."}])
        r, events = self.post(d, "openai", self.openai_body(stream=True, stream_options={"include_usage": True}))
        self.assertEqual(r.status, 200)
        self.assertEqual(events[-1], (None, "[DONE]"))
        chunks = [json.loads(data) for _, data in events[:-1]]
        self.assertTrue(all(c["object"] == "chat.completion.chunk" for c in chunks))
        self.assertEqual(chunks[-1]["choices"], [])
        self.assertEqual(chunks[-1]["usage"], {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13})
        text, assembled, finish, arg_pieces = "", {}, None, 0
        for c in chunks[:-1]:
            self.assertIsNone(c["usage"])
            choice = c["choices"][0]
            delta = choice["delta"]
            text += delta.get("content") or ""
            for tc in delta.get("tool_calls", []):
                slot = assembled.setdefault(tc["index"], {"id": None, "name": None, "arguments": ""})
                if "id" in tc:
                    slot["id"], slot["name"] = tc["id"], tc["function"]["name"]
                    self.assertEqual(tc["type"], "function")
                else:
                    arg_pieces += 1
                slot["arguments"] += tc["function"].get("arguments", "")
            finish = choice["finish_reason"] or finish
        self.assertEqual(text, "Let me write it.")
        self.assertEqual(finish, "tool_calls")
        self.assertEqual([assembled[i]["name"] for i in (0, 1)], ["write_file", "run_command"])
        self.assertEqual(assembled[0]["id"], "call_1")
        self.assertEqual(json.loads(assembled[0]["arguments"]), self.ARGS)
        self.assertEqual(json.loads(assembled[1]["arguments"]), {"command": "ls -la /workspace"})
        self.assertGreaterEqual(arg_pieces, 4, "arguments come in several pieces")
        # The next turn, without usage asked for: no usage chunk.
        history = self.openai_body()["messages"] + [
            {"role": "assistant", "content": "Let me write it.", "tool_calls": [
                {"id": assembled[i]["id"], "type": "function",
                 "function": {"name": assembled[i]["name"], "arguments": assembled[i]["arguments"]}}
                for i in (0, 1)]},
            {"role": "tool", "tool_call_id": assembled[0]["id"], "content": "ok"},
            {"role": "tool", "tool_call_id": assembled[1]["id"], "content": "hello.txt"}]
        r, events = self.post(d, "openai", self.openai_body(history, stream=True))
        chunks = [json.loads(data) for _, data in events[:-1]]
        self.assertTrue(all(c["choices"] for c in chunks))
        self.assertEqual("".join(c["choices"][0]["delta"].get("content") or "" for c in chunks),
                         "All done: the file is written.")
        self.assertGreaterEqual(len(chunks), 4, "text comes in several chunks")
        self.assertEqual(chunks[-1]["choices"][0]["finish_reason"], "stop")

    def test_openai_refuses_what_the_service_refuses(self):
        d = self.serve([{"text": "never"}])
        bad = [
            self.openai_body(self.openai_body()["messages"] + [{"role": "tool", "tool_call_id": "x", "content": "?"}]),
            self.openai_body(self.openai_body()["messages"] + [
                {"role": "assistant", "tool_calls": [{"id": "call_9", "type": "function",
                                                      "function": {"name": "write_file", "arguments": "{}"}}]}]),
            self.openai_body(stream_options={"include_usage": True}),
            {"messages": [{"role": "user", "content": "hi"}]},
        ]
        for body in bad:
            r, answer = self.post(d, "openai", body)
            self.assertEqual(r.status, 400, body)
            self.assertEqual(answer["error"]["type"], "invalid_request_error")
        self.assertTrue(all("rejected" in s for s in d.requests()))
        self.assertEqual(d.script.used, 0, "a refused request uses up no entry")

    # --- Anthropic -------------------------------------------------------------------

    def test_anthropic_not_streamed(self):
        d = self.serve([{"tool_calls": [{"name": "write_file", "arguments": self.ARGS}],
                         "usage": {"input": 12, "output": 6}}, {"text": "wrote it", "finish": "length"}])
        r, body = self.post(d, "anthropic", self.anthropic_body())
        self.assertEqual(r.status, 200, body)
        self.assertEqual((body["type"], body["role"], body["model"]), ("message", "assistant", "claude-test"))
        self.assertEqual(body["stop_reason"], "tool_use")
        self.assertIsNone(body["stop_sequence"])
        self.assertEqual(body["content"], [{"type": "tool_use", "id": "toolu_1", "name": "write_file",
                                            "input": self.ARGS}])
        self.assertEqual(body["usage"], {"input_tokens": 12, "output_tokens": 6})
        follow = self.anthropic_body(self.anthropic_body()["messages"] + [
            {"role": "assistant", "content": body["content"]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}]}])
        r, body = self.post(d, "anthropic", follow)
        self.assertEqual(r.status, 200, body)
        self.assertEqual(body["content"], [{"type": "text", "text": "wrote it"}])
        self.assertEqual(body["stop_reason"], "max_tokens")
        seen = d.requests()
        self.assertEqual(seen[0]["headers"]["x-api-key"], self.KEY)
        self.assertEqual(seen[0]["headers"]["anthropic-version"], ANTHROPIC_VERSION)

    def test_anthropic_streamed(self):
        d = self.serve([{"text": "Writing.", "tool_calls": [{"name": "write_file", "arguments": self.ARGS}],
                         "usage": {"input": 20, "output": 8}}, {"text": "All done: the file is written."}])
        r, events = self.post(d, "anthropic", self.anthropic_body(stream=True))
        self.assertEqual(r.status, 200)
        names = [n for n, _ in events]
        self.assertEqual(names[:3], ["message_start", "content_block_start", "ping"])
        self.assertEqual(names[-2:], ["message_delta", "message_stop"])
        data = [json.loads(x) for _, x in events]
        self.assertTrue(all(n == x["type"] for n, x in zip(names, data)))
        start = data[0]["message"]
        self.assertEqual((start["role"], start["content"], start["stop_reason"]), ("assistant", [], None))
        self.assertEqual(start["usage"], {"input_tokens": 20, "output_tokens": 1})
        blocks, json_pieces = {}, 0
        for x in data:
            if x["type"] == "content_block_start":
                blocks[x["index"]] = dict(x["content_block"], partial="")
            elif x["type"] == "content_block_delta":
                b = blocks[x["index"]]
                if x["delta"]["type"] == "text_delta":
                    b["text"] += x["delta"]["text"]
                else:
                    self.assertEqual(x["delta"]["type"], "input_json_delta")
                    b["partial"] += x["delta"]["partial_json"]
                    json_pieces += 1
            elif x["type"] == "content_block_stop" and blocks[x["index"]]["type"] == "tool_use":
                b = blocks[x["index"]]
                self.assertEqual(b["input"], {})
                b["input"] = json.loads(b["partial"])
        self.assertEqual(blocks[0]["text"], "Writing.")
        self.assertEqual((blocks[1]["id"], blocks[1]["name"], blocks[1]["input"]), ("toolu_1", "write_file",
                                                                                    self.ARGS))
        self.assertGreaterEqual(json_pieces, 3, "the input comes in several pieces")
        self.assertEqual(data[-2]["delta"], {"stop_reason": "tool_use", "stop_sequence": None})
        self.assertEqual(data[-2]["usage"], {"output_tokens": 8})
        history = self.anthropic_body()["messages"] + [
            {"role": "assistant", "content": [{"type": "text", "text": "Writing."},
                                              {"type": "tool_use", "id": "toolu_1", "name": "write_file",
                                               "input": self.ARGS}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "denied",
                                          "is_error": True}]}]
        r, events = self.post(d, "anthropic", self.anthropic_body(history, stream=True))
        data = [json.loads(x) for _, x in events]
        text = "".join(x["delta"]["text"] for x in data if x["type"] == "content_block_delta")
        self.assertEqual(text, "All done: the file is written.")
        self.assertGreaterEqual(sum(x["type"] == "content_block_delta" for x in data), 2)
        self.assertEqual(data[-2]["delta"]["stop_reason"], "end_turn")

    def test_anthropic_refuses_what_the_service_refuses(self):
        d = self.serve([{"text": "never"}])
        use = {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_9", "name": "write_file",
                                                 "input": {}}]}
        bad = [
            self.anthropic_body(max_tokens=None),
            self.anthropic_body([{"role": "user", "content": [{"type": "text", "text": ""}]}]),
            self.anthropic_body([{"role": "user", "content": "go"}, use, {"role": "user", "content": "and?"}]),
            self.anthropic_body([{"role": "user", "content": "go"}, use, {"role": "user", "content": [
                {"type": "text", "text": "first"}, {"type": "tool_result", "tool_use_id": "toolu_9"}]}]),
            self.anthropic_body([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1"}]}]),
            self.anthropic_body([{"role": "system", "content": "no"}]),
        ]
        for body in bad:
            r, answer = self.post(d, "anthropic", body)
            self.assertEqual(r.status, 400, body)
            self.assertEqual(answer["type"], "error")
            self.assertEqual(answer["error"]["type"], "invalid_request_error")
        r, answer = self.post(d, "anthropic", self.anthropic_body(), headers={"x-api-key": self.KEY})
        self.assertEqual((r.status, answer["error"]["message"]), (400, "anthropic-version: header is required"))
        self.assertEqual(d.script.used, 0)

    # --- errors, keys, the end of the script --------------------------------------------

    def test_errors_in_each_shape(self):
        script = [{"status": 429, "retry_after": 1}, {"status": 500}, {"context_length": True}] * 2
        d = self.serve(script)
        r, body = self.post(d, "openai", self.openai_body(stream=True))
        self.assertEqual((r.status, r.getheader("retry-after")), (429, "1"))
        self.assertEqual(body["error"]["code"], "rate_limit_exceeded")
        r, body = self.post(d, "openai", self.openai_body())
        self.assertEqual((r.status, body["error"]["type"]), (500, "server_error"))
        r, body = self.post(d, "openai", self.openai_body())
        self.assertEqual((r.status, body["error"]["code"]), (400, "context_length_exceeded"))
        r, body = self.post(d, "anthropic", self.anthropic_body(stream=True))
        self.assertEqual((r.status, r.getheader("retry-after")), (429, "1"))
        self.assertEqual(body, {"type": "error", "error": {"type": "rate_limit_error",
                                                           "message": body["error"]["message"]}})
        r, body = self.post(d, "anthropic", self.anthropic_body())
        self.assertEqual((r.status, body["error"]["type"]), (500, "api_error"))
        r, body = self.post(d, "anthropic", self.anthropic_body())
        self.assertEqual((r.status, body["error"]["type"]), (400, "invalid_request_error"))
        self.assertTrue(body["error"]["message"].startswith("prompt is too long: "))

    def test_a_wrong_key_is_401_and_uses_no_entry(self):
        d = self.serve([{"text": "first"}])
        r, body = self.post(d, "openai", self.openai_body(), headers={"Authorization": "Bearer sk-wrong"})
        self.assertEqual((r.status, body["error"]["code"]), (401, "invalid_api_key"))
        self.assertNotIn("sk-wrong", json.dumps(body))
        r, body = self.post(d, "anthropic", self.anthropic_body(),
                            headers={"x-api-key": "sk-wrong", "anthropic-version": ANTHROPIC_VERSION})
        self.assertEqual((r.status, body["error"]["type"]), (401, "authentication_error"))
        r, body = self.post(d, "anthropic", self.anthropic_body(), headers={"anthropic-version": ANTHROPIC_VERSION})
        self.assertEqual(r.status, 401)
        r, body = self.post(d, "openai", self.openai_body())
        self.assertEqual(body["choices"][0]["message"]["content"], "first")

    def test_end_of_script_and_repeat_last(self):
        d = self.serve([{"text": "only"}])
        answers = [self.post(d, "openai", self.openai_body())[1]["choices"][0]["message"]["content"] for _ in range(3)]
        self.assertEqual(answers, ["only", "done", "done"])
        d = self.serve({"entries": [{"text": "a"}, {"tool_calls": [{"name": "run_command",
                                                                     "arguments": {"command": "true"}}]}],
                        "repeat_last": True})
        stops = [self.post(d, "anthropic", self.anthropic_body())[1]["stop_reason"] for _ in range(4)]
        self.assertEqual(stops, ["end_turn", "tool_use", "tool_use", "tool_use"])
        with self.assertRaises(ValueError):
            Script([{"text": "x", "status": 500}])

    def test_hang_holds_until_stop(self):
        d = self.serve([{"hang": True}])
        outcome = {}

        def ask():
            try:
                self.post(d, "openai", self.openai_body(stream=True), timeout=30)
                outcome["answer"] = True
            except (OSError, http.client.HTTPException) as e:
                outcome["error"] = e
        t = threading.Thread(target=ask)
        t.start()
        deadline = time.monotonic() + 10
        while not d.requests() and time.monotonic() < deadline:
            time.sleep(0.01)
        t.join(0.3)
        self.assertTrue(t.is_alive(), "a hanging answer came back")
        started = time.monotonic()
        d.stop()
        t.join(10)
        self.assertFalse(t.is_alive())
        self.assertLess(time.monotonic() - started, 5)
        self.assertIn("error", outcome)
        self.assertEqual(d.requests()[0]["hang_ended"], "stopped")

    def test_hang_sees_the_client_close(self):
        d = self.serve([{"hang": True}])
        conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=10)
        conn.request("POST", "/v1/messages", json.dumps(self.anthropic_body(stream=True)),
                     {"x-api-key": self.KEY, "anthropic-version": ANTHROPIC_VERSION})
        deadline = time.monotonic() + 10
        while not d.requests() and time.monotonic() < deadline:
            time.sleep(0.01)
        conn.close()
        while "hang_ended" not in d.requests()[0] and time.monotonic() < deadline:
            time.sleep(0.01)
        self.assertEqual(d.requests()[0].get("hang_ended"), "closed")

    def test_tls(self):
        if not shutil.which("openssl"):
            self.skipTest("no openssl command")
        certs = make_test_certs()
        self.addCleanup(shutil.rmtree, certs.dir, True)
        d = self.serve([{"text": "over TLS"}], tls_cert=certs.cert, tls_key=certs.key)
        self.assertTrue(d.url("openai").startswith("https://127.0.0.1:"))
        trusted = ssl.create_default_context(cafile=certs.bundle)
        r, body = self.post(d, "openai", self.openai_body(stream=True), context=trusted)
        self.assertEqual(json.loads(body[-2][1])["choices"][0]["finish_reason"], "stop")
        localhost = http.client.HTTPSConnection("localhost", d.port, context=trusted, timeout=10)
        localhost.request("POST", "/v1/messages", json.dumps(self.anthropic_body()),
                          {"x-api-key": self.KEY, "anthropic-version": ANTHROPIC_VERSION})
        self.assertEqual(localhost.getresponse().status, 200)
        localhost.close()
        with self.assertRaises(ssl.SSLCertVerificationError):
            self.post(d, "openai", self.openai_body(), context=ssl.create_default_context())
        deadline = time.monotonic() + 5
        while not d.tls_failures and time.monotonic() < deadline:
            time.sleep(0.01)
        self.assertTrue(d.tls_failures, "the refused handshake is noted")
        self.assertEqual(len(d.requests()), 2)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("script", nargs="?", help="the script (JSON)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: a free one (printed)")
    parser.add_argument("--api-key", default=DEFAULT_API_KEY)
    parser.add_argument("--tls-cert")
    parser.add_argument("--tls-key")
    parser.add_argument("--log", help="append each request to this file, one JSON line each")
    parser.add_argument("--make-certs", metavar="DIR", help="make a test CA and a server certificate, then exit")
    parser.add_argument("--self-test", action="store_true")
    args = parser.parse_args()
    if args.self_test:
        result = unittest.main(argv=[sys.argv[0], "-v", "SelfTest"], exit=False).result
        return 0 if result.wasSuccessful() else 1
    if args.make_certs:
        c = make_test_certs(args.make_certs)
        print(json.dumps(vars(c), indent=1))
        return 0
    if not args.script:
        parser.error("a script is needed (or --self-test, --make-certs)")
    log = open(args.log, "a") if args.log else None

    def note(record):
        if log:
            log.write(json.dumps(record) + "\n")
            log.flush()
    d = ProviderDouble(args.script, args.tls_cert, args.tls_key, api_key=args.api_key, host=args.host,
                       port=args.port, on_request=note)
    port = d.start()
    print(f"listening on {args.host}:{port}", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        d.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
