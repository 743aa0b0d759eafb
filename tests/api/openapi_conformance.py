#!/usr/bin/env python3
"""OpenAPI conformance: real moatd responses checked against api/openapi.yaml.

Lints the spec (every $ref resolves, JSON and NDJSON bodies have schemas,
request bodies are closed with additionalProperties: false, only OpenAPI 3.0
schema keywords, discriminators match their members, only media types this
checker can validate, 101 and 204 without a body), then starts the built moatd
on a fresh state directory and drives its API over the unix socket
<state>/moatd.sock. Every exchange is checked:

  - the status is the one the test expects, and the spec declares it for that
    path and method (or `default`); undeclared methods must be 405;
  - the Content-Type is one the spec declares for that response, and a JSON
    body validates against its schema (refs resolved); an NDJSON body
    (application/x-ndjson) is one JSON value per newline-ended line, each
    validated against the schema; 101 and 204 have no body; declared response
    headers are there (when required) and match their schemas;
  - a WebSocket upgrade (the shell) is a raw handshake: 101 with the right
    Sec-WebSocket-Accept, then a few frames (text control messages validated
    against ShellClientMessage / ShellServerMessage); refusals are ordinary
    JSON answers;
  - the request itself: a 2xx answer means the spec accepts the request (body
    and query parameters), a 400 unknown_field / invalid_request means the spec
    rejects it too (where a JSON schema can say so);
  - a 403 `forbidden` for lack of a scope names the scope the operation
    declares in `x-moat-scope`;
  - test-specific assertions on the values.

Exchanges use the master token unless they say otherwise; the API-key ones
create scoped keys with it and then call as those keys.

Prints one line per exchange and ends with "N passed, M failed". Exits 0 when
all passed (or when not root: moatd needs root), 1 otherwise.

  openapi_conformance.py --spec api/openapi.yaml --bin-dir build/bin
  openapi_conformance.py --spec api/openapi.yaml --spec-only
"""

import argparse
import base64
import calendar
import copy
import fcntl
import hashlib
import http.client
import io
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
import traceback
import urllib.parse

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
import busybox_tree as busybox  # noqa: E402

try:
    import jsonschema
    import yaml
except ImportError as e:  # a missing dependency is a failure, not a skip
    print(f"FAIL: {e}; install python3-yaml and python3-jsonschema (scripts/install-deps.sh)")
    print("0 passed, 1 failed")
    sys.exit(1)

HTTP_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")

# Keywords of the OpenAPI 3.0 Schema Object. Anything else (propertyNames,
# const, if/then, patternProperties...) is JSON Schema that 3.0 tools ignore.
SCHEMA_KEYWORDS = {
    "title", "multipleOf", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum",
    "maxLength", "minLength", "pattern", "maxItems", "minItems", "uniqueItems",
    "maxProperties", "minProperties", "required", "enum", "type", "allOf", "oneOf", "anyOf",
    "not", "items", "properties", "additionalProperties", "description", "format", "default",
    "nullable", "discriminator", "readOnly", "writeOnly", "xml", "externalDocs", "example",
    "deprecated", "$ref",
}
OAS_ONLY_KEYWORDS = ("nullable", "discriminator", "readOnly", "writeOnly", "xml", "externalDocs",
                     "example", "deprecated")


# The path every API-key endpoint lives under; its operations are for the
# master token only, so they declare no x-moat-scope.
KEYS_PATH = "/v1/keys"
# Other master-token-only paths (no x-moat-scope either).
MASTER_ONLY_PATHS = (KEYS_PATH, "/v1/audit")


def scope_names(doc):
    """The scopes a key can hold: components/schemas/Scope's enum."""
    return doc.get("components", {}).get("schemas", {}).get("Scope", {}).get("enum", [])


# Errors any request can get from the HTTP layer (src/api/http.cc), and the
# preflight's 429 `capacity` for an API key with 256 requests in progress;
# operations declare them as `default`. Every other status must be declared
# explicitly.
TRANSPORT_CODES = {"bad_request", "too_large", "internal", "unavailable", "capacity"}

# The media types this checker can hold a body to. JSON is validated against
# its schema; NDJSON line by line, each line against the schema (which must
# therefore describe JSON objects); text must be UTF-8; octet-stream is bytes.
JSON = "application/json"
NDJSON = "application/x-ndjson"
KNOWN_MEDIA = {JSON, NDJSON, "application/octet-stream", "text/plain", "text/event-stream"}


# moatd's --approval-timeout here: how long an action that asks waits for a
# person before it is denied (and its approval expires).
APPROVAL_TIMEOUT_S = 3
# The whole suite against microVMs (--microvm-all, `make test-microvm`):
# moatd's default isolation is microvm, and every create that names the
# host's tree (or no template) gets this template instead: built from a
# busybox tree (a named template: keys may use it too, not a directory).
ALL_MICROVM = False
ALL_MICROVM_TREE = None


class SpecError(Exception):
    pass


# --- the spec ----------------------------------------------------------------


def resolve_pointer(doc, ref):
    if not isinstance(ref, str) or not ref.startswith("#/"):
        raise SpecError(f"$ref {ref!r}: only local refs (#/...) are supported")
    node = doc
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or part not in node:
            raise SpecError(f"$ref {ref} does not resolve")
        node = node[part]
    return node


def deref(doc, node):
    """Follows $ref chains of a non-schema object (response, parameter...)."""
    seen = set()
    while isinstance(node, dict) and "$ref" in node:
        if node["$ref"] in seen:
            raise SpecError(f"$ref cycle at {node['$ref']}")
        seen.add(node["$ref"])
        node = resolve_pointer(doc, node["$ref"])
    return node


def to_json_schema(doc, schema, stack=()):
    """An OpenAPI 3.0 schema as a self-contained draft-4 JSON Schema: refs
    inlined, `nullable` turned into a null type, OpenAPI-only keywords dropped."""
    if isinstance(schema, list):
        return [to_json_schema(doc, s, stack) for s in schema]
    if not isinstance(schema, dict):
        return schema
    if "$ref" in schema:
        ref = schema["$ref"]
        if ref in stack:
            raise SpecError(f"recursive schema {ref}: not supported by this checker")
        return to_json_schema(doc, resolve_pointer(doc, ref), stack + (ref,))
    out = {}
    for key, value in schema.items():
        if key in OAS_ONLY_KEYWORDS:
            continue
        if key in ("properties",):
            out[key] = {name: to_json_schema(doc, s, stack) for name, s in value.items()}
        elif key in ("items", "additionalProperties", "not", "allOf", "oneOf", "anyOf"):
            out[key] = to_json_schema(doc, value, stack)
        else:
            out[key] = copy.deepcopy(value)
    if schema.get("nullable") is True:
        if "type" in out:
            out["type"] = [out["type"], "null"]
        if "enum" in out and None not in out["enum"]:
            out["enum"] = list(out["enum"]) + [None]
    return out


def walk(node, path=""):
    yield path, node
    if isinstance(node, dict):
        for k, v in node.items():
            yield from walk(v, f"{path}/{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from walk(v, f"{path}/{i}")


def check_schema_keywords(doc, schema, where, problems, seen):
    """Only OpenAPI 3.0 keywords, recursively (refs followed once)."""
    if not isinstance(schema, dict):
        problems.append(f"{where}: a schema must be an object")
        return
    if "$ref" in schema:
        ref = schema["$ref"]
        if ref not in seen:
            seen.add(ref)
            check_schema_keywords(doc, resolve_pointer(doc, ref), ref, problems, seen)
        return
    for key in schema:
        if key not in SCHEMA_KEYWORDS and not key.startswith("x-"):
            problems.append(f"{where}: '{key}' is not an OpenAPI 3.0 schema keyword")
    for key in ("items", "not", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            check_schema_keywords(doc, schema[key], f"{where}/{key}", problems, seen)
    for key in ("allOf", "oneOf", "anyOf"):
        for i, s in enumerate(schema.get(key, [])):
            check_schema_keywords(doc, s, f"{where}/{key}/{i}", problems, seen)
    for name, s in schema.get("properties", {}).items():
        check_schema_keywords(doc, s, f"{where}/properties/{name}", problems, seen)


def closed_objects(schema, where, problems):
    """Every object a request body accepts must reject unknown fields."""
    if not isinstance(schema, dict):
        return
    for sub in schema.get("allOf", []):
        closed_objects(sub, where, problems)
    # Alternatives that are whole objects or arrays (a permission scope: a
    # word or an array of rules) must be closed too; partial ones (a
    # `required` and a property's enum) only constrain the object around them.
    for key in ("oneOf", "anyOf"):
        for i, sub in enumerate(schema.get(key, [])):
            if isinstance(sub, dict) and sub.get("type") in ("object", "array"):
                closed_objects(sub, f"{where}/{key}/{i}", problems)
    if "properties" in schema or schema.get("type") == "object":
        extra = schema.get("additionalProperties", True)
        if "properties" in schema and extra is not False:
            problems.append(f"{where}: request object without additionalProperties: false")
        for name, s in schema.get("properties", {}).items():
            closed_objects(s, f"{where}.{name}", problems)
        if isinstance(extra, dict):
            closed_objects(extra, f"{where}.*", problems)
    if isinstance(schema.get("items"), dict):
        closed_objects(schema["items"], f"{where}[]", problems)


def describes_objects(schema):
    """A (JSON Schema) schema that only JSON objects can match: an NDJSON
    line's schema, where each line is one object."""
    if not isinstance(schema, dict):
        return False
    if schema.get("type") == "object":
        return True
    for key in ("oneOf", "anyOf"):
        if schema.get(key):
            return all(describes_objects(s) for s in schema[key])
    return any(describes_objects(s) for s in schema.get("allOf", []))


def check_discriminator(doc, schema, where, problems):
    """OpenAPI 3.0 discriminators: over a oneOf/anyOf of $refs, with an
    explicit mapping (this project's rule) whose values are exactly those
    members; each member requires the property and fixes it to its mapping
    key. (JSON Schema ignores `discriminator`, so a wrong one would otherwise
    go unnoticed.)"""
    disc = schema.get("discriminator")
    if disc is None:
        return
    name = disc.get("propertyName") if isinstance(disc, dict) else None
    if not name:
        problems.append(f"{where}: discriminator without propertyName")
        return
    members = schema.get("oneOf") or schema.get("anyOf") or []
    refs = [m.get("$ref") for m in members if isinstance(m, dict)]
    if not members or None in refs:
        problems.append(f"{where}: a discriminator needs a oneOf/anyOf of $refs")
        return
    mapping = disc.get("mapping", {})
    if sorted(mapping.values()) != sorted(refs):
        problems.append(f"{where}: discriminator mapping {sorted(mapping.values())} is not its members {sorted(refs)}")
    for value, ref in mapping.items():
        try:
            member = resolve_pointer(doc, ref)
        except SpecError as e:
            problems.append(f"{where}: discriminator mapping {value}: {e}")
            continue
        prop = member.get("properties", {}).get(name, {})
        if name not in member.get("required", []):
            problems.append(f"{ref}: does not require the discriminator property {name}")
        if prop.get("enum") != [value]:
            problems.append(f"{ref}: {name} must be exactly {value!r} (enum: [{value}]), is {prop.get('enum')}")


def lint_spec(doc):
    """Problems that make the spec unusable as the source of truth."""
    problems = []
    if doc.get("openapi") != "3.0.3":
        problems.append(f"openapi is {doc.get('openapi')!r}, expected '3.0.3'")
    for key in ("info", "paths", "components"):
        if key not in doc:
            problems.append(f"missing top-level '{key}'")
    for where, node in walk(doc):
        if isinstance(node, dict) and "$ref" in node:
            try:
                resolve_pointer(doc, node["$ref"])
            except SpecError as e:
                problems.append(f"{where}: {e}")
    if problems:
        return problems
    schemes = doc.get("components", {}).get("securitySchemes", {})
    for req in doc.get("security", []):
        for name in req:
            if name not in schemes:
                problems.append(f"security: unknown scheme {name}")
    if schemes.get("bearerAuth", {}).get("scheme") != "bearer":
        problems.append("components/securitySchemes/bearerAuth must be http bearer")
    for name, schema in doc.get("components", {}).get("schemas", {}).items():
        check_schema_keywords(doc, schema, f"#/components/schemas/{name}", problems, set())
    for where, node in walk(doc.get("components", {}).get("schemas", {}), "#/components/schemas"):
        if isinstance(node, dict) and "discriminator" in node and not where.endswith("/properties"):
            check_discriminator(doc, node, where, problems)
    operation_ids = set()
    for path, item in doc["paths"].items():
        path_params = [deref(doc, p) for p in item.get("parameters", [])]
        for method in HTTP_METHODS:
            if method not in item:
                continue
            op = item[method]
            where = f"{method.upper()} {path}"
            opid = op.get("operationId")
            if not opid:
                problems.append(f"{where}: no operationId")
            elif opid in operation_ids:
                problems.append(f"{where}: duplicate operationId {opid}")
            operation_ids.add(opid)
            params = path_params + [deref(doc, p) for p in op.get("parameters", [])]
            for template in re.findall(r"{([^}]+)}", path):
                if not any(p.get("in") == "path" and p.get("name") == template for p in params):
                    problems.append(f"{where}: path parameter {{{template}}} is not declared")
            for p in params:
                if "schema" not in p:
                    problems.append(f"{where}: parameter {p.get('name')} has no schema")
                else:
                    check_schema_keywords(doc, p["schema"], f"{where} parameter {p.get('name')}",
                                          problems, set())
            secured = op.get("security", doc.get("security", [])) != []
            responses = op.get("responses")
            if not responses:
                problems.append(f"{where}: no responses")
                continue
            if secured and "401" not in responses:
                problems.append(f"{where}: needs a token but declares no 401")
            if secured and "403" not in responses:
                problems.append(f"{where}: an API key can be refused it but it declares no 403")
            scope = op.get("x-moat-scope")
            master_only = any(path == p or path.startswith(p + "/") for p in MASTER_ONLY_PATHS)
            if secured and not master_only and scope not in scope_names(doc):
                problems.append(f"{where}: x-moat-scope {scope!r} is not one of the Scope schema's "
                                f"{scope_names(doc)}")
            if master_only and scope is not None:
                problems.append(f"{where}: master-token-only operations have no x-moat-scope")
            if path != "/healthz" and not secured:
                problems.append(f"{where}: only /healthz may go without a token")
            for status, response in responses.items():
                response = deref(doc, response)
                rwhere = f"{where} -> {status}"
                if "description" not in response:
                    problems.append(f"{rwhere}: no description")
                content = response.get("content", {})
                for header, h in response.get("headers", {}).items():
                    h = deref(doc, h)
                    if "schema" not in h:
                        problems.append(f"{rwhere}: header {header} has no schema")
                    else:
                        check_schema_keywords(doc, h["schema"], f"{rwhere} header {header}", problems, set())
                if status == "101":
                    # Switching Protocols: no body; it names what it switches to.
                    if content:
                        problems.append(f"{rwhere}: a 101 has no body")
                    if "Upgrade" not in response.get("headers", {}):
                        problems.append(f"{rwhere}: a 101 declares the Upgrade header it switches to")
                    if method != "get":
                        problems.append(f"{rwhere}: only a GET can be upgraded to a WebSocket")
                    continue
                if status == "204":
                    if content:
                        problems.append(f"{rwhere}: a 204 has no body")
                    continue
                if not content:
                    problems.append(f"{rwhere}: no content (every response but 101 and 204 has a body)")
                for media, body in content.items():
                    if media not in KNOWN_MEDIA:
                        problems.append(f"{rwhere}: media type {media} is not one this checker can validate "
                                        f"({', '.join(sorted(KNOWN_MEDIA))})")
                    if "schema" not in body:
                        problems.append(f"{rwhere} {media}: no schema")
                    elif media in (JSON, NDJSON):
                        try:
                            schema = to_json_schema(doc, body["schema"])
                            jsonschema.Draft4Validator.check_schema(schema)
                        except (SpecError, jsonschema.SchemaError) as e:
                            problems.append(f"{rwhere}: bad schema: {e}")
                            continue
                        if media == NDJSON and not describes_objects(schema):
                            problems.append(f"{rwhere} {media}: the schema of a line must describe a JSON object")
            if "requestBody" in op:
                rb = deref(doc, op["requestBody"])
                for media, body in rb.get("content", {}).items():
                    if "schema" not in body:
                        problems.append(f"{where} request {media}: no schema")
                    elif media == "application/json":
                        schema = to_json_schema(doc, body["schema"])
                        closed_objects(schema, f"{where} request", problems)
                        if "400" not in responses:
                            problems.append(f"{where}: takes JSON but declares no 400")
    return problems


class Spec:
    def __init__(self, doc):
        self.doc = doc
        self.routes = []  # (regex, template), most literal first
        for template in doc["paths"]:
            regex = "^" + re.sub(r"\\{[^}]+\\}", "[^/]+", re.escape(template)) + "$"
            self.routes.append((re.compile(regex), template))
        self.routes.sort(key=lambda r: r[1].count("{"))

    def template_of(self, path):
        for regex, template in self.routes:
            if regex.match(path):
                return template
        return None

    def operation(self, template, method):
        item = self.doc["paths"].get(template, {}) if template else {}
        return item.get(method.lower())

    def response(self, template, method, status):
        """(response object, name used) for a declared operation."""
        op = self.operation(template, method)
        responses = op["responses"]
        if str(status) in responses:
            return deref(self.doc, responses[str(status)]), f"{status}"
        if "default" in responses:
            return deref(self.doc, responses["default"]), "default"
        return None, None

    def component_response(self, name):
        return deref(self.doc, self.doc["components"]["responses"][name])

    def schema(self, schema):
        return to_json_schema(self.doc, schema)

    def parameters(self, template, method):
        item = self.doc["paths"][template]
        params = {}
        for p in item.get("parameters", []) + self.operation(template, method).get("parameters", []):
            p = deref(self.doc, p)
            params[(p["in"], p["name"])] = p
        return params


# --- talking to moatd ---------------------------------------------------------


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, socket_path, timeout=120):
        super().__init__("localhost", timeout=timeout)
        self.socket_path = socket_path

    def connect(self):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self.socket_path)
        self.sock = sock


def unread(sock):
    """Bytes written to a unix stream socket that its peer has not read yet
    (SIOCOUTQ): 0 once the other end read all of it."""
    return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0]


class Response:
    def __init__(self, status, headers, body, websocket=None):
        self.status = status
        self.headers = headers
        self.body = body
        self.content_type = headers.get("Content-Type", "")
        self.websocket = websocket  # a WebSocket after a 101 the caller kept open
        self.websocket_key = None  # the Sec-WebSocket-Key of a handshake
        self._json = None

    @property
    def json(self):
        if self._json is None:
            self._json = json.loads(self.body)
        return self._json

    @property
    def events(self):
        """An NDJSON body: one JSON value per line, every line ended by \\n."""
        text = self.body.decode("utf-8")
        if text and not text.endswith("\n"):
            raise ValueError(f"the last line is not ended by a newline: {text[-80:]!r}")
        return [json.loads(line) for line in text.split("\n")[:-1]]


def websocket_accept(key):
    """RFC 6455 section 4.2.2: what the server must answer to `key`."""
    digest = hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()
    return base64.b64encode(digest).decode()


class WebSocket:
    """The client end of an upgraded connection: masked frames out, frames in
    (RFC 6455 section 5). Enough for a shell: text, binary, close, ping."""

    def __init__(self, sock, pending=b""):
        self.sock = sock
        self.buffer = pending

    def send(self, opcode, payload):
        payload = payload.encode() if isinstance(payload, str) else payload
        head = bytes([0x80 | opcode])
        n = len(payload)
        if n < 126:
            head += bytes([0x80 | n])
        elif n < 1 << 16:
            head += bytes([0x80 | 126]) + n.to_bytes(2, "big")
        else:
            head += bytes([0x80 | 127]) + n.to_bytes(8, "big")
        mask = os.urandom(4)
        self.sock.sendall(head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))

    def send_text(self, text):
        self.send(0x1, text)

    def send_binary(self, data):
        self.send(0x2, data)

    def _read(self, n, deadline):
        while len(self.buffer) < n:
            left = deadline - time.monotonic()
            try:
                if left <= 0:
                    raise socket.timeout()
                self.sock.settimeout(left)
                chunk = self.sock.recv(65536)
            except socket.timeout:
                raise Failure("no (whole) WebSocket frame from moatd in time") from None
            if not chunk:
                raise ConnectionError("the WebSocket connection closed without a close frame")
            self.buffer += chunk
        out, self.buffer = self.buffer[:n], self.buffer[n:]
        return out

    def receive(self, timeout=10):
        """(opcode, payload) of the next whole message; pings are answered."""
        deadline = time.monotonic() + timeout
        message, first = b"", None
        while True:
            b0, b1 = self._read(2, deadline)
            n = b1 & 0x7F
            if n == 126:
                n = int.from_bytes(self._read(2, deadline), "big")
            elif n == 127:
                n = int.from_bytes(self._read(8, deadline), "big")
            mask = self._read(4, deadline) if b1 & 0x80 else None
            payload = self._read(n, deadline)
            if mask:
                raise Failure("a server frame is masked (RFC 6455 section 5.1 forbids it)")
            opcode = b0 & 0x0F
            if opcode == 0x9:
                self.send(0xA, payload)
                continue
            if opcode >= 0x8:
                return opcode, payload
            first = opcode if first is None else first
            message += payload
            if b0 & 0x80:
                return first, message

    def close(self):
        try:
            self.send(0x8, (1000).to_bytes(2, "big"))
        except OSError:
            pass
        self.sock.close()


def ISOLATION():  # noqa: N802 - what the suite's creates get
    return "microvm" if ALL_MICROVM else "namespaces"


def microvm_create(method, target, body):
    """In --microvm-all, a create of the host's tree (or of none) is one of
    the busybox tree: what a microVM can boot."""
    if not ALL_MICROVM_TREE or method != "POST" or urllib.parse.urlsplit(target).path not in ("/v1/environments",
                                                                                               "/v1/agents"):
        return body
    if body in ("", None):
        return {"template": ALL_MICROVM_TREE}
    if isinstance(body, dict) and "snapshot" not in body and body.get("template", "host") == "host":
        return {**body, "template": ALL_MICROVM_TREE}
    return body


def microvm_template(daemon, tree, name="vm:busybox"):
    """A named template imported from `tree` (an OCI layout umoci makes of
    it, beside it), for --microvm-all: its name, once ready. (umoci's
    repack, not its insert: Debian 12's insert leaves the last file's
    padding out of the layer, which tar and moatd refuse.)"""
    layout, bundle = tree + ".oci", tree + ".bundle"
    for argv in (["umoci", "init", "--layout", layout], ["umoci", "new", "--image", layout + ":b"],
                 ["umoci", "unpack", "--image", layout + ":b", bundle], ["cp", "-a", tree + "/.", bundle + "/rootfs/"],
                 ["umoci", "repack", "--image", layout + ":b", bundle]):
        subprocess.run(argv, check=True, capture_output=True)
    shutil.rmtree(bundle, ignore_errors=True)
    try:
        r = daemon.request("POST", "/v1/templates", json.dumps({"name": name, "source": f"oci:{layout}:b"}))
        if r.status != 202:
            raise RuntimeError(f"importing {name}: {r.status} {r.body[:300]!r}")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            got = daemon.request("GET", "/v1/templates/" + name).json
            if got.get("state") == "ready":
                return name
            if got.get("state") != "importing":
                raise RuntimeError(f"importing {name}: {got}")
            time.sleep(0.1)  # the import runs in moatd; polled as a client does
        raise RuntimeError(f"importing {name}: not ready within 120 s")
    finally:
        shutil.rmtree(layout, ignore_errors=True)


class Moatd:
    def __init__(self, bin_dir):
        self.bin = os.path.join(bin_dir, "moatd")
        self.state = tempfile.mkdtemp(prefix="moatd-api-")
        self.log_path = self.state + ".log"
        self.proc = None
        self.token = ""

    @property
    def socket_path(self):
        return os.path.join(self.state, "moatd.sock")

    def start(self):
        if not os.access(self.bin, os.X_OK):
            raise RuntimeError(f"{self.bin} is not built (cmake --build ... --target moatd moat-init)")
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               "MOAT_STORAGE_GB": "8"}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [self.bin, "--state", self.state, "--listen", "127.0.0.1:0",
                 "--approval-timeout", str(APPROVAL_TIMEOUT_S)] +
                (["--isolation", "microvm"] if ALL_MICROVM else []),
                stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=env)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"moatd exited at start ({self.proc.returncode}):\n{self.log()}")
            try:
                if self.request("GET", "/healthz", token=False).status == 200:
                    break
            except OSError:
                pass
            time.sleep(0.02)
        else:
            raise RuntimeError(f"moatd did not serve /healthz within 30 s:\n{self.log()}")
        with open(os.path.join(self.state, "master-token")) as f:
            self.token = f.read().strip()

    def log(self):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()[-4000:]
        except OSError:
            return ""

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def request(self, method, target, body=None, token=True, headers=None, content_type=None,
                declared_length=None, sent=None):
        conn, r = self.open(method, target, body, token, headers, content_type, declared_length, sent)
        try:
            return Response(r.status, r.headers, r.read())
        finally:
            conn.close()

    def open(self, method, target, body=None, token=True, headers=None, content_type=None,
             declared_length=None, sent=None):
        """Sends the request and reads the answer's head: (connection, response)
        with the body still to read (a followed output stream has its head
        once the stream is established). `sent(socket)` is called once the
        request is written, before the answer is read."""
        conn = UnixHTTPConnection(self.socket_path)
        try:
            conn.putrequest(method, target, skip_accept_encoding=True)
            hdrs = {}
            if token is True:
                hdrs["Authorization"] = f"Bearer {self.token}"
            elif token:
                hdrs["Authorization"] = f"Bearer {token}"
            if body is not None:
                hdrs["Content-Type"] = content_type or "application/json"
            data = body.encode() if isinstance(body, str) else body
            if declared_length is not None:
                hdrs["Content-Length"] = str(declared_length)
            elif data is not None or method in ("POST", "PUT"):
                hdrs["Content-Length"] = str(len(data or b""))
            hdrs.update(headers or {})
            for k, v in hdrs.items():
                conn.putheader(k, v)
            conn.endheaders()
            if data and declared_length is None:
                conn.send(data)
            if sent:
                sent(conn.sock)
            return conn, conn.getresponse()
        except BaseException:
            conn.close()
            raise

    def websocket(self, target, token=True, key=None, keep=False, headers=None):
        """A WebSocket opening handshake over a raw socket (http.client cannot
        hand over an upgraded connection). Any answer but 101 is read whole;
        after a 101, Response.websocket is the open WebSocket when `keep`,
        else the connection is closed at once."""
        key = key or base64.b64encode(os.urandom(16)).decode()
        hdrs = {"Host": "localhost", "Upgrade": "websocket", "Connection": "Upgrade",
                "Sec-WebSocket-Key": key, "Sec-WebSocket-Version": "13"}
        if token is True:
            hdrs["Authorization"] = f"Bearer {self.token}"
        elif token:
            hdrs["Authorization"] = f"Bearer {token}"
        hdrs.update(headers or {})
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(60)
            sock.connect(self.socket_path)
            sock.sendall((f"GET {target} HTTP/1.1\r\n" +
                          "".join(f"{k}: {v}\r\n" for k, v in hdrs.items()) + "\r\n").encode())
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = sock.recv(65536)
                if not chunk:
                    raise ConnectionError(f"closed before the end of the answer's head: {data[:200]!r}")
                data += chunk
            head, rest = data.split(b"\r\n\r\n", 1)
            status_line, _, header_block = head.partition(b"\r\n")
            parts = status_line.decode("latin-1").split(" ", 2)
            if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
                raise ConnectionError(f"not an HTTP status line: {status_line!r}")
            status = int(parts[1])
            msg = http.client.parse_headers(io.BytesIO(header_block + b"\r\n\r\n"))
            if status == 101:
                r = Response(status, msg, b"", WebSocket(sock, rest) if keep else None)
                r.websocket_key = key
                if not keep:
                    sock.close()
                return r
            length = int(msg.get("Content-Length", "0"))
            while len(rest) < length:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                rest += chunk
            sock.close()
            r = Response(status, msg, rest[:length])
            r.websocket_key = key
            return r
        except BaseException:
            sock.close()
            raise

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                print("moatd did not stop within 60 s of SIGTERM; killing it")
                self.proc.kill()
                self.proc.wait()

    def cleanup(self):
        try:
            self.stop()
        finally:
            storage = os.path.join(self.state, "storage")
            subprocess.run(["umount", "-l", storage], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, check=False)
            shutil.rmtree(self.state, ignore_errors=True)
            try:
                os.unlink(self.log_path)
            except OSError:
                pass


# --- the checker --------------------------------------------------------------


class Failure(Exception):
    pass


def expect(cond, message):
    if not cond:
        raise Failure(message)


class Conformance:
    def __init__(self, spec, daemon):
        self.spec = spec
        self.daemon = daemon
        self.passed = 0
        self.failed = 0
        self.failures = []
        self.lock = threading.Lock()

    def report(self, ok, line, detail=""):
        with self.lock:
            self._report(ok, line, detail)

    def _report(self, ok, line, detail):
        if ok:
            self.passed += 1
            print(f"PASS  {line}")
        else:
            self.failed += 1
            print(f"FAIL  {line}\n      {detail}")
            self.failures.append(f"{line}: {detail}")
        sys.stdout.flush()

    def static(self, name, problems):
        self.report(not problems, f"spec: {name}", "\n      ".join(problems))

    def call(self, method, target, body=None, *, status, code=None, field=None, token=True,
             check=None, expressible=True, content_type=None, declared_length=None, note="",
             websocket=False, keep=False, background=False, headers=None, scope_refusal=True, sent=None):
        """One exchange. `body` may be a dict (sent as JSON), str or bytes.
        `expressible=False`: the server rejects the request for a reason a JSON
        schema cannot state (labels keys, base64 stdin...), so the spec accepting
        it is fine. Returns the Response (or None when the request failed).

        `websocket`: a GET with a WebSocket upgrade handshake (`keep`: after a
        101 the Response's `websocket` stays open for `check` to use; it is
        closed after the checks). `background`: the answer's head is read now,
        its body on a thread (a followed stream); returns a function that
        waits for the body (at most `timeout` seconds), checks the exchange and
        returns the Response.

        `headers`: extra request headers; each must be a header parameter the
        operation declares, with a value its schema accepts. `scope_refusal`:
        a 403 `forbidden` to an API key names the operation's x-moat-scope,
        unless False (a refusal for another reason: deciding its own approval).
        `sent(socket)`: called once the request is written (see Moatd.open)."""
        body = microvm_create(method, target, body)
        shown = target if len(target) <= 90 else target[:87] + "..."
        line = (f"{method} {shown}" + (" [WebSocket]" if websocket else "") + f" -> {status}" +
                (f" {code}" if code else "") + (f" ({note})" if note else ""))
        raw = json.dumps(body) if isinstance(body, (dict, list)) else body

        def failed(e):
            alive = "" if self.daemon.alive() else "; moatd is not running:\n" + self.daemon.log()
            self.report(False, line, f"request failed: {e!r}{alive}")

        try:
            if websocket:
                r = self.daemon.websocket(target, token=token, keep=keep, headers=headers)
            elif background:
                conn, head = self.daemon.open(method, target, raw, token=token, content_type=content_type,
                                              declared_length=declared_length, headers=headers)
            else:
                r = self.daemon.request(method, target, raw, token=token, content_type=content_type,
                                        declared_length=declared_length, headers=headers, sent=sent)
        except Exception as e:  # noqa: BLE001 - any transport failure is a failed exchange
            failed(e)
            return (lambda timeout=60: None) if background else None
        if not background:
            return self.judge(line, method, target, raw, r, status=status, code=code, field=field,
                              token=token, check=check, expressible=expressible, headers=headers,
                              scope_refusal=scope_refusal)

        box = {}

        def read_body():
            try:
                box["body"] = head.read()
            except Exception as e:  # noqa: BLE001
                box["error"] = e
            finally:
                conn.close()
        reader = threading.Thread(target=read_body, daemon=True)
        reader.start()

        def finish(timeout=60):
            reader.join(timeout)
            if reader.is_alive():
                try:
                    conn.sock.shutdown(socket.SHUT_RDWR)
                except (OSError, AttributeError):
                    pass
                self.report(False, line, f"the body did not end within {timeout} s")
                return None
            if "error" in box:
                failed(box["error"])
                return None
            r = Response(head.status, head.headers, box["body"])
            return self.judge(line, method, target, raw, r, status=status, code=code, field=field,
                              token=token, check=check, expressible=expressible, headers=headers,
                              scope_refusal=scope_refusal)
        return finish

    def judge(self, line, method, target, raw, r, *, status, code, field, token, check, expressible,
              headers=None, scope_refusal=True):
        """Checks one exchange's answer (see call) and reports it."""
        try:
            declared = self.validate(method, target, raw, r)
            expect(r.status == status,
                   f"status {r.status}, expected {status}: {r.body[:300]!r}")
            if code is not None:
                expect(r.json["error"]["code"] == code,
                       f"error code {r.json['error']['code']!r}, expected {code!r}")
            if field is not None:
                expect(r.json["error"].get("field") == field,
                       f"error field {r.json['error'].get('field')!r}, expected {field!r}")
            if r.status == 400 and code in ("unknown_field", "invalid_request"):
                expect("field" in r.json["error"], f"{code} without error.field")
            if r.status == 101:
                accept = r.headers.get("Sec-WebSocket-Accept")
                expect(accept == websocket_accept(r.websocket_key),
                       f"Sec-WebSocket-Accept {accept!r} does not answer the key {r.websocket_key!r}")
            if scope_refusal:
                self.check_scope(method, target, token, r)
            self.check_headers(method, target, headers)
            self.check_request(method, target, raw, r, expressible)
            if check is not None:
                check(r)
            self.report(True, f"{line}  [{declared}]")
        except Failure as e:
            self.report(False, line, str(e))
        except Exception as e:  # noqa: BLE001 - a broken assertion is a failure too
            self.report(False, line, f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
        finally:
            if r.websocket is not None:
                r.websocket.close()
        return r

    def conforms(self, ref, value, what):
        """`value` against the schema at `ref` (a component), or Failure."""
        schema = self.spec.schema({"$ref": ref})
        errors = sorted(jsonschema.Draft4Validator(schema).iter_errors(value), key=lambda e: list(e.path))
        if errors:
            detail = "; ".join(f"{'/'.join(map(str, e.path)) or '(root)'}: {e.message}" for e in errors[:5])
            raise Failure(f"{what} does not match {ref}: {detail}\n      value: {json.dumps(value)[:400]}")

    def validate(self, method, target, raw, r):
        """The response against the spec; returns what it was checked against."""
        path = urllib.parse.urlsplit(target).path
        template = self.spec.template_of(path)
        op = self.spec.operation(template, method)
        if template is None:
            # Not an API path: moatd answers 404 (or 401 without a token).
            name = "Unauthorized" if r.status == 401 else "NotFound"
            expect(r.status in (401, 404), f"unknown path {path} answered {r.status}")
            response, declared = self.spec.component_response(name), f"components/responses/{name}"
        elif op is None:
            expect(r.status in (401, 405),
                   f"{method} is not declared for {template}, so it must be 405, got {r.status}")
            name = "Unauthorized" if r.status == 401 else "MethodNotAllowed"
            response, declared = self.spec.component_response(name), f"components/responses/{name}"
        else:
            response, status_name = self.spec.response(template, method, r.status)
            expect(response is not None,
                   f"status {r.status} is not declared for {method} {template}: {r.body[:300]!r}")
            declared = f"{method} {template} {status_name}"
            if status_name == "default":
                # `default` is for errors of the transport, not the endpoint's own.
                code = None
                try:
                    code = r.json["error"]["code"]
                except (ValueError, KeyError, TypeError):
                    pass
                expect(code in TRANSPORT_CODES,
                       f"status {r.status} ({code}) is not declared for {method} {template}; "
                       f"only {', '.join(sorted(TRANSPORT_CODES))} may fall to `default`")
        for name, h in response.get("headers", {}).items():
            h = deref(self.spec.doc, h)
            value = r.headers.get(name)
            if value is None:
                expect(not h.get("required"), f"{declared}: required header {name} is missing")
                continue
            errors = list(jsonschema.Draft4Validator(self.spec.schema(h["schema"])).iter_errors(value))
            expect(not errors, f"{declared}: header {name}: {value!r}: {'; '.join(e.message for e in errors)}")
        content = response.get("content", {})
        if not content:
            expect(r.body == b"", f"{declared} has no body, got {r.body[:200]!r}")
            return declared
        media = r.content_type.split(";")[0].strip()
        expect(media in content, f"Content-Type {r.content_type!r} not declared for {declared} "
                                 f"({', '.join(content)})")
        schema = content[media].get("schema")
        if media == JSON:
            try:
                body = r.json
            except ValueError as e:
                raise Failure(f"{declared}: body is not JSON ({e}): {r.body[:200]!r}")
            errors = sorted(jsonschema.Draft4Validator(self.spec.schema(schema)).iter_errors(body),
                            key=lambda e: list(e.path))
            if errors:
                detail = "; ".join(f"{'/'.join(map(str, e.path)) or '(root)'}: {e.message}" for e in errors[:5])
                raise Failure(f"body does not match {declared}: {detail}\n      body: {r.body[:400]!r}")
        elif media == NDJSON:
            # Every line is one JSON value that validates against the schema.
            try:
                events = r.events
            except ValueError as e:
                raise Failure(f"{declared}: body is not NDJSON ({e}): {r.body[:200]!r}")
            validator = jsonschema.Draft4Validator(self.spec.schema(schema))
            for i, event in enumerate(events):
                errors = sorted(validator.iter_errors(event), key=lambda e: list(e.path))
                if errors:
                    detail = "; ".join(f"{'/'.join(map(str, e.path)) or '(root)'}: {e.message}" for e in errors[:5])
                    raise Failure(f"line {i + 1} does not match {declared}: {detail}\n"
                                  f"      line: {json.dumps(event)[:400]}")
        elif media.startswith("text/"):
            try:
                r.body.decode("utf-8")
            except UnicodeDecodeError:
                raise Failure(f"{declared}: text body is not UTF-8")
        return declared

    def check_scope(self, method, target, token, r):
        """An API key refused for lack of a scope: the message names the one
        the operation declares (file 403s from EACCES carry `field` instead)."""
        if r.status != 403 or not isinstance(token, str) or token == self.daemon.token:
            return
        template = self.spec.template_of(urllib.parse.urlsplit(target).path)
        op = self.spec.operation(template, method)
        error = r.json["error"]
        if op is None or "x-moat-scope" not in op or "field" in error or error["code"] != "forbidden":
            return
        scope = op["x-moat-scope"]
        expect(f"'{scope}'" in error["message"],
               f"403 message {error['message']!r} does not name the declared scope {scope!r}")

    def check_headers(self, method, target, headers):
        """Request headers the test adds (Prefer) are header parameters the
        operation declares, with values their schemas accept."""
        if not headers:
            return
        template = self.spec.template_of(urllib.parse.urlsplit(target).path)
        if self.spec.operation(template, method) is None:
            return
        declared = {name.lower(): p for (where, name), p in self.spec.parameters(template, method).items()
                    if where == "header"}
        for name, value in headers.items():
            p = declared.get(name.lower())
            expect(p is not None, f"request header {name} is not a parameter of {method} {template}")
            errors = list(jsonschema.Draft4Validator(self.spec.schema(p["schema"])).iter_errors(value))
            expect(not errors, f"request header {name}: {value!r}: {'; '.join(e.message for e in errors)}")

    def check_request(self, method, target, raw, r, expressible):
        """Accepted requests must be valid by the spec; rejected ones invalid."""
        split = urllib.parse.urlsplit(target)
        template = self.spec.template_of(split.path)
        op = self.spec.operation(template, method)
        if op is None:
            return
        accepted = 200 <= r.status < 300 or r.status == 101
        rejected = r.status == 400 and r.json["error"]["code"] in ("unknown_field", "invalid_request")
        if not (accepted or rejected):
            return
        problems = []
        # Query parameters.
        params = self.spec.parameters(template, method)
        query = urllib.parse.parse_qs(split.query, keep_blank_values=True)
        for (where, name), p in params.items():
            if where == "query" and p.get("required") and name not in query:
                problems.append(f"required query parameter {name} missing")
        for name, values in query.items():
            p = params.get(("query", name))
            if p is None:
                problems.append(f"query parameter {name} is not declared")
                continue
            schema = self.spec.schema(p["schema"])
            value = values if schema.get("type") == "array" else values[-1]
            if schema.get("type") == "integer":
                try:
                    value = int(value)
                except ValueError:
                    pass
            for e in jsonschema.Draft4Validator(schema).iter_errors(value):
                problems.append(f"query {name}: {e.message}")
        for (where, name), p in params.items():
            if where == "path":
                pattern = re.escape(template).replace(re.escape("{" + name + "}"), "(?P<v>[^/]+)")
                pattern = re.sub(r"\\{[^}]+\\}", "[^/]+", pattern)
                m = re.match("^" + pattern + "$", split.path)
                if m:
                    schema = self.spec.schema(p["schema"])
                    value = m.group("v")
                    if schema.get("type") == "integer" and value.isdigit():
                        value = int(value)
                    for e in jsonschema.Draft4Validator(schema).iter_errors(value):
                        problems.append(f"path {name}: {e.message}")
        # The JSON body.
        rb = deref(self.spec.doc, op.get("requestBody", {}))
        json_schema = rb.get("content", {}).get("application/json", {}).get("schema")
        if json_schema is not None:
            body = {} if raw in (None, "") else json.loads(raw)
            if raw in (None, "") and rb.get("required"):
                problems.append("request body is required")
            for e in jsonschema.Draft4Validator(self.spec.schema(json_schema)).iter_errors(body):
                problems.append(f"body {'/'.join(map(str, e.path)) or '(root)'}: {e.message}")
        if accepted:
            expect(not problems, "moatd accepted a request the spec rejects: " + "; ".join(problems))
        elif expressible:
            expect(problems, f"moatd rejected the request ({r.json['error']}) but the spec accepts it")


# --- the exchanges ------------------------------------------------------------


def has(**want):
    """The answer's JSON has these values."""
    def check(r):
        for k, v in want.items():
            expect(r.json.get(k) == v, f"{k} = {r.json.get(k)!r}, expected {v!r}")
    return check


def out(stdout=None, stderr=None, **more):
    """An exec's answer: its stdout, stderr and other values."""
    def check(r):
        j = r.json
        if stdout is not None:
            expect(j["stdout"] == stdout, f"stdout {j['stdout']!r}, expected {stdout!r}")
        if stderr is not None:
            expect(j["stderr"] == stderr, f"stderr {j['stderr']!r}, expected {stderr!r}")
        for k, v in more.items():
            expect(j.get(k) == v, f"{k} = {j.get(k)!r}, expected {v!r}")
    return check


def body_is(data):
    """The answer's body is `data`."""
    return lambda r: expect(r.body == data, f"body {r.body[:100]!r}, expected {data!r}")


def exec_and_file_exchanges(c, base):
    """Exec and files on the running environment at `base` (created with
    env GREETING=hello, a shell and the usual tools): the answers' shapes,
    values and refusals, whatever isolation runs it."""
    ex = base + "/exec"


    c.call("POST", ex, {"cmd": ["sh", "-c", "echo $GREETING; echo err >&2"]}, status=200,
           check=out("hello\n", "err\n", exit_code=0, signal=0, timed_out=False, encoding="utf8"),
           note="success, environment env")
    c.call("POST", ex, {"cmd": ["sh", "-c", "echo $X"], "env": {"X": "per-call"}}, status=200,
           check=out("per-call\n"), note="per-command env")
    c.call("POST", ex, {"cmd": ["cat"], "stdin": "piped in"}, status=200, check=out("piped in"),
           note="stdin")
    c.call("POST", ex, {"cmd": ["sh", "-c", "echo failing >&2; exit 3"]}, status=200,
           check=out("", "failing\n", exit_code=3, signal=0), note="failing command")

    def timed_out(r):
        j = r.json
        expect(j["timed_out"] is True, f"timed_out {j['timed_out']}")
        expect(j["signal"] > 0 and j["exit_code"] == 128 + j["signal"], f"exit {j['exit_code']} signal {j['signal']}")
        expect(j["duration_ms"] < 20000, f"duration_ms {j['duration_ms']}")
    c.call("POST", ex, {"cmd": ["sleep", "30"], "timeout_ms": 300}, status=200, check=timed_out,
           note="timeout")
    c.call("POST", ex, {"cmd": ["printf", "\\377\\376ok"]}, status=200,
           check=out("//5vaw==", "", encoding="base64", exit_code=0), note="non-UTF-8 output")
    c.call("POST", ex, {"cmd": ["cat"], "stdin": base64.b64encode(b"\x00hi").decode(), "encoding": "base64"},
           status=200, check=out("AGhp", "", encoding="base64"), note="base64 requested")

    def not_found(r):
        j = r.json
        expect(j["exit_code"] == 127, f"exit_code {j['exit_code']}")
        expect("not found" in j["stderr"], f"stderr {j['stderr']!r}")
    c.call("POST", ex, {"cmd": ["no-such-command-xyz"]}, status=200, check=not_found,
           note="command not found")

    def truncated(r):
        j = r.json
        expect(j["stdout"] == "x" * 100 and j["stdout_truncated"] is True, f"{len(j['stdout'])} bytes, {j['stdout_truncated']}")
        expect(j["stderr_truncated"] is False, "stderr_truncated")
    c.call("POST", ex, {"cmd": ["sh", "-c", "head -c 5000 /dev/zero | tr '\\0' x"], "output_limit": 100},
           status=200, check=truncated, note="output_limit")
    c.call("POST", ex, {"cmd": ["pwd"], "cwd": "/tmp"}, status=200, check=out("/tmp\n"), note="cwd")

    # Files.
    files = base + "/files"
    c.call("PUT", files + "?path=/workspace/dir/a.txt", b"hello file", content_type="application/octet-stream",
           status=200, check=has(ok=True, path="/workspace/dir/a.txt"), note="parents created")
    c.call("PUT", files + "?path=/workspace/dir/a.txt&append=1", b" more", content_type="application/octet-stream",
           status=200, check=has(ok=True), note="append")
    c.call("GET", files + "?path=/workspace/dir/a.txt", status=200, check=body_is(b"hello file more"))
    c.call("GET", files + "?path=/workspace/dir/a.txt&offset=6&length=4", status=200, check=body_is(b"file"),
           note="range")

    def skipped_to(offset, data):
        def check(r):
            expect(r.headers.get("X-Moat-Offset") == str(offset), f"X-Moat-Offset {r.headers.get('X-Moat-Offset')}")
            expect(r.body[:len(data)] == data, f"body {r.body[:20]!r}")
        return check
    c.call("POST", ex, {"cmd": ["sh", "-c", "truncate -s 64M /workspace/holes && printf x | "
                                            "dd of=/workspace/holes bs=1M seek=32 conv=notrunc 2>/dev/null"]},
           status=200, note="a sparse file")
    c.call("GET", files + "?path=/workspace/holes&skip_holes=1", status=200, check=skipped_to(32 << 20, b"x"),
           note="skip_holes: from the first data")
    c.call("GET", files + "?path=/workspace/holes&skip_holes=1&offset=" + str(33 << 20), status=200,
           check=skipped_to(64 << 20, b""), note="skip_holes: no data after, the end")

    def listing(r):
        j = r.json
        expect(j["path"] == "/workspace/dir", f"path {j['path']}")
        expect([(e["name"], e["type"], e["size"]) for e in j["entries"]] == [("a.txt", "file", 15)],
               f"entries {j['entries']}")
    c.call("GET", files + "/list?path=/workspace/dir", status=200, check=listing)
    c.call("GET", files + "/stat?path=/workspace/dir/a.txt", status=200,
           check=has(name="/workspace/dir/a.txt", type="file", size=15, mode=0o644))
    c.call("GET", files + "/stat?path=/workspace", status=200, check=has(type="dir"))
    c.call("PUT", files + "?path=/workspace/secret&mode=0600", b"s", content_type="application/octet-stream",
           status=200, note="mode")
    c.call("GET", files + "/stat?path=/workspace/secret", status=200, check=has(mode=0o600))
    c.call("POST", files + "/mkdir", {"path": "/workspace/new/deep", "parents": True}, status=200,
           check=has(ok=True, path="/workspace/new/deep"))
    c.call("POST", files + "/mkdir", {"path": "/workspace/new"}, status=400, code="file_error", field="path",
           note="exists")
    c.call("POST", files + "/move", {"from": "/workspace/dir/a.txt", "to": "/workspace/new/deep/b.txt"},
           status=200, check=has(ok=True, path="/workspace/dir/a.txt"))
    c.call("GET", files + "?path=/workspace/dir/a.txt", status=404, code="not_found", field="path",
           note="moved away")
    c.call("GET", files + "/stat?path=/workspace/new/deep/b.txt", status=200, check=has(size=15))
    c.call("GET", files + "/list?path=/workspace/nothing-here", status=404, code="not_found", field="path")
    c.call("DELETE", files + "?path=/workspace/new/deep/b.txt", status=200, check=has(ok=True))
    c.call("DELETE", files + "?path=/workspace/new", status=400, code="file_error", field="path",
           note="not empty")
    c.call("DELETE", files + "?path=/workspace/new&recursive=1", status=200, check=has(ok=True))
    c.call("GET", files + "/stat?path=/workspace/new", status=404, code="not_found")
    c.call("GET", files + "?path=/workspace", status=400, code="file_error", note="a directory")
    c.call("GET", files + "?path=workspace/x", status=400, code="invalid_request", field="path",
           note="relative")
    c.call("GET", files, status=400, code="invalid_request", field="path", note="no path")
    c.call("POST", files + "/mkdir", {"path": "/workspace/m", "mode": 511}, status=400,
           code="unknown_field", field="mode")
    c.call("POST", files + "/mkdir", {"parents": True}, status=400, code="invalid_request", field="path")
    c.call("POST", files + "/move", {"from": "/workspace/secret"}, status=400, code="invalid_request", field="to")
    c.call("POST", files + "/move", {"from": "/workspace/secret", "to": 7}, status=400,
           code="invalid_request", field="to", note="wrong type")
    c.call("PATCH", files + "?path=/workspace/secret", status=405, code="method_not_allowed")
    c.call("GET", files + "/mkdir", status=405, code="method_not_allowed")
    c.call("POST", files + "/stat?path=/workspace", status=405, code="method_not_allowed")
    c.call("PUT", files + "?path=/workspace/big", b"\0" * ((16 << 20) + 1),
           content_type="application/octet-stream", status=413, code="too_large", note="file over 16 MiB")

    # Query parameters are validated like body fields.
    c.call("PUT", files + "?path=/workspace/flag.txt&append=false", b"a", content_type="application/octet-stream",
           status=200, check=has(ok=True))
    c.call("PUT", files + "?path=/workspace/flag.txt&append=true", b"b", content_type="application/octet-stream",
           status=200, check=has(ok=True), note="append=true")
    c.call("GET", files + "?path=/workspace/flag.txt", status=200, check=body_is(b"ab"))
    c.call("PUT", files + "?path=/workspace/flag.txt&append=yes", b"c", content_type="application/octet-stream",
           status=400, code="invalid_request", field="append")
    c.call("PUT", files + "?path=/workspace/m&mode=4755", b"x", content_type="application/octet-stream",
           status=400, code="invalid_request", field="mode", note="setuid bit")
    c.call("PUT", files + "?path=/workspace/m&mode=9", b"x", content_type="application/octet-stream",
           status=400, code="invalid_request", field="mode", note="not octal")
    c.call("GET", files + "?path=/workspace/flag.txt&offset=abc", status=400, code="invalid_request",
           field="offset")
    c.call("DELETE", files + "?path=/workspace/flag.txt&recursive=2", status=400, code="invalid_request",
           field="recursive")
    c.call("GET", files + "/stat?path=/workspace&bogus=1", status=400, code="unknown_field", field="bogus")
    c.call("POST", files + "/mkdir", {"path": "/workspace/p/q", "parents": "yes"}, status=400,
           code="invalid_request", field="parents")
    c.call("GET", base + "?verbose=1", status=400, code="unknown_field", field="verbose")
    c.call("POST", base + "/exec?shell=1", {"cmd": ["true"]}, status=400, code="unknown_field", field="shell",
           note="query parameter")


def run_exchanges(c):
    d = c.daemon
    env = lambda i: f"/v1/environments/{i}"  # noqa: E731

    # Service and authentication.
    c.call("GET", "/healthz", token=False, status=200, check=has(status="ok"))
    c.call("GET", "/v1/environments", token=False, status=401, code="unauthorized")
    c.call("GET", "/v1/environments", token="a" * 64, status=401, code="unauthorized", note="wrong token")
    c.call("GET", "/metrics", token=False, status=401, code="unauthorized")
    c.call("GET", "/metrics", status=200,
           check=lambda r: expect(b"moat_exec_total" in r.body, "no moat_exec_total"))

    # Create, get, list.
    created = {}

    def remember(name):
        def check(r):
            created[name] = r.json["id"]
            expect(r.json["state"] == "running", f"state {r.json['state']}")
        return check

    def env_a(r):
        remember("a")(r)
        j = r.json
        expect(j["task_id"] == "conf-a" and j["template"] == (ALL_MICROVM_TREE or "host"), f"task/template: {j}")
        expect(j["spec"] == {"cpus": 1, "ram_mb": 256, "storage_gb": 1, "pids": 128, "isolation": ISOLATION()},
               f"spec {j['spec']}")
        expect(j["labels"] == {"team": "a", "role": "x"}, f"labels {j['labels']}")
        expect("reason" not in j, "a running environment has no reason")
        expect(j.get("permissions") == DEFAULT_PERMISSIONS and "permission_layers" not in j,
               f"permissions {j.get('permissions')}, layers {j.get('permission_layers')}: expected the defaults")

    c.call("POST", "/v1/environments",
           {"task_id": "conf-a", "template": "host",
            "spec": {"cpus": 1, "ram_mb": 256, "storage_gb": 1, "pids": 128},
            "ttl_s": 600, "labels": {"team": "a", "role": "x"}, "env": {"GREETING": "hello"}},
           status=201, check=env_a)

    def env_b(r):
        remember("b")(r)
        expect(r.json["spec"] == {"cpus": 1, "ram_mb": 1024, "storage_gb": 4, "pids": 1024, "isolation": ISOLATION()},
               f"defaults: {r.json['spec']}")
    c.call("POST", "/v1/environments", "", status=201, check=env_b, note="empty body: defaults")
    a, b = created.get("a", "000000000000"), created.get("b", "000000000000")

    c.call("GET", env(a), status=200, check=has(id=a, state="running"))

    def ids(*want, exact=True):
        def check(r):
            got = [e["id"] for e in r.json["environments"]]
            if exact:
                expect(sorted(got) == sorted(want), f"ids {got}, expected {list(want)}")
            else:
                expect(all(w in got for w in want), f"ids {got} lack {list(want)}")
        return check

    def newest_first(r):
        got = [e["id"] for e in r.json["environments"]]
        expect(got == [b, a], f"order {got}, expected newest first {[b, a]}")
    c.call("GET", "/v1/environments", status=200, check=newest_first)
    c.call("GET", "/v1/environments?label=team%3Da", status=200, check=ids(a))
    c.call("GET", "/v1/environments?label=team=a&label=role=x", status=200, check=ids(a))
    c.call("GET", "/v1/environments?label=team=a&label=role=y", status=200, check=ids())
    c.call("GET", "/v1/environments?task_id=conf-a", status=200, check=ids(a))
    c.call("GET", "/v1/environments?state=running", status=200, check=ids(a, b))
    c.call("GET", "/v1/environments?label=team", status=400, code="invalid_request", field="label")
    c.call("GET", "/v1/environments?state=sleeping", status=400, code="invalid_request", field="state")
    c.call("GET", "/v1/environments?colour=red", status=400, code="unknown_field", field="colour")

    # Exec.
    exec_and_file_exchanges(c, env(a))
    ex = env(a) + "/exec"

    # Processes (docs/API.md "Processes"): commands in the background whose
    # output moatd keeps and serves as NDJSON events from any offset; stdin,
    # signals, terminals. Every body line is validated against
    # ProcessOutputEvent by `validate`; `stream` checks what the spec says in
    # prose about the events (contiguous offsets, one final event, encodings).
    procs = env(a) + "/processes"
    pids = {}
    no_pid = 999999  # used when a start failed: the dependent exchanges then fail too

    def proc(name, action=""):
        return f"{procs}/{pids.get(name, no_pid)}" + (f"/{action}" if action else "")

    optional_by_state = {"starting": set(), "running": set(),
                         "exited": {"ended_at", "exit_code", "signal", "timed_out", "duration_ms"},
                         "failed": {"ended_at", "exit_code", "error"},
                         "lost": {"ended_at", "reason"}}

    def process_shape(p):
        """What the Process schema says in prose: optional fields by state, sums."""
        have = set(p) & set().union(*optional_by_state.values())
        want = optional_by_state[p["state"]]
        expect(have == want, f"process {p['id']} ({p['state']}) has {sorted(have)}, expected {sorted(want)}")
        expect(p["output_offset"] == p["stdout_bytes"] + p["stderr_bytes"],
               f"output_offset {p['output_offset']} is not stdout_bytes + stderr_bytes")
        expect(p["stdout_dropped"] <= p["stdout_bytes"] and p["stderr_dropped"] <= p["stderr_bytes"],
               f"more dropped than written: {p}")
        if p["state"] in ("exited", "failed", "lost"):
            expect(p["stdin_open"] is False, "an ended process's stdin is open")
            expect(p["ended_at"] >= p["started_at"], f"ended_at {p['ended_at']} before started_at")
        if p["state"] in ("running", "exited"):
            expect(p["pid"] > 0, f"pid {p['pid']} of a started process")
        if p["state"] == "exited":
            expect(p["exit_code"] == (128 + p["signal"] if p["signal"] else p["exit_code"]) and
                   0 <= p["exit_code"] <= 255, f"exit_code {p['exit_code']} with signal {p['signal']}")
        if p["state"] == "failed":
            expect(p["pid"] == 0 and p["exit_code"] in (126, 127), f"failed start: pid {p['pid']}, "
                   f"exit_code {p['exit_code']}")
        if p["pty"]:
            expect(p["stderr_bytes"] == 0, "a terminal has no stderr")

    def matches(got, want):
        if isinstance(want, tuple):
            return got in want
        if callable(want):
            return want(got)
        return got == want

    def is_process(name=None, **want):
        def check(r):
            p = r.json
            if name is not None:
                pids[name] = p["id"]
            process_shape(p)
            for k, v in want.items():
                expect(matches(p.get(k), v), f"{k} = {p.get(k)!r}, expected {v!r}")
        return check

    def decoded(e):
        return base64.b64decode(e["data"], validate=True) if e["encoding"] == "base64" else e["data"].encode()

    def valid_utf8(data):
        try:
            data.decode("utf-8")
            return True
        except UnicodeDecodeError:
            return False

    def stream(since=0, final="exit", length=None, stdout=None, stderr=None, contains=(), dropped=None,
               base64_only=False, heartbeat=False, **final_fields):
        """An output body: events at contiguous offsets from `since`; `final`
        (exit, end, or None: none) last and only once; `data` base64 exactly
        when asked for or not UTF-8; the bytes of each stream."""
        def check(r):
            events = r.events
            pos, out, lost = since, {"stdout": b"", "stderr": b""}, 0
            finals = [i for i, e in enumerate(events) if e["type"] in ("exit", "end")]
            if final is None:
                expect(not finals, f"a final event from a running process: {[events[i] for i in finals]}")
            else:
                expect(finals == [len(events) - 1] and events[-1]["type"] == final,
                       f"expected exactly one final {final!r} event, last; got "
                       f"{[e['type'] for e in events][-5:]}")
            for e in events:
                expect(e["offset"] == pos, f"{e['type']} event at offset {e['offset']}, expected {pos}: "
                                           f"offsets are contiguous")
                if e["type"] == "output":
                    data = decoded(e)
                    expect(e["encoding"] == ("base64" if base64_only or not valid_utf8(data) else "utf8"),
                           f"encoding {e['encoding']} for {data[:40]!r}")
                    out[e["stream"]] += data
                    pos += len(data)
                elif e["type"] == "dropped":
                    lost += e["bytes"]
                    pos += e["bytes"]
            if length is not None:
                expect(pos - since == length, f"{pos - since} bytes from offset {since}, expected {length}")
            if dropped is not None:
                expect(lost == dropped, f"{lost} bytes dropped, expected {dropped}")
            for name, want in (("stdout", stdout), ("stderr", stderr)):
                if want is not None:
                    expect(out[name] == want, f"{name} {out[name][:200]!r}, expected {want[:200]!r}")
            at = -1
            for needle in contains:
                found = out["stdout"].find(needle, at + 1)
                expect(found > at, f"{needle!r} not in stdout (after what came before): {out['stdout'][-300:]!r}")
                at = found
            if heartbeat:
                expect(any(e["type"] == "heartbeat" for e in events), "no heartbeat")
            if final is not None:
                last = events[-1]
                if final == "exit":
                    ran = last["state"] == "exited"
                    expect(("signal" in last) == ran and ("timed_out" in last) == ran,
                           f"signal and timed_out are there exactly when the process ran: {last}")
                for k, v in final_fields.items():
                    expect(matches(last.get(k), v), f"final {k} = {last.get(k)!r}, expected {v!r}")
        return check

    def message_has(text):
        return lambda r: expect(text in r.json["error"]["message"], f"message {r.json['error']['message']!r}")

    def wait_output(name, needle, timeout=15):
        """Polls a process's output until `needle` shows (the next check says if it did not)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            r = d.request("GET", proc(name, "output"))
            if r.status == 200 and needle in b"".join(
                    decoded(e) for e in r.events if e["type"] == "output"):
                return
            time.sleep(0.05)

    # A follower of a process in `b` hears `end` when `b` is destroyed (below);
    # the 32 processes that may run in `b` are started meanwhile.
    bprocs = env(b) + "/processes"
    follower = {}

    def follow_b(r):
        follower["id"] = r.json["id"]
        is_process(state="running")(r)
    c.call("POST", bprocs, {"cmd": ["sh", "-c", "echo started; exec sleep 600"]}, status=201, check=follow_b)
    follow_end = c.call("GET", f"{bprocs}/{follower.get('id', no_pid)}/output?follow=1", background=True,
                        status=200, check=stream(stdout=b"started\n", final="end", heartbeat=True, state="lost",
                                                 reason="the environment was destroyed", length=8),
                        note="followed: heartbeat, then end when the environment is destroyed")
    follow_started = time.monotonic()
    problems = []
    for _ in range(31):
        raw = json.dumps({"cmd": ["sleep", "600"]})
        r = d.request("POST", bprocs, raw)
        try:
            expect(r.status == 201, f"status {r.status}: {r.body[:200]!r}")
            c.validate("POST", bprocs, raw, r)
        except Failure as e:
            problems.append(str(e))
    c.report(not problems, f"POST {bprocs} -> 201 x31 (32 processes may run)", "; ".join(problems[:3]))
    c.call("POST", bprocs, {"cmd": ["true"]}, status=429, code="capacity", note="a 33rd running process")
    c.call("POST", env(b) + "/exec", {"cmd": ["true"]}, status=200, note="a blocking exec does not count")
    c.call("GET", env(b) + "/shell", websocket=True, status=429, code="capacity", note="a shell counts too")

    def running(n):
        def check(r):
            states = [p["state"] for p in r.json["processes"]]
            expect(states == ["running"] * n, f"states {states}, expected {n} running")
        return check
    c.call("GET", bprocs, status=200, check=running(32))

    # Start, follow to the exit, read again, from an offset.
    echo = ["sh", "-c", "echo out; echo err >&2"]
    c.call("POST", procs, {"cmd": echo}, status=201,
           check=is_process("echo", cmd=echo, kind="process", pty=False, state=("running", "exited")))
    c.call("GET", proc("echo", "output?follow=1"), status=200,
           check=stream(stdout=b"out\n", stderr=b"err\n", length=8, state="exited", exit_code=0, signal=0,
                        timed_out=False), note="follow to the exit")
    c.call("GET", proc("echo"), status=200,
           check=is_process(state="exited", exit_code=0, signal=0, timed_out=False, stdout_bytes=4,
                            stderr_bytes=4, output_offset=8, stdout_dropped=0))
    c.call("GET", proc("echo", "output"), status=200, check=stream(stdout=b"out\n", stderr=b"err\n", exit_code=0),
           note="without follow: all there is, then the exit")
    c.call("GET", proc("echo", "output?since=4&encoding=base64&follow=0"), status=200,
           check=stream(since=4, length=4, base64_only=True, exit_code=0), note="from an offset, base64")
    c.call("GET", proc("echo", "output?since=8"), status=200, check=stream(since=8, length=0, exit_code=0),
           note="caught up: only the exit")

    # A start that fails is an answer, not an error.
    def error_says(text):
        return lambda r: expect(r.json["error"].startswith(text), f"error {r.json['error']!r}")
    c.call("POST", procs, {"cmd": ["no-such-command-xyz"]}, status=201,
           check=lambda r: (is_process("missing", state="failed", exit_code=127, pid=0)(r),
                            error_says("command not found: no-such-command-xyz")(r)),
           note="command not found")
    c.call("POST", procs, {"cmd": ["/etc/hostname"]}, status=201,
           check=lambda r: (is_process("noexec", state="failed", exit_code=126)(r), error_says("cannot run")(r)),
           note="not executable")
    c.call("GET", proc("missing", "output?follow=1"), status=200,
           check=stream(length=0, state="failed", exit_code=127), note="a failed start's exit")

    # env, cwd, timeout.
    c.call("POST", procs, {"cmd": ["sh", "-c", "echo $X $GREETING; pwd"], "env": {"X": "own"}, "cwd": "/tmp"},
           status=201, check=is_process("envcwd"))
    c.call("GET", proc("envcwd", "output?follow=1"), status=200,
           check=stream(stdout=b"own hello\n/tmp\n", stderr=b"", exit_code=0), note="env and cwd")
    c.call("POST", procs, {"cmd": ["sleep", "30"], "timeout_ms": 300}, status=201, check=is_process("slow"))
    c.call("GET", proc("slow", "output?follow=1"), status=200,
           check=stream(length=0, state="exited", timed_out=True, signal=lambda s: s > 0,
                        exit_code=lambda e: e > 128), note="timeout_ms")

    # stdin through cat: text, base64, close (EOF).
    c.call("POST", procs, {"cmd": ["cat"]}, status=201, check=is_process("cat", state="running", stdin_open=True))
    c.call("GET", proc("cat", "output"), status=200, check=stream(final=None, length=0),
           note="running, silent: an empty body")
    c.call("POST", proc("cat", "stdin"), {"data": "hello\n"}, status=204)
    c.call("POST", proc("cat", "stdin"), {"data": base64.b64encode(b"\xff\xfe\n").decode(), "encoding": "base64"},
           status=204, note="base64")
    c.call("POST", proc("cat", "stdin"), {"close": True}, status=204, note="close: EOF")
    c.call("GET", proc("cat", "output?follow=1"), status=200,
           check=stream(stdout=b"hello\n\xff\xfe\n", stderr=b"", exit_code=0),
           note="what was written (not UTF-8: base64), then the exit")
    c.call("POST", proc("cat", "stdin"), {"data": "late"}, status=409, code="conflict", check=message_has("ended"),
           note="the process ended")

    # Signals, closed stdin, no terminal.
    c.call("POST", procs, {"cmd": ["sleep", "600"]}, status=201, check=is_process("sleep", stdin_open=True))
    c.call("POST", proc("sleep", "stdin"), {"close": True}, status=204)
    c.call("GET", proc("sleep"), status=200, check=is_process(state="running", stdin_open=False), note="stdin closed")
    c.call("POST", proc("sleep", "stdin"), {"data": "x"}, status=409, code="conflict", check=message_has("closed"),
           note="stdin closed")
    c.call("POST", procs, {"cmd": ["sleep", "600"], "stdin": False}, status=201,
           check=is_process("sleep2", state="running", stdin_open=False))
    c.call("POST", proc("sleep2", "stdin"), {"data": "x"}, status=409, code="conflict", note="no stdin")
    c.call("POST", proc("sleep", "resize"), {"rows": 40, "cols": 120}, status=409, code="conflict",
           check=message_has("terminal"), note="no terminal")
    c.call("POST", proc("sleep", "signal"), {"signal": "NOPE"}, status=400, code="invalid_request", field="signal")
    c.call("POST", proc("sleep", "signal"), {"signal": "term"}, status=400, code="invalid_request", field="signal",
           note="names are upper case")
    c.call("POST", proc("sleep", "signal"), {"signal": "IO"}, status=400, code="invalid_request", field="signal",
           note="an alias")
    c.call("POST", proc("sleep", "signal"), {"signal": 65}, status=400, code="invalid_request", field="signal")
    c.call("POST", proc("sleep", "signal"), {"signal": 0}, status=400, code="invalid_request", field="signal")
    c.call("POST", proc("sleep", "signal"), {"signal": 15.5}, status=400, code="invalid_request", field="signal")
    c.call("POST", proc("sleep", "signal"), {}, status=400, code="invalid_request", field="signal", note="none")
    c.call("POST", proc("sleep", "signal"), {"signal": "TERM", "group": False}, status=400, code="unknown_field",
           field="group")
    c.call("POST", proc("sleep", "signal"), {"signal": "SIGTERM"}, status=204, note="by name")
    c.call("GET", proc("sleep", "output?follow=1"), status=200,
           check=stream(length=0, state="exited", exit_code=143, signal=15, timed_out=False), note="killed by TERM")
    c.call("POST", proc("sleep", "signal"), {"signal": "TERM"}, status=409, code="conflict", check=message_has("ended"),
           note="the process ended")
    c.call("POST", proc("sleep", "resize"), {"rows": 40, "cols": 120}, status=409, code="conflict",
           note="the process ended")
    c.call("GET", proc("sleep"), status=200, check=is_process(state="exited", exit_code=143, signal=15))
    c.call("POST", proc("sleep2", "signal"), {"signal": 9}, status=204, note="by number")
    c.call("GET", proc("sleep2", "output?follow=1"), status=200, check=stream(exit_code=137, signal=9),
           note="killed by 9")

    # A terminal: TERM, the size asked for, resize.
    tty_script = 'echo "term=$TERM"; read x; stty size; read y; stty size'
    c.call("POST", procs, {"cmd": ["sh", "-c", tty_script], "pty": True, "rows": 30, "cols": 100}, status=201,
           check=is_process("tty", pty=True, stdin_open=True))
    c.call("POST", proc("tty", "stdin"), {"data": "a\n"}, status=204)
    wait_output("tty", b"30 100")
    c.call("POST", proc("tty", "resize"), {"rows": 40, "cols": 120}, status=204)
    c.call("POST", proc("tty", "stdin"), {"data": "b\n"}, status=204)

    def one_stream(r):
        expect({e["stream"] for e in r.events if e["type"] == "output"} == {"stdout"}, "a terminal is all stdout")
    c.call("GET", proc("tty", "output?follow=1"), status=200,
           check=lambda r: (stream(stderr=b"", contains=(b"term=xterm-256color", b"30 100", b"40 120"),
                                   exit_code=0)(r), one_stream(r)),
           note="TERM, rows and cols, then the resize")
    c.call("POST", procs, {"cmd": ["cat"], "pty": True, "stdin": False}, status=201,
           check=is_process("ptycat", pty=True, stdin_open=True, state="running"),
           note="a terminal is always the input")

    # Output beyond the 1 MiB kept per stream is reported dropped, not spliced.
    big = "head -c 1500000 /dev/zero | tr '\\0' x; echo done >&2"
    kept = 1 << 20
    c.call("POST", procs, {"cmd": ["sh", "-c", big]}, status=201, check=is_process("big"))
    c.call("GET", proc("big", "output?follow=1"), status=200, check=stream(length=1500005, exit_code=0),
           note="1.5 MB followed")
    c.call("GET", proc("big", "output"), status=200,
           check=stream(length=1500005, dropped=1500000 - kept, stdout=b"x" * kept, stderr=b"done\n", exit_code=0),
           note="the last 1 MiB and what was dropped")
    c.call("GET", proc("big"), status=200,
           check=is_process(stdout_bytes=1500000, stdout_dropped=1500000 - kept, stderr_bytes=5, stderr_dropped=0,
                            output_offset=1500005))

    # The list, by id.
    def listed(r):
        got = [p["id"] for p in r.json["processes"]]
        expect(got == sorted(got), f"not by id: {got}")
        for name in ("echo", "missing", "noexec", "envcwd", "slow", "cat", "sleep", "sleep2", "tty", "ptycat", "big"):
            expect(pids.get(name) in got, f"{name} (id {pids.get(name)}) not listed: {got}")
        for p in r.json["processes"]:
            process_shape(p)
            expect(p["kind"] == "process", f"kind {p['kind']}")
    c.call("GET", procs, status=200, check=listed)

    # Request errors.
    c.call("POST", procs, {"cmd": ["true"], "shell": True}, status=400, code="unknown_field", field="shell")
    c.call("POST", procs, {}, status=400, code="invalid_request", field="cmd", note="no cmd (a template without Entrypoint or Cmd)", expressible=False)
    c.call("POST", procs, {"cmd": []}, status=400, code="invalid_request", field="cmd")
    c.call("POST", procs, {"cmd": ["ls", 5]}, status=400, code="invalid_request", field="cmd[1]")
    c.call("POST", procs, {"cmd": ["true"], "pty": "yes"}, status=400, code="invalid_request", field="pty")
    c.call("POST", procs, {"cmd": ["true"], "stdin": 1}, status=400, code="invalid_request", field="stdin")
    c.call("POST", procs, {"cmd": ["true"], "rows": 40}, status=400, code="invalid_request", field="rows",
           note="rows without pty")
    c.call("POST", procs, {"cmd": ["true"], "pty": False, "cols": 80}, status=400, code="invalid_request",
           field="cols", note="cols without pty")
    c.call("POST", procs, {"cmd": ["true"], "pty": True, "cols": 1001}, status=400, code="invalid_request",
           field="cols")
    c.call("POST", procs, {"cmd": ["true"], "pty": True, "rows": 2.5}, status=400, code="invalid_request",
           field="rows")
    c.call("POST", procs, {"cmd": ["true"], "timeout_ms": 0}, status=400, code="invalid_request", field="timeout_ms")
    c.call("POST", procs, {"cmd": ["true"], "timeout_ms": 604800001}, status=400, code="invalid_request",
           field="timeout_ms")
    c.call("POST", procs, {"cmd": ["true"], "cwd": "tmp"}, status=400, code="invalid_request", field="cwd")
    c.call("POST", procs, {"cmd": ["true"], "env": {"A": 1}}, status=400, code="invalid_request", field="env.A")
    c.call("POST", procs, "{not json", status=400, code="bad_json")
    c.call("POST", procs + "?detach=1", {"cmd": ["true"]}, status=400, code="unknown_field", field="detach")
    c.call("GET", procs + "?state=running", status=400, code="unknown_field", field="state")
    c.call("GET", proc("echo") + "?verbose=1", status=400, code="unknown_field", field="verbose")
    c.call("GET", proc("echo", "output?tail=1"), status=400, code="unknown_field", field="tail")
    c.call("GET", proc("echo", "output?since=-1"), status=400, code="invalid_request", field="since")
    c.call("GET", proc("echo", "output?since=12345678901234567"), status=400, code="invalid_request", field="since",
           note="17 digits")
    c.call("GET", proc("echo", "output?follow=yes"), status=400, code="invalid_request", field="follow")
    c.call("GET", proc("echo", "output?encoding=hex"), status=400, code="invalid_request", field="encoding")
    c.call("POST", proc("echo", "stdin"), {}, status=400, code="invalid_request", field="data",
           note="neither data nor close")
    c.call("POST", proc("echo", "stdin"), {"data": "", "close": False}, status=400, code="invalid_request",
           field="data")
    c.call("POST", proc("echo", "stdin"), {"data": 5}, status=400, code="invalid_request", field="data")
    c.call("POST", proc("echo", "stdin"), {"data": "!!", "encoding": "base64"}, status=400, code="invalid_request",
           field="data", expressible=False, note="not base64")
    c.call("POST", proc("echo", "stdin"), {"data": "x", "encoding": "hex"}, status=400, code="invalid_request",
           field="encoding")
    c.call("POST", proc("echo", "stdin"), {"data": "x", "close": "yes"}, status=400, code="invalid_request",
           field="close")
    c.call("POST", proc("echo", "stdin"), {"data": "x", "eof": True}, status=400, code="unknown_field", field="eof")
    c.call("POST", proc("echo", "stdin"), "[1]", status=400, code="bad_json", note="not an object")
    c.call("POST", proc("echo", "resize"), {"rows": 0, "cols": 80}, status=400, code="invalid_request", field="rows")
    c.call("POST", proc("echo", "resize"), {"rows": 24}, status=400, code="invalid_request", field="cols",
           note="no cols")
    c.call("POST", proc("echo", "resize"), {"rows": 24, "cols": 80, "x": 1}, status=400, code="unknown_field",
           field="x")

    # Unknown processes and methods.
    c.call("GET", f"{procs}/{no_pid}", status=404, code="not_found", note="unknown process")
    c.call("GET", procs + "/abc", status=404, code="not_found", note="not a number")
    c.call("GET", f"{procs}/{no_pid}/output", status=404, code="not_found")
    c.call("POST", f"{procs}/{no_pid}/stdin", {"data": "x"}, status=404, code="not_found")
    c.call("POST", f"{procs}/{no_pid}/signal", {"signal": "TERM"}, status=404, code="not_found")
    c.call("POST", f"{procs}/{no_pid}/resize", {"rows": 24, "cols": 80}, status=404, code="not_found")
    c.call("GET", env("000000000000") + "/processes", status=404, code="not_found", note="unknown environment")
    c.call("GET", proc("echo", "nothing"), status=404, code="not_found", note="unknown endpoint")
    c.call("DELETE", procs, status=405, code="method_not_allowed")
    c.call("DELETE", proc("echo"), status=405, code="method_not_allowed")
    c.call("POST", proc("echo", "output"), status=405, code="method_not_allowed")
    c.call("GET", proc("echo", "signal"), status=405, code="method_not_allowed")

    # The shell WebSocket (docs/API.md "Shell").
    shell = env(a) + "/shell"
    c.call("GET", shell, status=426, code="upgrade_required", note="no upgrade")
    c.call("GET", shell + "?colour=red", websocket=True, status=400, code="unknown_field", field="colour")
    c.call("GET", shell + "?rows=0", websocket=True, status=400, code="invalid_request", field="rows")
    c.call("GET", shell + "?cols=1001", websocket=True, status=400, code="invalid_request", field="cols")
    c.call("GET", shell + "?process=x", websocket=True, status=400, code="invalid_request", field="process")
    c.call("GET", shell + f"?process={pids.get('echo', no_pid)}", websocket=True, status=400,
           code="invalid_request", field="process", expressible=False, note="a process without a terminal")
    c.call("GET", shell + f"?process={no_pid}", websocket=True, status=404, code="not_found")
    c.call("GET", shell, websocket=True, token=False, status=401, code="unauthorized")
    c.call("GET", env("000000000000") + "/shell", websocket=True, status=404, code="not_found")
    c.call("POST", shell, status=405, code="method_not_allowed")

    def text_frame(ws, seen):
        """The next text frame (binary ones are terminal bytes: kept in `seen`)."""
        while True:
            opcode, payload = ws.receive()
            if opcode == 0x2:
                seen.append(payload)
                continue
            expect(opcode == 0x1, f"opcode {opcode:#x} ({payload[:80]!r}), expected a text frame")
            return json.loads(payload)

    def hello(ws, process=None):
        """The first frame of every session: a hello naming the terminal's process."""
        opcode, payload = ws.receive()
        expect(opcode == 0x1, f"opcode {opcode:#x}, expected the hello text frame first")
        first = json.loads(payload)
        c.conforms("#/components/schemas/ShellServerMessage", first, "the first text frame")
        expect(first["type"] == "hello", f"{first}, expected hello")
        if process is not None:
            expect(first["process"] == process, f"hello names process {first['process']}, expected {process}")
        return first

    def shell_session(r):
        ws, seen = r.websocket, []
        hello(ws)
        bad = {"type": "resize", "rows": 0, "cols": 5}
        ws.send_text(json.dumps(bad))
        error = text_frame(ws, seen)
        c.conforms("#/components/schemas/ShellServerMessage", error, "the answer to a bad resize")
        expect(error["type"] == "error", f"{error}, expected an error")
        resize = {"type": "resize", "rows": 40, "cols": 120}
        c.conforms("#/components/schemas/ShellClientMessage", resize, "the resize sent")
        ws.send_text(json.dumps(resize))
        ws.send_binary(b"stty size; exit 3\n")
        last = text_frame(ws, seen)
        c.conforms("#/components/schemas/ShellServerMessage", last, "the last text frame")
        expect(last["type"] == "exit" and last["exit_code"] == 3, f"last {last}, expected exit 3")
        expect(b"40 120" in b"".join(seen), f"no '40 120' on the terminal: {b''.join(seen)[-300:]!r}")
        opcode, payload = ws.receive()
        expect(opcode == 0x8 and payload[:2] == (1000).to_bytes(2, "big"),
               f"opcode {opcode:#x} {payload!r}, expected a close frame with status 1000")
    c.call("GET", shell + "?rows=30&cols=100", websocket=True, keep=True, status=101, check=shell_session,
           note="bad control message, resize, type, exit")

    def ran_a_command(r):
        # Left once the shell is past its start-up: an interactive bash that
        # gets SIGHUP while it starts can miss it (see the hang-up check below).
        ws, seen = r.websocket, []
        hello(ws)
        ws.send_binary(b"echo ready-$((6 * 7))\n")  # the echo of the typed line does not say ready-42
        deadline = time.monotonic() + 10
        while b"ready-42" not in b"".join(seen) and time.monotonic() < deadline:
            opcode, payload = ws.receive()
            expect(opcode == 0x2, f"opcode {opcode:#x}, expected terminal bytes")
            seen.append(payload)
        expect(b"ready-42" in b"".join(seen), f"the shell did not run a command: {b''.join(seen)[-300:]!r}")
    c.call("GET", shell, websocket=True, keep=True, status=101, check=ran_a_command,
           note="run a command, then leave")

    def shells(r):
        found = [p for p in r.json["processes"] if p["kind"] == "shell"]
        expect(len(found) == 2, f"{len(found)} shells listed, expected 2")
        for p in found:
            process_shape(p)
            expect(p["pty"] and p["cmd"][0] in ("/bin/bash", "/bin/sh"), f"shell {p}")
        expect(found[0]["exit_code"] == 3, f"the first shell's exit_code {found[0].get('exit_code')}, expected 3")
        # Hung up: SIGHUP, or SIGKILL when the shell was still there after the grace period.
        expect(found[1].get("state") == "exited" and found[1].get("signal") in (signal.SIGHUP, signal.SIGKILL),
               f"the second shell ({found[1]['state']}, signal {found[1].get('signal')}) was not hung up")
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:  # the hang-up follows the viewer's leaving
        r = d.request("GET", procs)
        if r.status == 200 and all(p["state"] != "running" for p in r.json["processes"] if p["kind"] == "shell"):
            break
        time.sleep(0.05)
    c.call("GET", procs, status=200, check=shells, note="shells are processes; the last viewer hangs up")

    def attach(greeting, expect_seen=None):
        def check(r):
            ws, seen = r.websocket, []
            hello(ws, pids.get("ptycat"))
            if expect_seen is not None:  # a new viewer first gets the recent screen
                deadline = time.monotonic() + 10
                while expect_seen not in b"".join(seen) and time.monotonic() < deadline:
                    opcode, payload = ws.receive()
                    expect(opcode == 0x2, f"opcode {opcode:#x}, expected terminal bytes")
                    seen.append(payload)
                expect(expect_seen in b"".join(seen), f"no {expect_seen!r} replayed: {b''.join(seen)!r}")
            ws.send_binary(greeting + b"\n")
            deadline = time.monotonic() + 10
            while b"".join(seen).count(greeting) < 2 and time.monotonic() < deadline:
                opcode, payload = ws.receive()
                expect(opcode == 0x2, f"opcode {opcode:#x}, expected terminal bytes")
                seen.append(payload)
            expect(b"".join(seen).count(greeting) >= 2, f"{greeting!r} not echoed and printed: {b''.join(seen)!r}")
        return check
    c.call("GET", shell + f"?process={pids.get('ptycat', no_pid)}", websocket=True, keep=True, status=101,
           check=attach(b"first-42"), note="attach to a pty process")
    c.call("GET", shell + f"?process={pids.get('ptycat', no_pid)}", websocket=True, keep=True, status=101,
           check=attach(b"second-7", expect_seen=b"first-42"), note="another viewer: the recent output first")
    time.sleep(0.5)
    c.call("GET", proc("ptycat"), status=200, check=is_process(state="running"),
           note="a pty process is not hung up when its viewers leave")
    c.call("POST", proc("ptycat", "signal"), {"signal": "KILL"}, status=204)

    # Timeout.
    def extended(r):
        expires = calendar.timegm(time.strptime(r.json["expires_at"][:19], "%Y-%m-%dT%H:%M:%S"))
        left = expires - time.time()
        expect(1100 < left < 1300, f"expires in {left:.0f} s, expected about 1200")
    c.call("POST", env(a) + "/timeout", {"ttl_s": 1200}, status=200, check=extended)
    c.call("POST", env(a) + "/timeout", {}, status=400, code="invalid_request", field="ttl_s")
    c.call("POST", env(a) + "/timeout", {"ttl_s": 0}, status=400, code="invalid_request", field="ttl_s")
    c.call("POST", env(a) + "/timeout", {"ttl_s": 604801}, status=400, code="invalid_request", field="ttl_s")
    c.call("POST", env(a) + "/timeout", {"ttl_s": "600"}, status=400, code="invalid_request", field="ttl_s",
           note="wrong type")
    c.call("POST", env(a) + "/timeout", {"ttl_s": 600, "extra": 1}, status=400, code="unknown_field",
           field="extra")
    c.call("GET", env(a) + "/timeout", status=405, code="method_not_allowed")

    # Pause and resume (docs/PAUSE.md): refusals while paused, reads still answer.
    c.call("POST", env(a) + "/pause", status=200, check=has(state="paused"))
    c.call("POST", env(a) + "/pause", {}, status=200, check=has(state="paused"), note="idempotent")
    c.call("POST", env(a) + "/exec", {"cmd": ["true"]}, status=409, code="conflict", note="paused")
    c.call("PUT", env(a) + "/files?path=/workspace/paused.txt", "x", status=409, code="conflict", note="paused")
    c.call("GET", env(a) + "/files/stat?path=/workspace", status=200, note="reads answer while paused")
    if ALL_MICROVM_TREE:
        c.call("POST", env(a) + "/pause", {"memory": "disk"}, status=200, check=has(paused_memory="disk"),
               note="a microVM's checkpoint")
        c.call("GET", env(a) + "/files/stat?path=/workspace", status=200, note="a read of its checkpoint answers")
        c.call("GET", env(a), status=200, check=has(state="paused", paused_memory="ram", back_to_disk=True))
    else:
        c.call("POST", env(a) + "/pause", {"memory": "disk"}, status=400, code="unsupported",
               check=lambda r: expect("need CRIU" in r.json["error"]["message"], r.json), note="not a namespace env's")
    c.call("POST", env(a) + "/pause", {"memory": "swap"}, status=400, code="invalid_request", field="memory")
    c.call("POST", env(a) + "/pause", {"mode": "disk"}, status=400, code="unknown_field", field="mode")
    c.call("POST", env(a) + "/resume", {"memory": "disk"}, status=400, code="unknown_field", field="memory")
    c.call("GET", env(a) + "/pause", status=405, code="method_not_allowed")
    c.call("POST", env(a) + "/resume", status=200, check=has(state="running"))
    c.call("POST", env(a) + "/resume", status=200, check=has(state="running"), note="idempotent")
    c.call("POST", env("000000000000") + "/pause", status=404, code="not_found")

    # Stats: a's use, read from its cgroup, beside its limits.
    def uses(r):
        j = r.json
        expect(j["id"] == a, f"id {j['id']}, expected {a}")
        expect(j["pids"] >= 1, f"pids {j['pids']}: moat-init at least")
        expect(j["memory_bytes"] > 0, f"memory_bytes {j['memory_bytes']}")
        expect(j["memory_limit_bytes"] == j["memory_limit_bytes"] // (1 << 20) * (1 << 20) > 0,
               f"memory_limit_bytes {j['memory_limit_bytes']}")
        expect(j["pids_limit"] >= 4 and j["cpus"] > 0, f"limits {j}")
        expect(j["cpu_usec"] is None or j["cpu_usec"] > 0, f"cpu_usec {j['cpu_usec']}")
    c.call("GET", env(a) + "/stats", status=200, check=uses)
    c.call("POST", env(a) + "/stats", status=405, code="method_not_allowed")
    # The fleet's: every running environment, a's among them, each as above.
    def fleet_uses(r):
        readings = [e for e in r.json["environments"] if e["id"] == a]
        expect(len(readings) == 1, f"a in /v1/stats once: {r.json}")
        uses(type("R", (), {"json": readings[0]}))
    c.call("GET", "/v1/stats", status=200, check=fleet_uses)
    c.call("GET", "/v1/stats?x=1", status=400, code="unknown_field", field="x")
    c.call("GET", "/v1/stats?follow=1&interval_ms=100", status=400, code="invalid_request", field="interval_ms")
    c.call("GET", "/v1/stats?follow=2", status=400, code="invalid_request", field="follow")
    c.call("DELETE", "/v1/stats", status=405, code="method_not_allowed")

    # Request errors on create.
    envs = "/v1/environments"
    c.call("POST", envs, "{not json", status=400, code="bad_json")
    c.call("POST", envs, "[1,2]", status=400, code="bad_json", note="not an object")
    c.call("POST", envs, {"spec": {"cpus": 1, "gpus": 2}}, status=400, code="unknown_field", field="spec.gpus")
    c.call("POST", envs, {"colour": "red"}, status=400, code="unknown_field", field="colour")
    c.call("POST", envs, {"spec": {"ram_mb": "lots"}}, status=400, code="invalid_request", field="spec.ram_mb",
           note="wrong type")
    c.call("POST", envs, {"spec": "big"}, status=400, code="invalid_request", field="spec")
    c.call("POST", envs, {"spec": {"cpus": 0.001}}, status=400, code="invalid_request", field="spec.cpus")
    c.call("POST", envs, {"spec": {"storage_gb": 70000}}, status=400, code="invalid_request",
           field="spec.storage_gb")
    c.call("POST", envs, {"spec": {"pids": 1.5}}, status=400, code="invalid_request", field="spec.pids")
    c.call("POST", envs, {"spec": {"pids": 0}}, status=400, code="invalid_request", field="spec.pids")
    c.call("POST", envs, {"spec": {"ram_mb": 8}}, status=400, code="invalid_request", field="spec.ram_mb")
    c.call("POST", envs, {"ttl_s": -5}, status=400, code="invalid_request", field="ttl_s")
    c.call("POST", envs, {"task_id": 5}, status=400, code="invalid_request", field="task_id")
    c.call("POST", envs, {"task_id": "t" * 257}, status=400, code="invalid_request", field="task_id")
    c.call("POST", envs, {"template": "relative/dir"}, status=400, code="invalid_request", field="template")
    c.call("POST", envs, {"labels": ["a"]}, status=400, code="invalid_request", field="labels")
    c.call("POST", envs, {"labels": {"k": 1}}, status=400, code="invalid_request", field="labels.k")
    c.call("POST", envs, {"labels": {"bad key!": "x"}}, status=400, code="invalid_request",
           field="labels.bad key!", expressible=False, note="label key syntax")
    c.call("POST", envs, {"env": {"1BAD": "x"}}, status=400, code="invalid_request", field="env.1BAD",
           expressible=False, note="variable name syntax")
    c.call("POST", envs, " " * (2 << 20), status=413, code="too_large", note="JSON body over 1 MiB")
    c.call("PUT", envs + "/" + a + "/files?path=/workspace/huge", None, content_type="application/octet-stream",
           declared_length=65 << 20, status=413, code="too_large", note="request over 64 MiB")

    # Request errors on exec.
    c.call("POST", ex, {}, status=400, code="invalid_request", field="cmd", note="no cmd (a template without Entrypoint or Cmd)", expressible=False)
    c.call("POST", ex, {"cmd": []}, status=400, code="invalid_request", field="cmd")
    c.call("POST", ex, {"cmd": "ls"}, status=400, code="invalid_request", field="cmd", note="wrong type")
    c.call("POST", ex, {"cmd": ["ls", 5]}, status=400, code="invalid_request", field="cmd[1]")
    c.call("POST", ex, {"cmd": ["ls"], "shell": True}, status=400, code="unknown_field", field="shell")
    c.call("POST", ex, {"cmd": ["ls"], "encoding": "utf16"}, status=400, code="invalid_request", field="encoding")
    c.call("POST", ex, {"cmd": ["ls"], "timeout_ms": 0}, status=400, code="invalid_request", field="timeout_ms")
    c.call("POST", ex, {"cmd": ["ls"], "output_limit": (16 << 20) + 1}, status=400, code="invalid_request",
           field="output_limit")
    c.call("POST", ex, {"cmd": ["ls"], "cwd": "tmp"}, status=400, code="invalid_request", field="cwd")
    c.call("POST", ex, {"cmd": ["ls"], "stdin": 5}, status=400, code="invalid_request", field="stdin")
    c.call("POST", ex, {"cmd": ["cat"], "encoding": "base64", "stdin": "!!"}, status=400,
           code="invalid_request", field="stdin", expressible=False, note="stdin not base64")
    c.call("POST", ex, {"cmd": ["ls"], "env": {"A": 1}}, status=400, code="invalid_request", field="env.A")
    c.call("POST", ex, json.dumps({"cmd": ["echo", "x" * (1100 << 10)]}), status=413, code="too_large",
           note="JSON body over 1 MiB")
    c.call("GET", ex, status=405, code="method_not_allowed")

    # Unknown environments, endpoints and methods.
    nobody = env("000000000000")
    c.call("GET", nobody, status=404, code="not_found")
    c.call("DELETE", nobody, status=404, code="not_found")
    c.call("POST", nobody + "/exec", {"cmd": ["true"]}, status=404, code="not_found")
    c.call("POST", nobody + "/timeout", {"ttl_s": 60}, status=404, code="not_found")
    c.call("GET", nobody + "/files/stat?path=/", status=404, code="not_found")
    c.call("GET", "/v1/nothing", status=404, code="not_found", note="unknown endpoint")
    c.call("GET", env(a) + "/nothing", status=404, code="not_found", note="unknown endpoint")
    c.call("PATCH", envs, status=405, code="method_not_allowed")
    c.call("PUT", env(a), {}, status=405, code="method_not_allowed")
    c.call("POST", "/metrics", status=405, code="method_not_allowed")

    # Delete, idempotence, and calls on a destroyed environment. The follower
    # of b's process has been waiting: a heartbeat comes after 15 s without
    # output, then `end` when b is destroyed.
    time.sleep(max(0.0, follow_started + 16.5 - time.monotonic()))
    c.call("DELETE", env(b), status=204)
    follow_end(timeout=30)
    c.call("DELETE", env(b), status=204, note="idempotent")
    c.call("GET", env(b), status=200, check=has(state="gone", reason="destroyed"))
    c.call("GET", envs, status=200, check=ids(a), note="gone left out")
    c.call("GET", envs + "?state=gone", status=200, check=ids(b))
    c.call("POST", env(b) + "/exec", {"cmd": ["true"]}, status=409, code="conflict")
    c.call("POST", env(b) + "/timeout", {"ttl_s": 60}, status=409, code="conflict")
    c.call("GET", env(b) + "/stats", status=409, code="conflict", note="a gone environment uses nothing")
    c.call("GET", env(b) + "/files?path=/etc/hostname", status=409, code="conflict")
    c.call("GET", bprocs, status=409, code="conflict", note="processes end with their environment")
    c.call("POST", bprocs, {"cmd": ["true"]}, status=409, code="conflict")
    c.call("GET", f"{bprocs}/{follower.get('id', no_pid)}/output", status=409, code="conflict")
    c.call("POST", f"{bprocs}/{follower.get('id', no_pid)}/signal", {"signal": "KILL"}, status=409, code="conflict")
    c.call("GET", env(b) + "/shell", websocket=True, status=409, code="conflict")

    # Agents (docs/AGENTS.md; tests/agent drives whole runs against provider
    # doubles): requests refused by field, and a run stopped while its
    # provider cannot be reached.
    agents = "/v1/agents"
    nowhere = {"kind": "openai", "model": "m", "base_url": "http://127.0.0.1:9/v1", "api_key": "sk-conformance-provider-key"}
    c.call("POST", agents, {"instruction": "x", "provider": {"kind": "gemini", "model": "m"}}, status=400,
           code="invalid_request", field="provider.kind")
    c.call("POST", agents, {"instruction": "x", "provider": nowhere, "colour": 1}, status=400, code="unknown_field",
           field="colour")
    c.call("POST", agents, {"provider": nowhere}, status=400, code="invalid_request", field="instruction")
    run_ids = {}
    def agent_started(r):
        expect(r.json["state"] == "running", f"state {r.json['state']}")
        expect("sk-conformance" not in json.dumps(r.json), "the key is not shown")
        run_ids["x"] = r.json["id"]
    c.call("POST", agents, {"instruction": "x", "provider": nowhere, "max_iterations": 2}, status=201,
           check=agent_started)
    run_path = agents + "/" + run_ids.get("x", "000000000000")
    c.call("POST", run_path + "/stop", status=200, check=has(state="stopped"))
    c.call("GET", run_path, status=200, check=has(state="stopped"))
    c.call("GET", run_path + "/transcript", status=200)
    c.call("GET", agents, status=200)
    c.call("GET", agents + "/000000000000", status=404, code="not_found")
    c.call("DELETE", run_path, status=405, code="method_not_allowed")

    # Scoped API keys. The master token manages them; a key may do only what
    # its scopes allow (403) and only to the environments it created (any
    # other looks like it does not exist: 404). `a` (the master's) is running.
    keys = {}
    no_token = "moat_" + "0" * 12 + "_" + "0" * 64  # used when a create failed

    def tok(label):
        return keys.get(label, {}).get("token", no_token)

    def kid(label):
        return keys.get(label, {}).get("id", "000000000000")

    def key_created(label, name, scopes):
        def check(r):
            j = r.json
            keys[label] = j
            expect(j["name"] == name, f"name {j['name']!r}, expected {name!r}")
            expect(j["scopes"] == scopes, f"scopes {j['scopes']}, expected {scopes}")
            expect(j["revoked"] is False, "a new key is not revoked")
            expect(j["token"].startswith(f"moat_{j['id']}_"), f"the token does not carry the id {j['id']}")
        return check

    agent_scopes = ["create", "read", "exec", "files", "destroy"]
    c.call("POST", "/v1/keys", {"name": "agent", "scopes": agent_scopes}, status=201,
           check=key_created("agent", "agent", agent_scopes))
    c.call("POST", "/v1/keys", {"name": "reader", "scopes": ["read", "read"]}, status=201,
           check=key_created("reader", "reader", ["read"]), note="repeated scope kept once")
    c.call("POST", "/v1/keys", {"scopes": ["exec"]}, status=201, check=key_created("runner", "", ["exec"]),
           note="no name")

    def key_list(revoked=()):
        def check(r):
            got = {k["id"]: (k["name"], k["scopes"], k["revoked"]) for k in r.json["keys"]}
            want = {kid("agent"): ("agent", agent_scopes, "agent" in revoked),
                    kid("reader"): ("reader", ["read"], "reader" in revoked),
                    kid("runner"): ("", ["exec"], "runner" in revoked)}
            expect(got == want, f"keys {got}, expected {want}")
            stamps = [k["created_at"] for k in r.json["keys"]]
            expect(stamps == sorted(stamps, reverse=True), f"not newest first: {stamps}")
            for label in keys:
                expect(tok(label).encode() not in r.body, "a token is listed (it is shown once)")
        return check
    c.call("GET", "/v1/keys", status=200, check=key_list())

    # The agent key creates, lists, reads and runs commands in its own environments.
    def remember_as(name):
        def check(r):
            created[name] = r.json["id"]
            expect(r.json["state"] == "running", f"state {r.json['state']}")
        return check
    small = {"ram_mb": 256, "storage_gb": 1, "pids": 128}
    c.call("POST", envs, {"task_id": "conf-key", "spec": small}, token=tok("agent"), status=201,
           check=remember_as("mine"), note="key creates")
    c.call("POST", envs, {"task_id": "conf-key-2", "spec": small}, token=tok("agent"), status=201,
           check=remember_as("mine2"), note="key creates")
    mine, mine2 = created.get("mine", "000000000000"), created.get("mine2", "000000000000")
    c.call("GET", envs, token=tok("agent"), status=200, check=ids(mine, mine2), note="key lists only its own")
    c.call("GET", envs + "?state=gone", token=tok("agent"), status=200, check=ids(),
           note="not the master's gone ones either")
    c.call("GET", env(mine), token=tok("agent"), status=200, check=has(id=mine, task_id="conf-key"))
    c.call("POST", env(mine) + "/exec", {"cmd": ["echo", "agent"]}, token=tok("agent"), status=200,
           check=out("agent\n", exit_code=0), note="key execs")
    c.call("PUT", env(mine) + "/files?path=/workspace/k.txt", b"by key", content_type="application/octet-stream",
           token=tok("agent"), status=200, check=has(ok=True), note="key writes a file")
    c.call("GET", env(mine) + "/files?path=/workspace/k.txt", token=tok("agent"), status=200,
           check=body_is(b"by key"))
    c.call("POST", env(mine) + "/timeout", {"ttl_s": 600}, token=tok("agent"), status=403, code="forbidden",
           note="no timeout scope, own environment")
    c.call("POST", env(mine) + "/processes", {"cmd": ["echo", "agent"]}, token=tok("agent"), status=201,
           check=is_process(kind="process"), note="key starts a process")
    c.call("GET", env(mine) + "/processes", token=tok("agent"), status=200,
           check=lambda r: expect(len(r.json["processes"]) == 1, f"{r.json['processes']}"), note="key lists them")
    c.call("GET", env(mine) + "/shell", websocket=True, token=tok("agent"), status=101, note="key opens a shell")

    # The master's environment does not exist for the key.
    c.call("GET", env(a), token=tok("agent"), status=404, code="not_found", note="master's environment")
    c.call("POST", env(a) + "/exec", {"cmd": ["true"]}, token=tok("agent"), status=404, code="not_found",
           note="master's environment")
    c.call("GET", env(a) + "/processes", token=tok("agent"), status=404, code="not_found",
           note="master's environment")
    c.call("GET", f"{procs}/{pids.get('echo', no_pid)}/output", token=tok("agent"), status=404, code="not_found",
           note="master's environment")
    c.call("GET", env(a) + "/shell", websocket=True, token=tok("agent"), status=404, code="not_found",
           note="master's environment")
    c.call("GET", env(a) + "/files/stat?path=/", token=tok("agent"), status=404, code="not_found",
           note="master's environment")
    c.call("DELETE", env(a), token=tok("agent"), status=404, code="not_found", note="master's environment")
    c.call("GET", env(a) + "/stats", token=tok("agent"), status=404, code="not_found", note="master's environment")
    c.call("GET", "/v1/stats", token=tok("agent"), status=200,
           check=lambda r: expect(a not in [e["id"] for e in r.json["environments"]], r.json),
           note="a key's fleet is its own")
    c.call("GET", env(a), status=200, check=has(state="running"), note="still running")
    c.call("GET", envs, status=200, check=ids(a, mine, mine2), note="the master lists every owner's")
    c.call("POST", env(mine) + "/exec", {"cmd": ["cat", "/workspace/k.txt"]}, status=200, check=out("by key"),
           note="the master reaches a key's environment")

    # Scopes: read-only and exec-only keys.
    c.call("GET", envs, token=tok("reader"), status=200, check=ids(), note="created none")
    c.call("GET", env(mine), token=tok("reader"), status=404, code="not_found", note="another key's")
    c.call("GET", "/metrics", token=tok("reader"), status=200)
    c.call("POST", envs, {}, token=tok("reader"), status=403, code="forbidden", note="read-only key creates")
    c.call("POST", env(mine) + "/exec", {"cmd": ["true"]}, token=tok("reader"), status=403, code="forbidden",
           note="read-only key execs")
    c.call("POST", env(a) + "/exec", {"cmd": ["true"]}, token=tok("reader"), status=403, code="forbidden",
           note="read-only key execs")
    c.call("GET", env(a) + "/processes", token=tok("reader"), status=403, code="forbidden",
           note="read-only key lists processes")
    c.call("POST", env(a) + "/processes", {"cmd": ["true"]}, token=tok("reader"), status=403, code="forbidden",
           note="read-only key starts a process")
    c.call("GET", env(a) + "/shell", websocket=True, token=tok("reader"), status=403, code="forbidden",
           note="read-only key opens a shell")
    c.call("GET", "/metrics", token=tok("runner"), status=403, code="forbidden", note="exec-only key")
    c.call("GET", envs, token=tok("runner"), status=403, code="forbidden", note="exec-only key")
    c.call("GET", env(mine) + "/files/stat?path=/", token=tok("runner"), status=403, code="forbidden",
           note="exec-only key")
    c.call("DELETE", env(mine), token=tok("runner"), status=403, code="forbidden", note="exec-only key")

    # Only the master token manages keys.
    c.call("POST", "/v1/keys", {"scopes": ["read"]}, token=tok("agent"), status=403, code="forbidden",
           note="a key creates a key")
    c.call("GET", "/v1/keys", token=tok("agent"), status=403, code="forbidden", note="a key lists keys")
    c.call("DELETE", "/v1/keys/" + kid("reader"), token=tok("agent"), status=403, code="forbidden",
           note="a key revokes a key")

    # Request errors on keys.
    c.call("POST", "/v1/keys", {"scopes": ["root"]}, status=400, code="invalid_request", field="scopes[0]",
           note="unknown scope")
    c.call("POST", "/v1/keys", {"scopes": ["read", 5]}, status=400, code="invalid_request", field="scopes[1]")
    c.call("POST", "/v1/keys", {"scopes": []}, status=400, code="invalid_request", field="scopes")
    c.call("POST", "/v1/keys", {"name": "x"}, status=400, code="invalid_request", field="scopes",
           note="no scopes")
    c.call("POST", "/v1/keys", {"scopes": "read"}, status=400, code="invalid_request", field="scopes",
           note="wrong type")
    c.call("POST", "/v1/keys", {"name": "n" * 129, "scopes": ["read"]}, status=400, code="invalid_request",
           field="name")
    c.call("POST", "/v1/keys", {"name": 7, "scopes": ["read"]}, status=400, code="invalid_request",
           field="name", note="wrong type")
    c.call("POST", "/v1/keys", {"name": "\u00e9" * 100, "scopes": ["read"]}, status=400, code="invalid_request",
           field="name", expressible=False, note="128 bytes, not characters")
    c.call("POST", "/v1/keys", {"scopes": ["read"], "admin": True}, status=400, code="unknown_field",
           field="admin")
    c.call("POST", "/v1/keys", "{not json", status=400, code="bad_json")
    c.call("PATCH", "/v1/keys", status=405, code="method_not_allowed")
    c.call("GET", "/v1/keys/" + kid("reader"), status=405, code="method_not_allowed")
    c.call("DELETE", "/v1/keys/000000000000", status=404, code="not_found", note="unknown key")

    # A key destroys its own environment; revoking a key leaves the others running.
    c.call("DELETE", env(mine2), token=tok("agent"), status=204, note="key destroys its own")
    c.call("GET", env(mine2), status=200, check=has(state="gone", reason="destroyed"))
    c.call("DELETE", "/v1/keys/" + kid("agent"), status=204, note="revoke")

    def revoked(r):
        expect("revoked" in r.json["error"]["message"], f"message {r.json['error']['message']!r}")
    c.call("GET", envs, token=tok("agent"), status=401, code="unauthorized", check=revoked, note="revoked key")
    c.call("DELETE", "/v1/keys/" + kid("agent"), status=404, code="not_found", note="already revoked")
    forged = tok("reader")[:-1] + ("b" if tok("reader").endswith("a") else "a")
    c.call("GET", envs, token=forged, status=401, code="unauthorized", note="forged key")
    c.call("GET", envs, token="moat_" + kid("reader") + "_short", status=401, code="unauthorized",
           note="malformed key")
    c.call("GET", "/v1/keys", status=200, check=key_list(revoked=("agent",)), note="revoked listed")
    c.call("GET", env(mine), status=200, check=has(state="running"), note="outlives its key")
    c.call("DELETE", env(mine), status=204)
    c.call("DELETE", env(a), status=204)

    run_gate_exchanges(c)
    run_egress_exchanges(c)
    run_snapshot_exchanges(c)
    run_template_exchanges(c)
    # The audit log: everything above is in it, and its chain holds.
    def sse_events(r):
        events = [json.loads(line[6:]) for line in r.body.decode().split("\n") if line.startswith("data: ")]
        for e in events:
            errors = list(jsonschema.Draft4Validator(c.spec.schema({"$ref": "#/components/schemas/AuditEvent"}))
                          .iter_errors(e))
            expect(not errors, f"event {e.get('id')} does not match AuditEvent: {errors[:1]}")
        return events

    def event_types(*want):
        def check(r):
            got = [e["type"] for e in sse_events(r)]
            expect(got == list(want), f"types {got}, expected {list(want)}")
        return check

    c.call("GET", "/v1/events?since=0&type=environment.destroyed&environment=" + mine, status=200,
           check=event_types("environment.destroyed"))
    c.call("GET", "/v1/events", status=200, check=lambda r: expect(len(sse_events(r)) > 10, "few events"))
    c.call("GET", "/v1/events?since=abc", status=400, code="invalid_request", field="since")
    c.call("GET", "/v1/events?follow=maybe", status=400, code="invalid_request", field="follow")
    c.call("GET", "/v1/events?bogus=1", status=400, code="unknown_field", field="bogus")
    c.call("GET", "/v1/events", token=tok("reader"), status=403, code="forbidden", note="no audit scope")
    c.call("POST", "/v1/events", status=405, code="method_not_allowed")

    def holds(r):
        expect(r.json["ok"] is True and r.json["checked"] > 10, f"verify: {r.json}")
        expect("first_broken" not in r.json, "first_broken on a chain that holds")
    c.call("GET", "/v1/audit/verify", status=200, check=holds)
    c.call("GET", "/v1/audit/verify", token=tok("reader"), status=403, code="forbidden", note="master only")
    c.call("DELETE", "/v1/audit/verify", status=405, code="method_not_allowed")

    def counted(r):
        text = r.body.decode()
        expect(re.search(r"^moat_exec_total [1-9]", text, re.M), "moat_exec_total did not count")
        expect('moat_api_errors_total{code="invalid_request"}' in text, "errors not counted")
        expect('moat_environments{state="running"} 0' in text, "environments still running")
    c.call("GET", "/metrics", status=200, check=counted, note="counters")


# --- the gate -----------------------------------------------------------------

# What an environment created without "permissions" gets (moatd without
# --permissions).
DEFAULT_PERMISSIONS = {"read_file": "allow", "write_file": "allow", "run_command": "allow", "network": "deny"}


def run_microvm_exchanges(c, tree):
    """A representative subset on a microVM environment (spec.isolation
    "microvm", docs/MICROVM.md; TCG here): its record, exec and files (the
    namespace environment's exchanges, unchanged), processes, a shell,
    stats, the TTL, snapshots (taken, forked, created from, restored, and
    what they refuse across isolations), what it refuses by name (400
    unsupported), and its end.
    `tree`: a template directory with a static busybox as its shell and
    tools."""
    envs = "/v1/environments"
    made = {}

    def created(r):
        made["vm"] = r.json["id"]
        j = r.json
        expect(j["state"] == "running" and j["accel"] == "tcg", f"state/accel: {j}")
        expect(j["spec"] == {"cpus": 1, "ram_mb": 256, "storage_gb": 1, "pids": 128, "isolation": "microvm"},
               f"spec {j['spec']}")
    c.call("GET", "/healthz", token=False, status=200,
           check=lambda r: expect(r.json.get("microvm", {}).get("available") is True
                                  and r.json["microvm"].get("accel") == "tcg"
                                  and r.json["microvm"].get("accel_reason"), r.json))
    c.call("POST", envs,
           {"template": tree, "spec": {"isolation": "microvm", "ram_mb": 256, "storage_gb": 1, "pids": 128},
            "ttl_s": 600, "env": {"GREETING": "hello"}},
           status=201, check=created)
    vm = f"{envs}/{made.get('vm', '000000000000')}"
    c.call("GET", vm, status=200, check=has(state="running", accel="tcg"))
    c.call("GET", f"{envs}?state=running", status=200,
           check=lambda r: expect([e["spec"]["isolation"] for e in r.json["environments"]] == ["microvm"], r.json))
    exec_and_file_exchanges(c, vm)

    # Processes: started, listed, its output read back, signalled.
    procs = vm + "/processes"
    started = {}

    def running(r):
        started["id"] = r.json["id"]
        expect(r.json["state"] in ("starting", "running"), f"state {r.json['state']}")
    c.call("POST", procs, {"cmd": ["sh", "-c", "echo started; exec sleep 600"]}, status=201, check=running)
    proc = f"{procs}/{started.get('id', 999999)}"
    deadline = time.monotonic() + 15  # bounded: until its output is there
    while time.monotonic() < deadline and b"started" not in c.daemon.request("GET", proc + "/output").body:
        time.sleep(0.05)
    c.call("GET", proc + "/output", status=200,
           check=lambda r: expect([e.get("data") for e in r.events if e["type"] == "output"] == ["started\n"],
                                  f"events {r.events}"))
    c.call("GET", procs, status=200, check=lambda r: expect(len(r.json["processes"]) >= 1, r.json))
    c.call("POST", proc + "/signal", {"signal": "TERM"}, status=204)
    c.call("GET", proc + "/output?follow=1", status=200,
           check=lambda r: expect(r.events[-1]["type"] == "exit" and r.events[-1]["signal"] == 15,
                                  f"last event {r.events[-1:]}"))

    # A shell on the guest's terminal.
    def shell_session(r):
        ws, seen = r.websocket, []
        opcode, payload = ws.receive()
        first = json.loads(payload)
        c.conforms("#/components/schemas/ShellServerMessage", first, "the first text frame")
        expect(opcode == 0x1 and first["type"] == "hello", f"{first}, expected hello")
        ws.send_binary(b"echo $((6*7)); exit 3\n")
        while True:
            opcode, payload = ws.receive()
            if opcode == 0x2:
                seen.append(payload)
                continue
            last = json.loads(payload)
            c.conforms("#/components/schemas/ShellServerMessage", last, "a text frame")
            if last["type"] == "exit":
                break
        expect(last["exit_code"] == 3, f"last {last}, expected exit 3")
        expect(b"42" in b"".join(seen), f"no 42 on the terminal: {b''.join(seen)[-300:]!r}")
    c.call("GET", vm + "/shell", websocket=True, keep=True, status=101, check=shell_session)

    c.call("GET", vm + "/stats", status=200,
           check=lambda r: expect(r.json["memory_bytes"] > 0, f"QEMU's memory: {r.json}"))
    c.call("POST", vm + "/timeout", {"ttl_s": 1200}, status=200)

    # Snapshots: its disk, copied; environments made from it are microVMs.
    snaps = {}

    def snapped(r):
        snaps["s"] = r.json["id"]
        expect(r.json["isolation"] == "microvm" and r.json["storage_gb"] == 1, r.json)
    c.call("POST", vm + "/exec", {"cmd": ["sh", "-c", "echo kept > /workspace/kept"]}, status=200)
    c.call("POST", vm + "/snapshots", {"name": "one"}, status=201, check=snapped)
    snap = snaps.get("s", "snap-000000000000")
    c.call("GET", f"/v1/snapshots/{snap}", status=200, check=lambda r: expect(r.json["isolation"] == "microvm", r.json))
    c.call("POST", vm + "/exec", {"cmd": ["sh", "-c", "echo changed > /workspace/kept"]}, status=200)

    def microvm_as(name):
        def check(r):
            expect(r.json["spec"]["isolation"] == "microvm", r.json)
            snaps[name] = r.json["id"]
        return check
    c.call("POST", vm + "/fork", {"ttl_s": 600}, status=201, check=microvm_as("fork"))
    c.call("POST", envs, {"snapshot": snap, "ttl_s": 600}, status=201, check=microvm_as("from"))
    for name, text in (("fork", "changed\n"), ("from", "kept\n")):
        c.call("POST", f"{envs}/{snaps.get(name, '000000000000')}/exec", {"cmd": ["cat", "/workspace/kept"]},
               status=200, note=f"the {name}'s files",
               check=lambda r, text=text: expect(r.json["stdout"] == text, f"{text!r} expected: {r.json}"))
    c.call("POST", envs, {"snapshot": snap, "spec": {"isolation": "namespaces"}}, status=400, code="invalid_argument",
           note="a microVM's snapshot makes microVMs",
           check=lambda r: expect("is of a microvm environment" in r.json["error"]["message"], r.json))
    c.call("POST", envs, {"snapshot": snap, "spec": {"storage_gb": 2}}, status=400, code="invalid_argument",
           note="its disk is the snapshot's",
           check=lambda r: expect(r.json["error"]["message"].startswith("spec.storage_gb"), r.json))
    c.call("POST", vm + "/restore", {"snapshot": snap}, status=200)
    c.call("POST", vm + "/exec", {"cmd": ["cat", "/workspace/kept"]}, status=200,
           check=lambda r: expect(r.json["stdout"] == "kept\n", r.json))
    for name in ("fork", "from"):
        c.call("DELETE", f"{envs}/{snaps.get(name, '000000000000')}", status=204)
    c.call("DELETE", f"/v1/snapshots/{snap}", status=204)

    # A pause is its guest's moat-init's (docs/PAUSE.md): the same answers.
    c.call("POST", vm + "/pause", status=200, check=has(state="paused"))
    c.call("POST", vm + "/exec", {"cmd": ["true"]}, status=409, code="conflict", note="paused microVM")
    c.call("GET", vm + "/files/stat?path=/", status=200, note="a paused microVM's files answer")
    c.call("POST", vm + "/resume", status=200, check=has(state="running"))
    # To disk (docs/PAUSE.md, "To disk"): its memory saved and released; a
    # file read brings it back into RAM, still paused (commands wait for the
    # resume, which lets it go on where it was).
    c.call("POST", vm + "/pause", {"memory": "disk"}, status=200,
           check=lambda r: expect(r.json["state"] == "paused" and r.json["paused_memory"] == "disk", r.json))
    c.call("POST", vm + "/exec", {"cmd": ["true"]}, status=409, code="conflict", note="a microVM on disk")
    c.call("GET", vm + "/shell", websocket=True, status=409, code="conflict", note="a microVM on disk")
    c.call("GET", vm, status=200, check=has(state="paused", paused_memory="disk"), note="nothing brought it back")
    c.call("GET", vm + "/files/stat?path=/", status=200, note="a microVM on disk: its read brings it back")
    c.call("GET", vm, status=200, check=has(state="paused", paused_memory="ram", back_to_disk=True))
    c.call("POST", vm + "/resume", status=200, check=has(state="running"))
    c.call("POST", vm + "/exec", {"cmd": ["true"]}, status=200, note="back from disk")

    # Its changed files, as its guest lists them (against its template
    # only: a snapshot's disk is read by no guest).
    c.call("PUT", vm + "/files?path=/workspace/changed.txt", b"changed\n", content_type="application/octet-stream",
           status=200)
    c.call("GET", vm + "/changes", status=200,
           check=lambda r: expect(any(ch["path"] == "/workspace/changed.txt" and ch["change"] == "added"
                                      for ch in r.json["changes"]), r.json))
    snap = c.call("POST", vm + "/snapshots", {}, status=201)
    if snap is not None:
        c.call("GET", vm + "/changes?against=" + snap.json["id"], status=400, code="unsupported",
               note="a microVM's changes are against its template only")
        c.call("DELETE", "/v1/snapshots/" + snap.json["id"], status=204)
    # Its network (QEMU's user-mode network through the egress link; what
    # it reaches: tests/egress/egress_microvm_test.py) changes as a
    # namespace environment's does.
    c.call("PUT", vm + "/network", {"network": {"allow": ["example.org"]}}, status=200,
           check=lambda r: expect(r.json["network"]["mode"] == "allowlist" and "link" in r.json, r.json))
    c.call("PUT", vm + "/network", {"network": "none"}, status=200,
           check=lambda r: expect(r.json["network"] == "none" or r.json["network"]["mode"] == "none", r.json))
    c.call("POST", envs, {"template": tree, "spec": {"isolation": "microvm", "ram_mb": 64}}, status=400,
           code="invalid_argument", note="less than a microVM's kernel needs",
           check=lambda r: expect(r.json["error"]["message"].startswith("spec.ram_mb: a microVM needs at least 128 MB"),
                                  r.json))
    c.call("POST", vm + "/exec", {"cmd": ["sh", "-c", "echo still here"]}, status=200,
           check=lambda r: expect(r.json["stdout"] == "still here\n", r.json))
    c.call("DELETE", vm, status=204)
    c.call("GET", vm, status=200, check=has(state="gone"))


def run_egress_exchanges(c):
    """Egress (docs/EGRESS.md): network policies and secrets on create, the
    network endpoint (GET, PUT changing modes), validation naming the field,
    and secrets shown without their values."""
    envs = "/v1/environments"
    env = lambda i: f"{envs}/{i}"  # noqa: E731
    small = {"ram_mb": 256, "storage_gb": 1, "pids": 128}
    made = {}

    def keep(name):
        def check(r):
            made[name] = r.json["id"]
        return check

    def eid(name):
        return made.get(name, "000000000000")

    def mode_is(mode):
        return lambda r: expect(r.json["network"] == mode if isinstance(r.json["network"], str)
                                else r.json["network"]["mode"] == mode, f"network {r.json['network']}")

    def no_value(r):
        expect("hunter2-never-shown" not in json.dumps(r.json), "a secret value is in the answer")

    policy = {"mode": "allowlist", "allow": ["*.pypi.org", "api.example.com:443",
                                             {"host": "api.github.com", "methods": ["GET"], "paths": ["/repos/**"]},
                                             "203.0.113.0/24"],
              "deny": ["upload.pypi.org"], "max_connections": 8}
    secrets = [{"name": "API_TOKEN", "value": "hunter2-never-shown", "hosts": ["api.example.com"],
                "header": "Authorization: Bearer {value}"}]
    c.call("POST", envs, {"spec": small, "network": policy, "secrets": secrets}, status=201,
           check=lambda r: (keep("n")(r), mode_is("allowlist")(r), no_value(r),
                            expect(r.json["secrets"][0]["name"] == "API_TOKEN", "secret not listed")),
           note="allowlist and a secret")
    c.call("GET", env(eid("n")) + "/network", status=200,
           check=lambda r: (mode_is("allowlist")(r), expect("link" in r.json, "no link")))
    c.call("GET", env(eid("n")), status=200, check=no_value)
    c.call("POST", f"{env(eid('n'))}/exec", {"cmd": ["sh", "-c", "echo $API_TOKEN; echo $HTTPS_PROXY"]},
           status=200, check=lambda r: (expect(r.json["stdout"].startswith("moat-secret-"), r.json["stdout"]),
                                        expect(":3128" in r.json["stdout"], r.json["stdout"])))
    c.call("PUT", env(eid("n")) + "/network", {"network": "open"}, status=200, check=mode_is("open"))
    c.call("PUT", env(eid("n")) + "/network", {"network": "none"}, status=200,
           check=lambda r: (mode_is("none")(r), expect("link" not in r.json, "a link after none")))
    c.call("PUT", env(eid("n")) + "/network", {"network": {"allow": ["example.org"]}}, status=200,
           check=mode_is("allowlist"), note="back from none")
    c.call("POST", envs, {"spec": small, "network": "open"}, status=201,
           check=lambda r: (keep("o")(r), mode_is("open")(r)))
    for network, field in (({"mode": "sometimes"}, "network.mode"),
                           ({"allow": ["[::1]:443"]}, "network.allow[0]"),
                           ({"allow": ["10.0.0.0/40"]}, "network.allow[0]"),
                           ({"allow": [{"host": "x.example", "ports": [0]}]}, "network.allow[0].ports[0]")):
        c.call("POST", envs, {"network": network}, status=400, code="invalid_request", field=field,
               expressible=False)
    c.call("POST", envs, {"network": {"allow": [{"host": "x", "verbs": ["GET"]}]}}, status=400,
           code="invalid_request", field="network.allow[0].verbs")
    c.call("POST", envs, {"secrets": [{"name": "A", "value": "v", "hosts": ["*"]}]}, status=400,
           code="invalid_request", field="secrets[0].hosts[0]", expressible=False)
    c.call("PUT", env(eid("n")) + "/network", {"network": "none", "extra": 1}, status=400, code="unknown_field",
           field="extra")
    for name in ("n", "o"):
        c.call("DELETE", env(eid(name)), status=204)


def run_snapshot_exchanges(c):
    """Snapshots (docs/API.md, "Snapshots"): take, list, get, restore, fork,
    create from a snapshot, delete; ids that could name a path are refused."""
    envs = "/v1/environments"
    env = lambda i: f"{envs}/{i}"  # noqa: E731
    small = {"ram_mb": 256, "storage_gb": 1, "pids": 128}
    made = {}

    def keep(name):
        def check(r):
            made[name] = r.json["id"]
        return check

    def mid(name, default="000000000000"):
        return made.get(name, default)

    c.call("POST", envs, {"spec": small}, status=201, check=keep("e"))
    c.call("POST", f"{env(mid('e'))}/exec", {"cmd": ["sh", "-c", "echo one > /workspace/f"]}, status=200)
    c.call("POST", f"{env(mid('e'))}/snapshots", {"name": "one"}, status=201,
           check=lambda r: (keep("s")(r), expect(r.json["name"] == "one", r.json)))
    c.call("POST", f"{env(mid('e'))}/snapshots", None, status=201, check=keep("s2"), note="no body")
    c.call("GET", f"{env(mid('e'))}/snapshots", status=200,
           check=lambda r: expect(len(r.json["snapshots"]) == 2, r.json))
    c.call("GET", "/v1/snapshots", status=200, check=lambda r: expect(len(r.json["snapshots"]) >= 2, r.json))
    c.call("GET", f"/v1/snapshots?environment_id={mid('e')}", status=200)
    c.call("GET", f"/v1/snapshots/{mid('s', 'snap-000000000000')}", status=200)
    c.call("POST", f"{env(mid('e'))}/exec", {"cmd": ["sh", "-c", "echo two > /workspace/f"]}, status=200)
    c.call("POST", f"{env(mid('e'))}/restore", {"snapshot": mid("s", "snap-000000000000")}, status=200)
    c.call("POST", f"{env(mid('e'))}/exec", {"cmd": ["cat", "/workspace/f"]}, status=200,
           check=lambda r: expect(r.json["stdout"] == "one\n", r.json))
    c.call("POST", f"{env(mid('e'))}/fork", {"task_id": "fork", "ttl_s": 600}, status=201, check=keep("f"))
    c.call("POST", envs, {"snapshot": mid("s", "snap-000000000000"), "spec": small}, status=201, check=keep("g"))
    c.call("POST", f"{env(mid('e'))}/snapshots", {"tag": "x"}, status=400, code="unknown_field", field="tag")
    c.call("POST", f"{env(mid('e'))}/restore", {}, status=400, code="invalid_request", field="snapshot")
    c.call("POST", f"{env(mid('e'))}/restore", {"snapshot": "../envs/x"}, status=400, code="invalid_request",
           field="snapshot", expressible=False)
    c.call("POST", f"{env(mid('e'))}/restore", {"snapshot": "snap-000000000000"}, status=404, code="not_found")
    c.call("POST", envs, {"snapshot": mid("s", "snap-000000000000"), "template": "host"}, status=400,
           code="invalid_request", field="template", expressible=False)
    c.call("POST", f"{env(mid('e'))}/fork", {"spec": small}, status=400, code="unknown_field", field="spec")
    # Changes: the restored f ("one") against the template, nothing since snapshot one.
    c.call("GET", f"{env(mid('e'))}/changes", status=200,
           check=lambda r: expect([(x["path"], x["change"], x.get("diff")) for x in r.json["changes"]] ==
                                  [("/workspace/f", "added", "@@ -0,0 +1 @@\n+one\n")], r.json))
    if ALL_MICROVM_TREE:
        c.call("GET", f"{env(mid('e'))}/changes?against={mid('s', 'snap-000000000000')}&diff=0", status=400,
               code="unsupported", note="a microVM's are against its template")
    else:
        c.call("GET", f"{env(mid('e'))}/changes?against={mid('s', 'snap-000000000000')}&diff=0", status=200,
               check=lambda r: expect(r.json["changes"] == [] and r.json["truncated"] is False, r.json))
    c.call("GET", f"{env(mid('e'))}/changes?against=other", status=400, code="invalid_request", field="against")
    c.call("GET", f"{env(mid('e'))}/changes?against=snap-000000000000", status=404, code="not_found",
           field="against")
    c.call("GET", f"{env(mid('e'))}/changes?colour=1", status=400, code="unknown_field", field="colour")
    c.call("DELETE", f"{env(mid('e'))}/changes", status=405, code="method_not_allowed")
    c.call("GET", "/v1/snapshots/snap-000000000000", status=404, code="not_found")
    c.call("DELETE", f"/v1/snapshots/{mid('s', 'snap-000000000000')}", status=204)
    c.call("DELETE", f"/v1/snapshots/{mid('s2', 'snap-000000000000')}", status=204)
    c.call("DELETE", f"/v1/snapshots/{mid('s2', 'snap-000000000000')}", status=404, code="not_found")
    for name in ("e", "f", "g"):
        c.call("DELETE", env(mid(name)), status=204)


def run_template_exchanges(c):
    """Templates (docs/API.md, "Templates"): the list, an import that fails
    (no image is needed to see every answer's shape), refusals, delete."""
    c.call("GET", "/v1/templates", status=200,
           check=lambda r: expect(r.json["templates"][0]["name"] == "host", r.json))
    c.call("GET", "/v1/templates/host", status=200)
    c.call("POST", "/v1/templates", {"name": "conf:1", "source": "docker-archive:/nonexistent/moat.tar"},
           status=202, check=lambda r: expect(r.json["state"] == "importing", r.json))
    c.call("POST", "/v1/templates", {"name": "conf:1", "source": "docker-archive:/nonexistent/moat.tar"},
           status=409, code="conflict")
    deadline = time.monotonic() + 30
    state = "importing"
    while state == "importing" and time.monotonic() < deadline:
        time.sleep(0.1)  # the import runs in moatd; polled as a client does
        state = c.daemon.request("GET", "/v1/templates/conf:1").json.get("state")
    c.call("GET", "/v1/templates/conf:1", status=200,
           check=lambda r: expect(r.json["state"] == "failed" and "moat.tar" in r.json["error"]["message"], r.json))
    c.call("POST", "/v1/environments", {"template": "conf:1"}, status=409, code="conflict")
    c.call("POST", "/v1/environments", {"template": "nothing-here"}, status=404, code="not_found")
    c.call("POST", "/v1/templates", {"name": "Bad", "source": "docker://x"}, status=400, code="invalid_request",
           field="name", expressible=False)
    c.call("POST", "/v1/templates", {"name": "ok", "source": "ftp://x"}, status=400, code="invalid_request",
           field="source")
    c.call("POST", "/v1/templates", {"name": "ok", "source": "docker://x", "tag": 1}, status=400,
           code="unknown_field", field="tag", expressible=False)
    # A recipe (docs/TEMPLATES.md, "Recipes") whose second step fails.
    c.call("POST", "/v1/templates", {"name": "built", "build": {"base": "host", "run": ["true", "exit 3"]}},
           status=202, check=lambda r: expect(r.json["state"] == "building" and r.json["source"] == "build:host",
                                              r.json))
    deadline = time.monotonic() + 60
    state = "building"
    while state == "building" and time.monotonic() < deadline:
        time.sleep(0.1)  # the build runs in moatd; polled as a client does
        state = c.daemon.request("GET", "/v1/templates/built").json.get("state")
    c.call("GET", "/v1/templates/built", status=200,
           check=lambda r: expect(r.json["state"] == "failed" and "step 2/2" in r.json["error"]["message"], r.json))
    c.call("DELETE", "/v1/templates/built", status=204)
    c.call("POST", "/v1/templates", {"name": "ok", "build": {"base": "nothing-here", "run": ["true"]}}, status=404,
           code="not_found", field="build.base")
    c.call("POST", "/v1/templates", {"name": "ok", "build": {"base": "host"}}, status=400,
           code="invalid_request", field="build.run")
    c.call("DELETE", "/v1/templates/host", status=409, code="conflict")
    c.call("DELETE", "/v1/templates/conf:1", status=204)
    c.call("DELETE", "/v1/templates/conf:1", status=404, code="not_found")
    c.call("GET", "/v1/templates/conf:1", status=404, code="not_found")


def run_gate_exchanges(c):
    """The gate: permissions on create (and their validation), deny on every
    gated operation, ask answered by a person (waiting, or 202 with Prefer:
    respond-async), remember, expiry after --approval-timeout, layers, key
    ceilings, the approve and permissions scopes. Every environment made here
    is destroyed at the end."""
    d = c.daemon
    envs = "/v1/environments"
    env = lambda i: f"{envs}/{i}"  # noqa: E731
    small = {"ram_mb": 256, "storage_gb": 1, "pids": 128}
    octet = "application/octet-stream"
    prefer = {"Prefer": "respond-async"}
    nobody = "000000000000"
    no_token = "moat_" + "0" * 12 + "_" + "0" * 64
    made, keys, asked = {}, {}, {}

    def eid(name):
        return made.get(name, nobody)

    def tok(label):
        return keys.get(label, {}).get("token", no_token)

    def kid(label):
        return keys.get(label, {}).get("id", nobody)

    def aid(name):
        return asked.get(name, nobody)

    def approval(name):
        return f"/v1/approvals/{aid(name)}"

    def all_of(*checks):
        def check(r):
            for one in checks:
                one(r)
        return check

    def has(**want):
        def check(r):
            for k, v in want.items():
                got = r.json.get(k)
                expect(v(got) if callable(v) else got == v, f"{k} = {got!r}, expected {v!r}")
        return check

    def lacks(*names):
        return lambda r: expect(not any(n in r.json for n in names),
                                f"{[n for n in names if n in r.json]} present: {r.json}")

    def ran(stdout=None):
        def check(r):
            expect(r.json["exit_code"] == 0, f"exit_code {r.json['exit_code']}: {r.json['stderr']!r}")
            if stdout is not None:
                expect(r.json["stdout"] == stdout, f"stdout {r.json['stdout']!r}, expected {stdout!r}")
        return check

    def says(*texts):
        def check(r):
            message = r.json["error"]["message"]
            for text in texts:
                expect(text in message, f"message {message!r} does not say {text!r}")
        return check

    def environment(name, permissions, layers=None):
        """A created (or fetched) environment: its permissions as shown."""
        def check(r):
            if name is not None:
                made[name] = r.json["id"]
            expect(r.json["state"] == "running", f"state {r.json['state']}")
            expect(r.json.get("permissions") == permissions,
                   f"permissions {r.json.get('permissions')}, expected {permissions}")
            expect(r.json.get("permission_layers") == layers,
                   f"permission_layers {r.json.get('permission_layers')!r}, expected {layers!r}")
        return check

    def layers_are(*want, ceiling=None):
        def check(r):
            j = r.json
            expect(j["layers"] == list(want), f"layers {j['layers']}, expected {list(want)}")
            expect(j["permissions"] == want[0], f"permissions {j['permissions']} is not the first layer")
            expect(j.get("ceiling") == ceiling, f"ceiling {j.get('ceiling')}, expected {ceiling}")
        return check

    def denied(action, rule=None, approval=None, text=()):
        """403 denied_by_policy: the scope, exactly this action, the rule that
        decided (None: absent, no rule matched) and the approval asked (None:
        absent; a name: that approval's id; True: any)."""
        def check(r):
            e = r.json["error"]
            want = action() if callable(action) else action
            expect(e["scope"] == want["scope"], f"scope {e['scope']}, expected {want['scope']}")
            expect(e["action"] == want, f"action {e['action']}, expected {want}")
            expect(e.get("rule") == rule, f"rule {e.get('rule')}, expected {rule}")
            if approval is None:
                expect("approval" not in e, f"approval {e.get('approval')} with nobody asked")
            elif approval is True:
                expect("approval" in e, "no approval named")
            else:
                expect(e.get("approval") == aid(approval), f"approval {e.get('approval')}, expected {aid(approval)}")
            says(*text)(r)
        return check

    def pending(name, env_name, action, requester="master"):
        """202: the approval (pending, this action), Location naming it."""
        def check(r):
            a = r.json["approval"]
            expect(a["id"] not in asked.values(), f"approval {a['id']} was asked before")
            asked[name] = a["id"]
            want = action() if callable(action) else action
            expect(r.headers.get("Location") == f"/v1/approvals/{a['id']}",
                   f"Location {r.headers.get('Location')!r}, expected /v1/approvals/{a['id']}")
            expect(a["state"] == "pending", f"state {a['state']}")
            expect(a["environment"] == eid(env_name), f"environment {a['environment']}, expected {eid(env_name)}")
            expect(a["scope"] == want["scope"] and a["action"] == want,
                   f"scope {a['scope']}, action {a['action']}, expected {want}")
            expect(a["requester"] == requester, f"requester {a['requester']}, expected {requester}")
            expect(a["id"] in r.json["message"], f"message {r.json['message']!r} does not name the approval")
        return check

    def approval_is(name, state, decided_by=None, reason=None, remember=None, requester=None):
        def check(r):
            a = r.json
            expect(a["id"] == aid(name), f"id {a['id']}, expected {aid(name)}")
            expect(a["state"] == state, f"state {a['state']}, expected {state}")
            if state == "pending":
                expect(not {"decided_by", "decided_at", "reason", "remember"} & set(a), f"a pending one is decided: {a}")
            else:
                expect(a["decided_at"] >= a["created_at"], f"decided_at {a['decided_at']} before created_at")
            for k, v in (("decided_by", decided_by), ("reason", reason), ("remember", remember),
                         ("requester", requester)):
                if v is not None:
                    got = a.get(k)
                    expect(v(got) if callable(v) else got == v, f"{k} {got!r}, expected {v!r}")
        return check

    def listed(names=(), state=None, environment=None, absent=()):
        def check(r):
            got = r.json["approvals"]
            ids = [a["id"] for a in got]
            for name in names:
                expect(aid(name) in ids, f"{name} ({aid(name)}) not listed: {ids}")
            for name in absent:
                expect(aid(name) not in ids, f"{name} ({aid(name)}) listed")
            if state is not None:
                expect(all(a["state"] == state for a in got), f"states {[a['state'] for a in got]}, only {state} asked")
            if environment is not None:
                expect(all(a["environment"] == eid(environment) for a in got),
                       f"environments {set(a['environment'] for a in got)}, only {eid(environment)} asked")
            stamps = [a["created_at"] for a in got]
            expect(stamps == sorted(stamps, reverse=True), f"not newest first: {stamps}")
        return check

    def wait_asked(env_name, argv, timeout=10):
        """The id of the pending approval for `argv` in an environment (a
        request waiting for a person, on another thread, asked it)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            r = d.request("GET", f"/v1/approvals?state=pending&environment={eid(env_name)}")
            if r.status == 200:
                for a in r.json["approvals"]:
                    if a["action"].get("argv") == argv:
                        return a["id"]
            time.sleep(0.05)
        return nobody

    def in_background(line, call):
        """Runs an exchange that waits for a person on a thread; the returned
        function joins it (a failure if it is still waiting)."""
        box = {}
        thread = threading.Thread(target=lambda: box.setdefault("r", call()), daemon=True)
        thread.start()

        def join(timeout=30):
            thread.join(timeout)
            if thread.is_alive():
                c.report(False, line, f"still waiting after {timeout} s")
            return box.get("r")
        return join

    def timed(call, low, high, what):
        started = time.monotonic()
        r = call()
        took = time.monotonic() - started
        c.report(low <= took <= high, f"{what}: {took:.2f} s (expected {low} to {high})",
                 f"took {took:.2f} s")
        return r

    # Permissions on create: rules in every scope, shown as written.
    g_perms = {
        "read_file": [{"path": "/workspace/private/**", "action": "deny"}, {"path": "/**", "action": "allow"}],
        "write_file": [{"path": "/workspace/**", "action": "allow"}, {"path": "/tmp/ask-*", "action": "ask"},
                       {"path": "/etc/**", "action": "deny"},
                       # a move reaches what is below its ends (docs/GATE.md, "Actions on a whole tree")
                       {"path": "/tmp/ask-*/**", "action": "ask"}],
        "run_command": [{"match": ["rm", "*"], "action": "deny"}, {"match": ["bash"], "action": "deny"},
                        {"match": ["sh"], "action": "deny"}, {"match": ["touch", "*"], "action": "ask"},
                        {"match": ["*"], "action": "allow"}],
        "network": [{"host": "*.example.com", "port": 443, "action": "allow"}, {"host": "*", "action": "deny"}],
    }
    c.call("POST", envs, {"task_id": "gate", "spec": small, "permissions": g_perms}, status=201,
           check=environment("g", g_perms), note="rules in every scope")
    g = eid("g")
    c.call("GET", env(g), status=200, check=environment(None, g_perms))
    c.call("GET", env(g) + "/permissions", status=200, check=layers_are(g_perms))
    h_perms = dict(DEFAULT_PERMISSIONS, run_command="ask", read_file="ask")
    c.call("POST", envs, {"spec": small, "permissions": {"run_command": "ask", "read_file": "ask"}}, status=201,
           check=environment("h", h_perms), note="scopes left out get the defaults")
    h = eid("h")

    # Their validation: errors name the field.
    bad = [
        ({"run_command": [{"match": ["ls"], "action": "allow"}, {"match": ["rm"], "action": "maybe"}]},
         "invalid_request", "permissions.run_command[1].action"),
        ({"run_command": [{"match": ["ls"]}]}, "invalid_request", "permissions.run_command[0].action"),
        ({"read_file": [{"path": "/x", "action": "allow", "host": "h"}]}, "unknown_field",
         "permissions.read_file[0].host"),
        ({"run_command": [{"path": "/x", "action": "allow"}]}, "unknown_field", "permissions.run_command[0].path"),
        ({"network": [{"match": ["x"], "action": "allow"}]}, "unknown_field", "permissions.network[0].match"),
        ({"write_file": [{"path": "/x", "action": "deny", "port": 1}]}, "unknown_field",
         "permissions.write_file[0].port"),
        ({"network": [{"host": "a", "port": 70000, "action": "deny"}]}, "invalid_request",
         "permissions.network[0].port"),
        ({"network": [{"host": "a", "port": 80.5, "action": "deny"}]}, "invalid_request",
         "permissions.network[0].port"),
        ({"network": [{"host": "", "action": "deny"}]}, "invalid_request", "permissions.network[0].host"),
        ({"write_file": [{"path": "relative/**", "action": "deny"}]}, "invalid_request",
         "permissions.write_file[0].path"),
        ({"run_command": [{"match": [], "action": "deny"}]}, "invalid_request", "permissions.run_command[0].match"),
        ({"run_command": [{"match": ["ls", 5], "action": "deny"}]}, "invalid_request",
         "permissions.run_command[0].match[1]"),
        ({"run_command": ["deny"]}, "invalid_request", "permissions.run_command[0]"),
        ({"run_command": []}, "invalid_request", "permissions.run_command"),
        ({"run_command": "maybe"}, "invalid_request", "permissions.run_command"),
        ({"exec": "allow"}, "unknown_field", "permissions.exec"),
        ("allow", "invalid_request", "permissions"),
    ]
    for permissions, code, field in bad:
        c.call("POST", envs, {"spec": small, "permissions": permissions}, status=400, code=code, field=field)

    # deny, on every gated operation; the rule that decided is named.
    rm = ["rm", "-rf", "/workspace"]
    c.call("POST", env(g) + "/exec", {"cmd": rm}, status=403, code="denied_by_policy",
           check=denied({"scope": "run_command", "op": "exec", "argv": rm}, g_perms["run_command"][0],
                        text=("rule 1 of the environment's permissions",)), note="exec")
    c.call("POST", env(g) + "/exec", {"cmd": ["/usr/bin/rm", "-f", "/workspace/x"]}, status=403,
           code="denied_by_policy",
           check=denied({"scope": "run_command", "op": "exec", "argv": ["/usr/bin/rm", "-f", "/workspace/x"]},
                        g_perms["run_command"][0]), note="a program's base name matches")
    c.call("POST", env(g) + "/processes", {"cmd": ["rm", "/workspace/x"]}, status=403, code="denied_by_policy",
           check=denied({"scope": "run_command", "op": "process", "argv": ["rm", "/workspace/x"]},
                        g_perms["run_command"][0]), note="process start")

    def shell_denied(r):
        e = r.json["error"]
        argv = e["action"].get("argv")
        expect(argv in (["/bin/bash"], ["/bin/sh"]), f"argv {argv}")
        rule = {"match": [argv[0].rsplit("/", 1)[-1]], "action": "deny"}
        denied({"scope": "run_command", "op": "shell", "argv": argv}, rule)(r)
    c.call("GET", env(g) + "/shell", websocket=True, status=403, code="denied_by_policy", check=shell_denied,
           note="shell")
    files = env(g) + "/files"
    c.call("PUT", files + "?path=/etc/motd", b"hi", content_type=octet, status=403, code="denied_by_policy",
           check=denied({"scope": "write_file", "op": "write", "path": "/etc/motd", "size": 2, "sha256": hashlib.sha256(b"hi").hexdigest()},
                        g_perms["write_file"][2], text=("rule 3 of",)), note="file write")
    c.call("PUT", files + "?path=/workspace/../etc/passwd", b"x", content_type=octet, status=403,
           code="denied_by_policy",
           check=denied({"scope": "write_file", "op": "write", "path": "/etc/passwd", "size": 1, "sha256": hashlib.sha256(b"x").hexdigest()},
                        g_perms["write_file"][2]), note="the normalized path")
    c.call("DELETE", files + "?path=/etc/hostname", status=403, code="denied_by_policy",
           check=denied({"scope": "write_file", "op": "remove", "path": "/etc/hostname", "size": 0},
                        g_perms["write_file"][2]), note="file remove")
    c.call("POST", files + "/mkdir", {"path": "/etc/new"}, status=403, code="denied_by_policy",
           check=denied({"scope": "write_file", "op": "mkdir", "path": "/etc/new", "size": 0},
                        g_perms["write_file"][2]), note="mkdir")
    c.call("PUT", files + "?path=/var/tmp/x", b"", content_type=octet, status=403, code="denied_by_policy",
           check=denied({"scope": "write_file", "op": "write", "path": "/var/tmp/x", "size": 0, "sha256": hashlib.sha256(b"").hexdigest()}, None,
                        text=("no rule of the environment's permissions matched (deny by default)",)),
           note="no rule matched")
    c.call("PUT", files + "?path=/workspace/ok.txt", b"ok", content_type=octet, status=200, note="allowed")
    c.call("POST", files + "/move", {"from": "/workspace/ok.txt", "to": "/etc/ok.txt"}, status=403,
           code="denied_by_policy",
           check=denied({"scope": "write_file", "op": "move", "path": "/etc/ok.txt", "size": 0, "tree": True},
                        g_perms["write_file"][2]), note="move: the other end")
    c.call("GET", files + "?path=/workspace/ok.txt", status=200,
           check=lambda r: expect(r.body == b"ok", f"body {r.body!r}"), note="not moved")
    c.call("PUT", files + "?path=/workspace/private/key", b"k", content_type=octet, status=200)
    c.call("POST", files + "/mkdir", {"path": "/workspace/private/d"}, status=200)
    c.call("GET", files + "?path=/workspace/private/key", status=403, code="denied_by_policy",
           check=denied({"scope": "read_file", "op": "read", "path": "/workspace/private/key"},
                        g_perms["read_file"][0]), note="file read")
    c.call("GET", files + "/stat?path=/workspace/private/key", status=403, code="denied_by_policy",
           check=denied({"scope": "read_file", "op": "stat", "path": "/workspace/private/key"},
                        g_perms["read_file"][0]), note="stat")
    c.call("GET", files + "/list?path=/workspace/private/d", status=403, code="denied_by_policy",
           check=denied({"scope": "read_file", "op": "list", "path": "/workspace/private/d"},
                        g_perms["read_file"][0]), note="list")
    c.call("GET", files + "/list?path=/workspace/private", status=200, note="** does not match the directory itself")
    c.call("POST", env(g) + "/exec", {"cmd": ["sh", "-c", "echo allowed"]}, status=200, check=ran("allowed\n"),
           note="[\"sh\"] matches only a bare sh")

    # ask, waiting: a person decides from another thread.
    t1 = ["touch", "/workspace/t1"]
    join = in_background("exec waiting for an approval", lambda: c.call(
        "POST", env(g) + "/exec", {"cmd": t1}, status=200, check=ran(), note="asks, approved: runs"))
    asked["t1"] = wait_asked("g", t1)
    c.call("GET", f"/v1/approvals?state=pending&environment={g}", status=200,
           check=listed(["t1"], state="pending", environment="g"))
    c.call("GET", approval("t1"), status=200,
           check=all_of(approval_is("t1", "pending", requester="master"),
                        has(scope="run_command", environment=g,
                            action={"scope": "run_command", "op": "exec", "argv": t1})))
    c.call("POST", approval("t1"), {"decision": "approve", "reason": "fine"}, status=200,
           check=approval_is("t1", "approved", decided_by="master", reason="fine", remember=False))
    join()
    c.call("GET", files + "/stat?path=/workspace/t1", status=200, note="it ran")
    c.call("POST", approval("t1"), {"decision": "deny"}, status=409, code="conflict",
           check=says("already approved"), note="decided twice")

    t2 = ["touch", "/workspace/t2"]
    join = in_background("exec waiting for a denial", lambda: c.call(
        "POST", env(g) + "/exec", {"cmd": t2}, status=403, code="denied_by_policy",
        check=denied({"scope": "run_command", "op": "exec", "argv": t2}, g_perms["run_command"][3],
                     approval="t2", text=("denied by master: not now",)), note="asks, denied"))
    asked["t2"] = wait_asked("g", t2)
    c.call("POST", approval("t2"), {"decision": "deny", "reason": "not now"}, status=200,
           check=approval_is("t2", "denied", decided_by="master", reason="not now"))
    join()
    c.call("GET", files + "/stat?path=/workspace/t2", status=404, code="not_found", note="it did not run")

    # Nobody answers: denied after --approval-timeout, the approval expired.
    late = ["touch", "/workspace/late"]

    def remember_expired(r):
        asked["late"] = r.json["error"].get("approval", nobody)
    timed(lambda: c.call("POST", env(g) + "/exec", {"cmd": late}, status=403, code="denied_by_policy",
                         check=all_of(remember_expired,
                                      denied({"scope": "run_command", "op": "exec", "argv": late},
                                             g_perms["run_command"][3], approval="late",
                                             text=(f"no decision within {APPROVAL_TIMEOUT_S} s",))),
                         note="nobody decides"),
          APPROVAL_TIMEOUT_S - 0.2, APPROVAL_TIMEOUT_S + 3, "an unanswered ask waits for --approval-timeout")
    c.call("GET", approval("late"), status=200,
           check=approval_is("late", "expired", decided_by="moatd", reason=f"no decision within {APPROVAL_TIMEOUT_S} s",
                             remember=False))
    c.call("POST", approval("late"), {"decision": "approve"}, status=409, code="conflict",
           check=says("already expired"), note="expired")

    # Prefer: respond-async: 202 at once; approve; the repeat runs once.
    touch_async = ["touch", "/workspace/async"]
    exec_async = {"scope": "run_command", "op": "exec", "argv": touch_async}
    c.call("POST", env(g) + "/exec", {"cmd": touch_async}, headers=prefer, status=202,
           check=pending("async", "g", exec_async), note="Prefer: respond-async")
    c.call("GET", files + "/stat?path=/workspace/async", status=404, code="not_found", note="nothing ran yet")
    timed(lambda: c.call("GET", approval("async") + "?wait=1", status=200, check=approval_is("async", "pending"),
                         note="wait=1: still pending"), 0.9, 5, "wait=1 waits a second")
    c.call("POST", approval("async"), {"decision": "approve"}, status=200, check=approval_is("async", "approved"))
    timed(lambda: c.call("GET", approval("async") + "?wait=30", status=200, check=approval_is("async", "approved"),
                         note="decided: at once"), 0, 2, "wait on a decided approval answers at once")
    c.call("POST", env(g) + "/exec", {"cmd": touch_async}, headers=prefer, status=200, check=ran(),
           note="the repeat runs")
    c.call("GET", files + "/stat?path=/workspace/async", status=200, note="it ran")
    c.call("POST", env(g) + "/exec", {"cmd": touch_async}, headers=prefer, status=202,
           check=pending("async2", "g", exec_async), note="a second repeat asks again: the grant is used up")

    # A long poll hears a decision made meanwhile: the decision is made once
    # moatd has read the whole poll, and the poll must answer after it (not
    # at once, not at the end of its wait). A denied one is asked again.
    poll = {}

    def long_poll():
        r = c.call("GET", approval("async2") + "?wait=30", status=200, check=approval_is("async2", "denied"),
                   note="wait=30, denied meanwhile", sent=lambda sock: poll.setdefault("socket", sock))
        poll["answered"] = time.monotonic()
        return r

    def poll_read():
        if "answered" in poll:
            return True
        try:
            return "socket" in poll and unread(poll["socket"]) == 0
        except (OSError, ValueError):  # closed: the exchange is over
            return True
    join = in_background("long poll", long_poll)
    deadline = time.monotonic() + 10
    while not poll_read() and time.monotonic() < deadline:
        time.sleep(0.005)
    c.report(poll_read() and "answered" not in poll, "the long poll waits once moatd has read it",
             f"read: {poll_read()}, answered already: {'answered' in poll}")
    decided = time.monotonic()
    c.call("POST", approval("async2"), {"decision": "deny"}, status=200, check=approval_is("async2", "denied"))
    join()
    took = poll.get("answered", decided + 99) - decided
    c.report(0 <= took <= 5, f"a long poll answers when it is decided: {took:.2f} s after the decision "
             "(expected 0 to 5)", f"{took:.2f} s")
    c.call("POST", env(g) + "/exec", {"cmd": touch_async}, headers=prefer, status=202,
           check=pending("async3", "g", exec_async), note="after a denial: asks again")
    c.call("PUT", files + "?path=/tmp/ask-1", b"asked", content_type=octet, headers=prefer, status=202,
           check=pending("file", "g", {"scope": "write_file", "op": "write", "path": "/tmp/ask-1", "size": 5, "sha256": hashlib.sha256(b"asked").hexdigest()}),
           note="a file write asks")
    c.call("POST", approval("file"), {"decision": "approve"}, status=200)
    c.call("PUT", files + "?path=/tmp/ask-1", b"asked", content_type=octet, headers=prefer, status=200,
           note="approved: written")
    c.call("GET", files + "?path=/tmp/ask-1", status=200, check=lambda r: expect(r.body == b"asked", f"{r.body!r}"))
    c.call("DELETE", files + "?path=/tmp/ask-1", headers=prefer, status=202,
           check=pending("remove", "g", {"scope": "write_file", "op": "remove", "path": "/tmp/ask-1", "size": 0}),
           note="a remove asks")
    c.call("POST", files + "/mkdir", {"path": "/tmp/ask-d"}, headers=prefer, status=202,
           check=pending("mkdir", "g", {"scope": "write_file", "op": "mkdir", "path": "/tmp/ask-d", "size": 0}),
           note="a mkdir asks")
    c.call("POST", files + "/move", {"from": "/workspace/ok.txt", "to": "/tmp/ask-moved"}, headers=prefer,
           status=202,
           check=pending("move", "g", {"scope": "write_file", "op": "move", "path": "/tmp/ask-moved", "size": 0,
                                       "tree": True}),
           note="a move asks for the end a rule asks for")
    c.call("POST", env(g) + "/processes", {"cmd": ["touch", "/workspace/p"]}, headers=prefer, status=202,
           check=pending("process", "g", {"scope": "run_command", "op": "process", "argv": ["touch", "/workspace/p"]}),
           note="a process start asks")

    # remember: the decision becomes an exact rule, first in the scope.
    star = ["touch", "/workspace/st*r"]
    c.call("POST", env(g) + "/exec", {"cmd": star}, headers=prefer, status=202,
           check=pending("star", "g", {"scope": "run_command", "op": "exec", "argv": star}))
    c.call("POST", approval("star"), {"decision": "approve", "remember": True}, status=200,
           check=approval_is("star", "approved", remember=True))
    star_rule = {"match": ["touch", "/workspace/st\\*r"], "action": "allow"}
    c.call("GET", env(g), status=200,
           check=environment(None, dict(g_perms, run_command=[star_rule] + g_perms["run_command"])),
           note="remembered as a rule, glob characters escaped")
    for n in (1, 2):
        c.call("POST", env(g) + "/exec", {"cmd": star}, headers=prefer, status=200, check=ran(),
               note=f"remembered: no longer asks ({n})")
    c.call("POST", env(g) + "/exec", {"cmd": ["touch", "/workspace/stXr"]}, headers=prefer, status=202,
           check=pending("other", "g", {"scope": "run_command", "op": "exec", "argv": ["touch", "/workspace/stXr"]}),
           note="the rule is exact")
    never = ["touch", "/workspace/never"]
    c.call("POST", env(g) + "/exec", {"cmd": never}, headers=prefer, status=202,
           check=pending("never", "g", {"scope": "run_command", "op": "exec", "argv": never}))
    c.call("POST", approval("never"), {"decision": "deny", "remember": True}, status=200,
           check=approval_is("never", "denied", remember=True))
    c.call("POST", env(g) + "/exec", {"cmd": never}, headers=prefer, status=403, code="denied_by_policy",
           check=denied({"scope": "run_command", "op": "exec", "argv": never},
                        {"match": never, "action": "deny"}, text=("rule 1 of",)),
           note="a remembered denial: denied without asking")

    # ask on the shell and on reads (h: run_command and read_file ask).
    def shell_pending(r):
        argv = r.json["approval"]["action"].get("argv")
        expect(argv in (["/bin/bash"], ["/bin/sh"]), f"argv {argv}")
        pending("shell", "h", {"scope": "run_command", "op": "shell", "argv": argv})(r)
    c.call("GET", env(h) + "/shell", websocket=True, headers=prefer, status=202, check=shell_pending,
           note="a shell asks")
    c.call("GET", env(h) + "/files/stat?path=/workspace", headers=prefer, status=202,
           check=pending("stat", "h", {"scope": "read_file", "op": "stat", "path": "/workspace"}), note="stat asks")
    c.call("GET", env(h) + "/files/list?path=/workspace/../tmp", headers=prefer, status=202,
           check=pending("list", "h", {"scope": "read_file", "op": "list", "path": "/tmp"}), note="list asks")
    c.call("PUT", env(h) + "/files?path=/workspace/w", b"w", content_type=octet, headers=prefer, status=200,
           note="write_file left at its default: allow")
    c.call("GET", env(h) + "/files?path=/workspace/w", headers=prefer, status=202,
           check=pending("read", "h", {"scope": "read_file", "op": "read", "path": "/workspace/w"}),
           note="a read asks")

    # The approvals list and its filters.
    c.call("GET", "/v1/approvals?state=pending", status=200,
           check=listed(["async3", "process", "remove", "mkdir", "move", "other", "shell", "stat", "list", "read"],
                        state="pending",
                        absent=["t1", "late"]))
    c.call("GET", f"/v1/approvals?environment={g}", status=200,
           check=listed(["t1", "t2", "late", "async", "async2", "async3", "star", "never"], environment="g",
                        absent=["shell"]))
    c.call("GET", f"/v1/approvals?state=expired&environment={g}", status=200,
           check=listed(["late"], state="expired", environment="g"))
    c.call("GET", "/v1/approvals", status=200, check=listed(["t1", "shell"]))

    # Request errors on approvals.
    c.call("GET", "/v1/approvals?state=bogus", status=400, code="invalid_request", field="state")
    c.call("GET", "/v1/approvals?colour=red", status=400, code="unknown_field", field="colour")
    c.call("GET", approval("other") + "?wait=301", status=400, code="invalid_request", field="wait")
    c.call("GET", approval("other") + "?wait=soon", status=400, code="invalid_request", field="wait")
    c.call("GET", approval("other") + "?verbose=1", status=400, code="unknown_field", field="verbose")
    c.call("GET", "/v1/approvals/" + nobody, status=404, code="not_found")
    c.call("POST", "/v1/approvals/" + nobody, {"decision": "approve"}, status=404, code="not_found")
    c.call("POST", approval("other"), {"decision": "maybe"}, status=400, code="invalid_request", field="decision")
    c.call("POST", approval("other"), {}, status=400, code="invalid_request", field="decision", note="no decision")
    c.call("POST", approval("other"), {"decision": "approve", "remember": "yes"}, status=400,
           code="invalid_request", field="remember")
    c.call("POST", approval("other"), {"decision": "deny", "reason": "r" * 1025}, status=400,
           code="invalid_request", field="reason")
    c.call("POST", approval("other"), {"decision": "deny", "why": "x"}, status=400, code="unknown_field", field="why")
    c.call("POST", approval("other"), "{not json", status=400, code="bad_json")
    c.call("POST", approval("other") + "?now=1", {"decision": "deny"}, status=400, code="unknown_field", field="now")
    c.call("GET", approval("other"), status=200, check=approval_is("other", "pending"), note="still pending")
    c.call("POST", "/v1/approvals", {"decision": "deny"}, status=405, code="method_not_allowed")
    c.call("DELETE", approval("other"), status=405, code="method_not_allowed")
    c.call("GET", approval("other") + "/more", status=404, code="not_found", note="unknown endpoint")

    # Keys: the approve and permissions scopes, and ceilings.
    def key_made(label, scopes, ceiling=None):
        def check(r):
            keys[label] = r.json
            expect(r.json["scopes"] == scopes, f"scopes {r.json['scopes']}, expected {scopes}")
            expect(r.json.get("permissions") == ceiling, f"permissions {r.json.get('permissions')}, expected {ceiling}")
        return check
    capped_ceiling = {"read_file": "allow", "write_file": "allow", "run_command": "deny", "network": "allow"}
    c.call("POST", "/v1/keys", {"name": "gatekeeper", "scopes": ["create", "read", "exec", "files", "approve"]},
           status=201, check=key_made("gatekeeper", ["create", "read", "exec", "files", "approve"]))
    c.call("POST", "/v1/keys", {"name": "approver", "scopes": ["approve"]}, status=201,
           check=key_made("approver", ["approve"]))
    c.call("POST", "/v1/keys", {"name": "admin", "scopes": ["create", "read", "exec", "permissions"]}, status=201,
           check=key_made("admin", ["create", "read", "exec", "permissions"]))
    c.call("POST", "/v1/keys", {"name": "capped", "scopes": ["create", "read", "exec", "files"],
                                "permissions": {"run_command": "deny"}}, status=201,
           check=key_made("capped", ["create", "read", "exec", "files"], capped_ceiling),
           note="a ceiling: scopes left out are not limited")
    c.call("POST", "/v1/keys", {"scopes": ["exec"],
                                "permissions": {"run_command": [{"match": ["ls"], "action": "allow", "port": 22}]}},
           status=400, code="unknown_field", field="permissions.run_command[0].port")
    c.call("POST", "/v1/keys", {"scopes": ["exec"], "permissions": {"run_command": "never"}}, status=400,
           code="invalid_request", field="permissions.run_command")

    def ceilings(r):
        got = {k["id"]: k.get("permissions") for k in r.json["keys"]}
        for label, ceiling in (("gatekeeper", None), ("approver", None), ("capped", capped_ceiling)):
            expect(kid(label) in got and got[kid(label)] == ceiling,
                   f"{label}: permissions {got.get(kid(label))}, expected {ceiling}")
    c.call("GET", "/v1/keys", status=200, check=ceilings, note="ceilings listed")

    # A key cannot decide its own approval; a key with `approve` can.
    k_perms = dict(DEFAULT_PERMISSIONS, run_command=[{"match": ["touch", "*"], "action": "ask"},
                                                     {"match": ["*"], "action": "allow"}])
    c.call("POST", envs, {"spec": small, "permissions": {"run_command": k_perms["run_command"]}},
           token=tok("gatekeeper"), status=201, check=environment("k", k_perms))
    k = eid("k")
    mine = ["touch", "/workspace/mine"]
    c.call("POST", env(k) + "/exec", {"cmd": mine}, token=tok("gatekeeper"), headers=prefer, status=202,
           check=pending("self", "k", {"scope": "run_command", "op": "exec", "argv": mine},
                         requester=kid("gatekeeper")), note="a key's request asks")
    c.call("POST", approval("self"), {"decision": "approve"}, token=tok("gatekeeper"), status=403,
           code="forbidden", scope_refusal=False, check=says("cannot decide"), note="its own approval")
    c.call("GET", "/v1/approvals", token=tok("capped"), status=403, code="forbidden", note="no approve scope")
    c.call("GET", approval("self"), token=tok("capped"), status=403, code="forbidden", note="no approve scope")
    c.call("POST", approval("self"), {"decision": "approve"}, token=tok("capped"), status=403, code="forbidden",
           note="no approve scope")
    c.call("GET", "/v1/approvals?state=pending", token=tok("approver"), status=200,
           check=listed(["self"], state="pending"))
    c.call("GET", approval("self"), token=tok("approver"), status=200,
           check=approval_is("self", "pending", requester=kid("gatekeeper")))
    c.call("POST", approval("self"), {"decision": "approve", "reason": "ok"}, token=tok("approver"), status=200,
           check=approval_is("self", "approved", decided_by=kid("approver"), reason="ok"))
    c.call("POST", env(k) + "/exec", {"cmd": mine}, token=tok("gatekeeper"), headers=prefer, status=200,
           check=ran(), note="approved by another key: runs")
    c.call("POST", env(k) + "/exec", {"cmd": mine}, token=tok("approver"), status=403, code="forbidden",
           note="an approver without exec")

    # Layers: a key adds one (it only tightens); replacing needs more.
    c.call("GET", env(k) + "/permissions", token=tok("gatekeeper"), status=200, check=layers_are(k_perms))
    c.call("GET", env(k) + "/permissions", token=tok("approver"), status=403, code="forbidden",
           note="an approver without read")
    locked = [{"path": "/workspace/locked/**", "action": "deny"}, {"path": "/**", "action": "allow"}]
    k_layer = {"read_file": "allow", "write_file": locked, "run_command": "allow", "network": "allow"}
    c.call("PUT", env(k) + "/permissions", {"permissions": {"write_file": locked}}, token=tok("gatekeeper"),
           status=200, check=layers_are(k_perms, k_layer), note="a key adds a layer")
    c.call("GET", env(k), token=tok("gatekeeper"), status=200, check=environment(None, k_perms, 2),
           note="permission_layers")
    c.call("PUT", env(k) + "/files?path=/workspace/locked/x", b"x", content_type=octet, token=tok("gatekeeper"),
           status=403, code="denied_by_policy",
           check=denied({"scope": "write_file", "op": "write", "path": "/workspace/locked/x", "size": 1, "sha256": hashlib.sha256(b"x").hexdigest()},
                        locked[0], text=("permission layer 1",)), note="the added layer denies")
    c.call("PUT", env(k) + "/files?path=/workspace/free", b"x", content_type=octet, token=tok("gatekeeper"),
           status=200, note="elsewhere still allowed")
    c.call("PUT", env(k) + "/permissions", {"permissions": {"write_file": "allow"}, "replace": True},
           token=tok("gatekeeper"), status=403, code="forbidden", field="replace",
           note="replace without the permissions scope")
    c.call("PUT", env(k) + "/permissions", {"permissions": {"run_command": "allow"}, "replace": True}, status=200,
           check=layers_are(DEFAULT_PERMISSIONS), note="the master replaces")
    c.call("GET", env(k), token=tok("gatekeeper"), status=200, check=environment(None, DEFAULT_PERMISSIONS),
           note="one layer again")
    c.call("PUT", env(k) + "/files?path=/workspace/locked/x", b"x", content_type=octet, token=tok("gatekeeper"),
           status=200, note="the layer is gone")
    c.call("POST", env(k) + "/exec", {"cmd": mine}, token=tok("gatekeeper"), headers=prefer, status=200,
           check=ran(), note="no longer asks")
    problems = []
    for _ in range(15):
        raw = json.dumps({"permissions": {}})
        r = d.request("PUT", env(k) + "/permissions", raw)
        try:
            expect(r.status == 200, f"status {r.status}: {r.body[:200]!r}")
            c.validate("PUT", env(k) + "/permissions", raw, r)
        except Failure as e:
            problems.append(str(e))
    c.report(not problems, f"PUT {env(k)}/permissions -> 200 x15 (16 layers)", "; ".join(problems[:3]))
    c.call("GET", env(k), status=200, check=environment(None, DEFAULT_PERMISSIONS, 16))
    c.call("PUT", env(k) + "/permissions", {"permissions": {}}, status=400, code="invalid_argument",
           check=says("at most 16 layers"), note="a 17th layer")

    # Request errors on permissions.
    perms = env(k) + "/permissions"
    c.call("PUT", perms, {"permissions": {"network": [{"host": "x", "port": "443", "action": "deny"}]}}, status=400,
           code="invalid_request", field="permissions.network[0].port")
    c.call("PUT", perms, {"permissions": {"disk": "deny"}}, status=400, code="unknown_field", field="permissions.disk")
    c.call("PUT", perms, {"replace": True}, status=400, code="invalid_request", field="permissions",
           note="no permissions")
    c.call("PUT", perms, {"permissions": {}, "replace": "yes"}, status=400, code="invalid_request", field="replace")
    c.call("PUT", perms, {"permissions": {}, "extra": 1}, status=400, code="unknown_field", field="extra")
    c.call("PUT", perms + "?x=1", {"permissions": {}}, status=400, code="unknown_field", field="x")
    c.call("GET", perms + "?x=1", status=400, code="unknown_field", field="x")
    c.call("PUT", perms, "{not json", status=400, code="bad_json")
    c.call("DELETE", perms, status=405, code="method_not_allowed")
    c.call("POST", perms, {"permissions": {}}, status=405, code="method_not_allowed")
    c.call("GET", env(nobody) + "/permissions", status=404, code="not_found")
    c.call("GET", env(k) + "/permissions", token=tok("capped"), status=404, code="not_found",
           note="another key's environment")

    # A key with the permissions scope replaces its own environment's.
    c.call("POST", envs, {"spec": small, "permissions": {"run_command": "deny"}}, token=tok("admin"), status=201,
           check=environment("m", dict(DEFAULT_PERMISSIONS, run_command="deny")))
    m = eid("m")
    c.call("POST", env(m) + "/exec", {"cmd": ["true"]}, token=tok("admin"), status=403, code="denied_by_policy",
           check=denied({"scope": "run_command", "op": "exec", "argv": ["true"]}, {"action": "deny"}))
    c.call("PUT", env(m) + "/permissions", {"permissions": {"run_command": "allow"}, "replace": True},
           token=tok("admin"), status=200, check=layers_are(DEFAULT_PERMISSIONS), note="the permissions scope")
    c.call("POST", env(m) + "/exec", {"cmd": ["true"]}, token=tok("admin"), status=200, check=ran())

    # A ceiling binds its key, whatever the environment allows.
    allow_all = {"read_file": "allow", "write_file": "allow", "run_command": "allow", "network": "allow"}
    c.call("POST", envs, {"spec": small, "permissions": allow_all}, token=tok("capped"), status=201,
           check=environment("capped", allow_all))
    ce = eid("capped")
    c.call("POST", env(ce) + "/exec", {"cmd": ["echo", "x"]}, token=tok("capped"), status=403,
           code="denied_by_policy",
           check=denied({"scope": "run_command", "op": "exec", "argv": ["echo", "x"]}, {"action": "deny"},
                        text=("the API key's ceiling",)), note="the ceiling denies")
    c.call("POST", env(ce) + "/processes", {"cmd": ["echo", "x"]}, token=tok("capped"), status=403,
           code="denied_by_policy", note="the ceiling denies",
           check=denied({"scope": "run_command", "op": "process", "argv": ["echo", "x"]}, {"action": "deny"}))
    c.call("GET", env(ce) + "/shell", websocket=True, token=tok("capped"), status=403, code="denied_by_policy",
           check=lambda r: expect(r.json["error"]["action"]["op"] == "shell", f"{r.json}"), note="the ceiling denies")
    c.call("PUT", env(ce) + "/files?path=/workspace/c", b"c", content_type=octet, token=tok("capped"), status=200,
           note="what the ceiling leaves out is not limited")
    c.call("GET", env(ce) + "/permissions", token=tok("capped"), status=200,
           check=layers_are(allow_all, ceiling=capped_ceiling), note="with the key's ceiling")
    c.call("POST", env(ce) + "/exec", {"cmd": ["echo", "x"]}, status=200, check=ran("x\n"),
           note="the master is not bound by the key's ceiling")

    # A destroyed environment: its pending approvals expire; no more layers.
    c.call("DELETE", env(g), status=204)
    c.call("GET", approval("async3"), status=200,
           check=approval_is("async3", "expired", decided_by="moatd", reason="the environment was destroyed"),
           note="expired with its environment")
    c.call("GET", env(g) + "/permissions", status=200, check=lambda r: expect(
        r.json["layers"][0]["run_command"][0] == {"match": never, "action": "deny"}, f"{r.json}"),
        note="a gone environment's")
    c.call("PUT", env(g) + "/permissions", {"permissions": {}}, status=409, code="conflict")
    c.call("POST", env(g) + "/exec", {"cmd": rm}, status=409, code="conflict", note="gone before the gate")
    for name in ("h", "k", "m", "capped"):
        c.call("DELETE", env(eid(name)), status=204)
    for label in ("gatekeeper", "approver", "admin", "capped"):
        c.call("DELETE", "/v1/keys/" + kid(label), status=204)


# --- main ---------------------------------------------------------------------


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True, help="api/openapi.yaml")
    parser.add_argument("--bin-dir", help="directory with the built moatd and moat-init")
    parser.add_argument("--spec-only", action="store_true", help="only lint the spec (no root needed)")
    parser.add_argument("--microvm", action="store_true",
                        help="the microVM subset: exchanges on a microVM environment (needs QEMU, busybox-static)")
    parser.add_argument("--microvm-all", action="store_true",
                        help="every exchange, its environments microVMs of a busybox tree (make test-microvm)")
    args = parser.parse_args()

    try:
        with open(args.spec) as f:
            doc = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as e:
        print(f"FAIL  spec: cannot read {args.spec}: {e}")
        print("0 passed, 1 failed")
        return 1
    problems = lint_spec(doc)
    if args.spec_only or problems:
        print(("PASS  " if not problems else "FAIL  ") + f"spec: {args.spec} is well-formed")
        for p in problems:
            print(f"      {p}")
        print(f"{0 if problems else 1} passed, {1 if problems else 0} failed")
        return 1 if problems else 0

    if os.geteuid() != 0:
        print("SKIP: needs root (moatd creates namespaces, cgroups and mounts; CI runs as root). "
              "The spec itself is well-formed.")
        return 77  # CTest's "skipped" (SKIP_RETURN_CODE), not a pass
    if not args.bin_dir:
        parser.error("--bin-dir is required")

    global ALL_MICROVM, ALL_MICROVM_TREE
    ALL_MICROVM = args.microvm_all
    tree = None
    if args.microvm or args.microvm_all:
        if busybox.missing():
            print("FAIL  microvm: " + busybox.missing())
            print("0 passed, 1 failed")
            return 1
        tree = busybox.busybox_tree(prefix="moat-api-vm-tree-")
        os.makedirs(tree + "/etc", 0o755)
        with open(tree + "/etc/hostname", "w") as f:  # a file that is not a program
            f.write("moat\n")
    daemon = Moatd(args.bin_dir)
    checker = Conformance(Spec(doc), daemon)
    checker.static(f"{args.spec} is well-formed ($refs, schemas, closed request bodies)", [])

    def terminated(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, terminated)
    try:
        daemon.start()
        if args.microvm_all:
            ALL_MICROVM_TREE = microvm_template(daemon, tree)
        if tree and not args.microvm_all:
            run_microvm_exchanges(checker, tree)
        else:
            run_exchanges(checker)
        if not daemon.alive():
            checker.report(False, "moatd still running after the exchanges", daemon.log())
    except KeyboardInterrupt as e:
        checker.report(False, "interrupted", str(e))
    except Exception as e:  # noqa: BLE001
        checker.report(False, "harness", f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
    finally:
        daemon.stop()
        code = daemon.proc.returncode if daemon.proc else None
        if code not in (None, 0):
            checker.report(False, "moatd exits 0 on SIGTERM", f"exit status {code}")
        if checker.failed:
            print("---- moatd log (tail) ----\n" + daemon.log())
        daemon.cleanup()
        if tree:
            shutil.rmtree(tree, ignore_errors=True)
    if checker.failures:
        print("\nfailures:")
        for f in checker.failures:
            print(f"  {f.splitlines()[0]}")
    print(f"{checker.passed} passed, {checker.failed} failed")
    return 0 if checker.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
