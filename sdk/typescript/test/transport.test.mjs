// The transport, the output stream and the WebSocket client against fake
// servers on loopback (no moatd, no root): retries, stream teardown, framing.

import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import http from "node:http";
import { once } from "node:events";
import { describe, it } from "node:test";

import {
  ApprovalPendingError,
  DeniedByPolicyError,
  ForbiddenError,
  FrameParser,
  Moat,
  MoatConnectionError,
  MoatError,
  MoatTimeoutError,
  UnavailableError,
  acceptKey,
  encodeFrame,
  errorFromResponse,
  parseOutputEvent,
} from "../dist/index.js";

/** A loopback server; `handler(req, res, n)` gets the request's number (1-based). */
async function serve(handler) {
  let count = 0;
  const requests = [];
  const server = http.createServer((req, res) => {
    count += 1;
    requests.push(`${req.method} ${req.url}`);
    handler(req, res, count);
  });
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  const { port } = server.address();
  return {
    server,
    requests,
    get count() {
      return count;
    },
    url: `http://127.0.0.1:${port}`,
    close: () => new Promise((resolve) => {
      server.closeAllConnections();
      server.close(() => resolve());
    }),
  };
}

const unavailable = (res) => {
  res.writeHead(503, { "Content-Type": "application/json" });
  res.end(JSON.stringify({ error: { code: "unavailable", message: "too many connections; retry later" } }));
};

describe("retries", () => {
  it("never retries a POST, retries GET, PUT and DELETE a bounded number of times", async () => {
    const fake = await serve((req, res) => unavailable(res));
    const client = new Moat({ baseUrl: fake.url, token: "t", maxRetries: 2, retryDelayMs: 1 });
    try {
      await assert.rejects(client.environments.exec("abc", { cmd: ["true"] }), UnavailableError);
      assert.equal(fake.count, 1, "exec (POST) was sent once");
      await assert.rejects(client.environments.create({ task_id: "x" }), (e) => e.status === 503);
      assert.equal(fake.count, 2, "create (POST) was sent once");
      await assert.rejects(client.environments.processes.start("abc", { cmd: ["x"] }), UnavailableError);
      await assert.rejects(client.environments.files.mkdir("abc", "/x"), UnavailableError);
      assert.equal(fake.count, 4);

      await assert.rejects(client.environments.list(), UnavailableError);
      assert.equal(fake.count, 4 + 3, "GET: one try and two retries");
      await assert.rejects(client.environments.destroy("abc"), UnavailableError);
      assert.equal(fake.count, 7 + 3, "DELETE: one try and two retries");
      await assert.rejects(client.environments.files.write("abc", "/x", "data"), UnavailableError);
      assert.equal(fake.count, 10 + 3, "PUT of a file: one try and two retries");
    } finally {
      client.close();
      await fake.close();
    }
  });

  it("waits what a 429's Retry-After asks before the retry (a key over its rate)", async () => {
    const at = [];
    const fake = await serve((req, res, n) => {
      at.push(performance.now());
      if (n === 1) {
        res.writeHead(429, { "Content-Type": "application/json", "Retry-After": "1" });
        res.end(JSON.stringify({ error: { code: "capacity", message: "rate limited: retry in 1 s" } }));
        return;
      }
      res.writeHead(200, { "Content-Type": "application/json" });
      res.end(JSON.stringify({ environments: [] }));
    });
    const client = new Moat({ baseUrl: fake.url, token: "t", retryDelayMs: 1 });
    try {
      assert.deepEqual(await client.environments.list(), []);
      assert.equal(fake.count, 2);
      assert.ok(at[1] - at[0] >= 990, `retried after ${at[1] - at[0]} ms, not the 1 s asked`);
      // A wait longer than 30 s is the caller's to decide: the error comes at once.
      const far = await serve((req, res) => {
        res.writeHead(429, { "Content-Type": "application/json", "Retry-After": "3600" });
        res.end(JSON.stringify({ error: { code: "capacity", message: "rate limited: retry in 3600 s" } }));
      });
      const impatient = new Moat({ baseUrl: far.url, token: "t", retryDelayMs: 1 });
      try {
        await assert.rejects(impatient.environments.list(), (err) => err.retryAfterMs === 3_600_000);
        assert.equal(far.count, 1);
      } finally {
        impatient.close();
        await far.close();
      }
      const e = errorFromResponse(429, "{}", "3");
      assert.equal(e.retryAfterMs, 3000);
      assert.equal(errorFromResponse(429, "{}", "Wed, 21 Oct 2026 07:28:00 GMT").retryAfterMs, undefined);
    } finally {
      client.close();
      await fake.close();
    }
  });

  it("does not retry a POST whose connection broke, and a GET succeeds on a later try", async () => {
    const fake = await serve((req, res, n) => {
      if (req.method === "POST" || n < 4) {
        req.socket.destroy();  // the connection breaks before an answer
        return;
      }
      res.writeHead(200, { "Content-Type": "application/json" });
      res.end(JSON.stringify({ environments: [] }));
    });
    const client = new Moat({ baseUrl: fake.url, token: "t", retryDelayMs: 1 });
    try {
      await assert.rejects(client.environments.exec("abc", { cmd: ["true"] }), (e) => {
        assert.ok(e instanceof MoatConnectionError);
        assert.equal(e.status, 0);
        assert.equal(e.code, "connection_error");
        return true;
      });
      assert.equal(fake.count, 1);
      assert.deepEqual(await client.environments.list(), []);
      assert.equal(fake.count, 4, "two broken GETs, then the answer");
    } finally {
      client.close();
      await fake.close();
    }
  });

  it("sends the token, the filters and the JSON body", async () => {
    let seen;
    const fake = await serve((req, res) => {
      let body = "";
      req.on("data", (c) => (body += c));
      req.on("end", () => {
        seen = { method: req.method, url: req.url, auth: req.headers.authorization, type: req.headers["content-type"], body };
        res.writeHead(200, { "Content-Type": "application/json" });
        res.end(JSON.stringify({ environments: [] }));
      });
    });
    const client = new Moat({ baseUrl: `${fake.url}/prefix/`, token: "secret" });
    try {
      await client.environments.list({ labels: { team: "a b", x: "1=2" }, task_id: "t/1", state: "gone" });
      assert.equal(seen.auth, "Bearer secret");
      assert.equal(seen.url, "/prefix/v1/environments?task_id=t%2F1&state=gone&label=team%3Da+b&label=x%3D1%3D2");
      await client.environments.setTimeout("abc", 60);
      assert.deepEqual(JSON.parse(seen.body), { ttl_s: 60 });
      assert.equal(seen.type, "application/json");
      assert.equal(seen.url, "/prefix/v1/environments/abc/timeout");
    } finally {
      client.close();
      await fake.close();
    }
  });

  it("times out on the client side", async () => {
    const fake = await serve(() => {});  // never answers
    const client = new Moat({ baseUrl: fake.url, token: "t", timeoutMs: 100, maxRetries: 0 });
    try {
      await assert.rejects(client.environments.get("abc"), MoatTimeoutError);
      // An exec waits timeout_ms plus a margin, beyond the client's default.
      const started = Date.now();
      const pending = client.environments.exec("abc", { cmd: ["x"], timeout_ms: 1 });
      const raced = await Promise.race([pending.then(() => "answered", () => "failed"), new Promise((r) => setTimeout(() => r("waiting"), 400))]);
      assert.equal(raced, "waiting", `exec gave up after ${Date.now() - started} ms`);
      const ac = new AbortController();
      const aborted = client.environments.exec("abc", { cmd: ["x"] }, { timeoutMs: 0, signal: ac.signal });
      ac.abort();
      await assert.rejects(aborted, { code: "aborted" });
      pending.catch(() => undefined);
    } finally {
      client.close();
      await fake.close();
    }
  });
});

describe("paths", () => {
  it("escapes ids and names so none acts as a dot-segment or a second segment", async () => {
    const fake = await serve((req, res) => {
      res.writeHead(404, { "Content-Type": "application/json" });
      res.end('{"error":{"code":"not_found","message":"no"}}');
    });
    const client = new Moat({ baseUrl: fake.url, token: "t", maxRetries: 0 });
    for (const id of ["..", ".", "../keys", "a/b", "x?y#z"]) await client.get(id).catch(() => undefined);
    await client.templates.get("python:3.12").catch(() => undefined);
    await client.templates.get("..").catch(() => undefined);
    assert.deepEqual(fake.requests, [
      "GET /v1/environments/%2E%2E",
      "GET /v1/environments/%2E",
      "GET /v1/environments/..%2Fkeys",
      "GET /v1/environments/a%2Fb",
      "GET /v1/environments/x%3Fy%23z",
      "GET /v1/templates/python:3.12",
      "GET /v1/templates/%2E%2E",
    ]);
    client.close();
    await fake.close();
  });
});

describe("errors", () => {
  it("maps moatd's error bodies to classes", () => {
    const e = errorFromResponse(400, '{"error":{"code":"invalid_request","message":"spec.cpus: out of range","field":"spec.cpus"}}');
    assert.equal(e.name, "InvalidRequestError");
    assert.ok(e instanceof MoatError);
    assert.equal(e.field, "spec.cpus");
    assert.equal(errorFromResponse(404, '{"error":{"code":"not_found","message":"no environment x"}}').name, "NotFoundError");
    assert.equal(errorFromResponse(429, '{"error":{"code":"capacity","message":"full"}}').name, "CapacityError");
    assert.equal(errorFromResponse(507, '{"error":{"code":"no_space","message":"/x: EDQUOT","field":"path"}}').name, "FileError");
    const denied = errorFromResponse(403, JSON.stringify({ error: {
      code: "denied_by_policy", message: "run_command denied by rule 2 of the environment's permissions", scope: "run_command",
      action: { scope: "run_command", op: "exec", argv: ["rm", "-rf", "/"] }, rule: { match: ["rm", "-rf", "*"], action: "deny" },
      approval: "a1" } }));
    assert.ok(denied instanceof DeniedByPolicyError && denied instanceof ForbiddenError);
    assert.equal(denied.name, "DeniedByPolicyError");
    assert.equal(denied.scope, "run_command");
    assert.deepEqual(denied.action.argv, ["rm", "-rf", "/"]);
    assert.deepEqual(denied.rule, { match: ["rm", "-rf", "*"], action: "deny" });
    assert.equal(denied.approval, "a1");
    const forbidden = errorFromResponse(403, '{"error":{"code":"forbidden","message":"this key lacks the \'exec\' scope"}}');
    assert.ok(forbidden instanceof ForbiddenError && !(forbidden instanceof DeniedByPolicyError));
    const plain = errorFromResponse(502, "Bad Gateway");
    assert.equal(plain.code, "http_502");
    assert.equal(plain.message, "Bad Gateway");
    assert.equal(plain.name, "MoatError");  // a proxy's 502 is not moatd's port_unreachable
  });

  it("maps the families issue 28 added: ports, moatd's own failures, 405, gone", () => {
    const unreachable = errorFromResponse(502, '{"error":{"code":"port_unreachable","message":"nothing listens on 127.0.0.1:3000"}}');
    assert.equal(unreachable.name, "PortUnreachableError");
    assert.equal(unreachable.status, 502);
    const internal = errorFromResponse(500, '{"error":{"code":"environment_failed","message":"mount: EPERM"}}');
    assert.equal(internal.name, "InternalError");
    assert.equal(internal.code, "environment_failed");
    assert.equal(errorFromResponse(500, '{"error":{"code":"internal","message":"bug"}}').name, "InternalError");
    assert.equal(errorFromResponse(405, '{"error":{"code":"method_not_allowed","message":"use GET"}}').name, "InvalidRequestError");
    const gone = errorFromResponse(409, '{"error":{"code":"gone","message":"destroyed"}}');
    assert.equal(gone.name, "ConflictError");
    assert.equal(gone.code, "gone");
    const conflict = errorFromResponse(409, '{"error":{"code":"conflict","message":"template python:3.12 exists","field":"name"}}');
    assert.equal(conflict.field, "name");
  });
});

describe("approvals without waiting (fake moatd)", () => {
  it("sends Prefer: respond-async only when asked and turns a 202 into ApprovalPendingError", async () => {
    const prefers = [];
    const approval = { id: "ap1", environment: "e1", scope: "read_file", action: { scope: "read_file", op: "read", path: "/x" },
                       requester: "master", created_at: "2025-01-01T00:00:00Z", state: "pending" };
    const fake = await serve((req, res) => {
      prefers.push(req.headers.prefer);
      req.resume();
      req.on("end", () => {
        if (req.headers.prefer === "respond-async") {
          res.writeHead(202, { "Content-Type": "application/json", Location: "/v1/approvals/ap1" });
          res.end(JSON.stringify({ approval, message: "waiting for a person's decision" }));
        } else {
          res.writeHead(200, { "Content-Type": "application/octet-stream" });
          res.end("content");
        }
      });
    });
    const client = new Moat({ baseUrl: fake.url, token: "t" });
    try {
      assert.equal((await client.environments.files.read("e1", "/x")).toString(), "content");
      await assert.rejects(client.environments.files.read("e1", "/x", { approval: "async" }), (e) => {
        assert.ok(e instanceof ApprovalPendingError);
        assert.equal(e.status, 202);
        assert.deepEqual(e.approval, approval);
        assert.equal(e.location, "/v1/approvals/ap1");
        assert.equal(e.message, "waiting for a person's decision");
        return true;
      });
      await assert.rejects(client.environments.exec("e1", { cmd: ["true"] }, { approval: "async" }), ApprovalPendingError);
      assert.deepEqual(prefers, [undefined, "respond-async", "respond-async"]);  // a 202 is not retried
    } finally {
      client.close();
      await fake.close();
    }
  });
});

describe("output stream", () => {
  it("parses NDJSON split anywhere, decodes base64 and tracks the offset", async () => {
    const lines = [
      { type: "output", stream: "stdout", offset: 0, data: "héllo\n", encoding: "utf8" },
      { type: "output", stream: "stderr", offset: 7, data: Buffer.from([0xff, 0x00]).toString("base64"), encoding: "base64" },
      { type: "dropped", offset: 9, bytes: 100 },
      { type: "heartbeat", offset: 109 },
      { type: "exit", offset: 109, state: "exited", exit_code: 0, signal: 0, timed_out: false },
    ].map((l) => JSON.stringify(l) + "\n").join("");
    const bytes = Buffer.from(lines);
    let url;
    const fake = await serve(async (req, res) => {
      url = req.url;
      res.writeHead(200, { "Content-Type": "application/x-ndjson" });
      for (let i = 0; i < bytes.length; i += 3) {  // split inside characters and lines
        res.write(bytes.subarray(i, i + 3));
        await new Promise((r) => setImmediate(r));
      }
      res.end();
    });
    const client = new Moat({ baseUrl: fake.url, token: "t" });
    try {
      const stream = client.environments.processes.output("env1", 4, { since: 0, follow: true });
      const events = [];
      for await (const event of stream) events.push(event);
      assert.equal(url, "/v1/environments/env1/processes/4/output?since=0&follow=1");
      assert.deepEqual(events.map((e) => e.type), ["output", "output", "dropped", "heartbeat", "exit"]);
      assert.equal(events[0].data.toString(), "héllo\n");
      assert.deepEqual(events[1].data, Buffer.from([0xff, 0x00]));
      assert.equal(events[1].stream, "stderr");
      assert.equal(stream.offset, 109);
      assert.equal(stream.final.exit_code, 0);
    } finally {
      client.close();
      await fake.close();
    }
  });

  it("closes the HTTP request when the loop is left", async () => {
    let closed;
    const fake = await serve((req, res) => {
      closed = new Promise((resolve) => res.on("close", resolve));
      res.writeHead(200, { "Content-Type": "application/x-ndjson" });
      let offset = 0;
      const timer = setInterval(() => {
        res.write(JSON.stringify({ type: "output", stream: "stdout", offset, data: "tick\n", encoding: "utf8" }) + "\n");
        offset += 5;
      }, 5);
      res.on("close", () => clearInterval(timer));
    });
    const client = new Moat({ baseUrl: fake.url, token: "t" });
    try {
      const stream = client.environments.processes.output("env1", 1, { follow: true });
      let n = 0;
      for await (const event of stream) {
        if (++n === 3) break;
        void event;
      }
      assert.equal(stream.offset, 15);
      const result = await Promise.race([closed.then(() => "closed"), new Promise((r) => setTimeout(() => r("still open"), 2000))]);
      assert.equal(result, "closed");

      // close() from outside ends a pending iteration quietly.
      const again = client.environments.processes.output("env1", 1, { follow: true, since: stream.offset });
      const seen = [];
      const loop = (async () => {
        for await (const event of again) seen.push(event);
      })();
      await new Promise((r) => setTimeout(r, 50));
      again.close();
      await loop;
      assert.ok(seen.length > 0);
      assert.equal(seen[0].offset, 0);  // this fake ignores `since`
    } finally {
      client.close();
      await fake.close();
    }
  });

  it("gives up on a silent follow and re-attaches after a broken one", async () => {
    const fake = await serve((req, res, n) => {
      res.writeHead(200, { "Content-Type": "application/x-ndjson" });
      if (req.url.includes("/9/")) {
        res.flushHeaders();  // the head, then silence: no line, no heartbeat
        return;
      }
      const since = Number(new URL(req.url, "http://x").searchParams.get("since"));
      if (n === 2) {
        res.write(JSON.stringify({ type: "output", stream: "stdout", offset: since, data: "ab", encoding: "utf8" }) + "\n");
        setTimeout(() => res.socket.destroy(), 20);  // broken mid-follow
      } else {
        res.end(JSON.stringify({ type: "exit", offset: since, state: "exited", exit_code: 0 }) + "\n");
      }
    });
    const client = new Moat({ baseUrl: fake.url, token: "t", retryDelayMs: 1 });
    try {
      await assert.rejects(
        (async () => {
          for await (const e of client.environments.processes.output("env1", 9, { follow: true, idleTimeoutMs: 100 })) void e;
        })(),
        MoatTimeoutError,
      );
      const stream = client.environments.processes.output("env1", 1, { follow: true, since: 5 });
      const events = [];
      for await (const e of stream) events.push(e);
      assert.deepEqual(events.map((e) => `${e.type}@${e.offset}`), ["output@5", "exit@7"]);
      assert.ok(fake.requests.at(-1).includes("since=7"), fake.requests.join(", "));
    } finally {
      client.close();
      await fake.close();
    }
  });

  it("parses single events", () => {
    const e = parseOutputEvent('{"type":"end","offset":3,"state":"lost","reason":"the environment was destroyed"}');
    assert.equal(e.type, "end");
    assert.equal(e.reason, "the environment was destroyed");
  });
});

// A fake shell endpoint speaking moatd's framing: binary frames are terminal
// bytes, text frames JSON control messages.
async function fakeShell({ badAccept = false } = {}) {
  const server = http.createServer((req, res) => {
    res.writeHead(426, { "Content-Type": "application/json" });
    res.end(JSON.stringify({ error: { code: "upgrade_required", message: "WebSocket only" } }));
  });
  const seen = { frames: [], pongs: 0, url: "", auth: "" };
  server.on("upgrade", (req, socket) => {
    seen.url = req.url;
    seen.auth = req.headers.authorization;
    const key = req.headers["sec-websocket-key"];
    assert.equal(req.headers["sec-websocket-version"], "13");
    assert.equal(Buffer.from(key, "base64").length, 16);
    const accept = badAccept ? "nope" : createHash("sha1").update(key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest("base64");
    socket.write(`HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ${accept}\r\n\r\n`);
    const parser = new FrameParser(true);  // client frames must be masked
    let rows = 24;
    let cols = 80;
    const send = (opcode, data, fin = true) => socket.write(encodeFrame(opcode, Buffer.from(data), false, fin));
    // A fragmented first message and a ping before anything else.
    send(0x2, "wel", false);
    send(0x9, "are you there");
    send(0x0, "come\r\n", true);
    socket.on("data", (chunk) => {
      for (const frame of parser.push(chunk)) {
        seen.frames.push(frame);
        if (frame.opcode === 0xa) seen.pongs += 1;
        if (frame.opcode === 0x1) {
          const msg = JSON.parse(frame.payload.toString());
          if (msg.type === "resize") [rows, cols] = [msg.rows, msg.cols];
          else send(0x1, JSON.stringify({ type: "error", message: `unknown control message type "${msg.type}"` }));
        }
        if (frame.opcode === 0x2) {
          const line = frame.payload.toString();
          send(0x2, line.replace(/\n/g, "\r\n"));  // the terminal echoes
          if (line === "stty size\n") send(0x2, `${rows} ${cols}\r\n`);
          if (line === "exit\n") {
            send(0x1, JSON.stringify({ type: "exit", offset: 42, state: "exited", exit_code: 0, signal: 0, timed_out: false }));
            socket.write(encodeFrame(0x8, Buffer.concat([Buffer.from([0x03, 0xe8]), Buffer.from("the process ended")]), false));
          }
        }
        if (frame.opcode === 0x8) socket.end();
      }
    });
    socket.on("error", () => undefined);
    socket.on("end", () => socket.end());
  });
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  return {
    seen,
    url: `http://127.0.0.1:${server.address().port}`,
    close: () => new Promise((resolve) => {
      server.closeAllConnections();
      server.close(() => resolve());
    }),
  };
}

describe("websocket shell (fake moatd)", () => {
  it("computes Sec-WebSocket-Accept as RFC 6455 says", () => {
    assert.equal(acceptKey("dGhlIHNhbXBsZSBub25jZQ=="), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
  });

  it("encodes and parses frames of every length class", () => {
    for (const n of [0, 125, 126, 65535, 65536, 200_000]) {
      const payload = Buffer.alloc(n, 7);
      const frames = new FrameParser(true).push(encodeFrame(0x2, payload, true));
      assert.equal(frames.length, 1);
      assert.deepEqual(frames[0].payload, payload);
      const masked = encodeFrame(0x2, payload, true);
      assert.equal(masked[1] & 0x80, 0x80);
    }
    assert.throws(() => new FrameParser(false).push(encodeFrame(0x2, Buffer.from("x"), true)), /must not be masked/);
  });

  it("runs a session: fragments, ping, resize, signal, exit and close", async () => {
    const fake = await fakeShell();
    const client = new Moat({ baseUrl: fake.url, token: "tok" });
    try {
      const shell = await client.environments.shell("env1", { rows: 30, cols: 100 });
      assert.equal(fake.seen.url, "/v1/environments/env1/shell?rows=30&cols=100");
      assert.equal(fake.seen.auth, "Bearer tok");
      await shell.resize(40, 120);
      await shell.signal("INT");
      await shell.write("stty size\n");
      let output = "";
      let sent = false;
      for await (const chunk of shell) {
        output += chunk.toString();
        if (!sent && output.includes("40 120")) {
          sent = true;
          await shell.write(Buffer.from("exit\n"));
        }
      }
      assert.ok(output.startsWith("welcome\r\n"), JSON.stringify(output));
      assert.match(output, /40 120\r\n/);
      const exited = await shell.exited;
      assert.equal(exited.type, "exit");
      assert.equal(exited.exit_code, 0);
      assert.equal(fake.seen.pongs, 1);
      assert.deepEqual(shell.errors, ['unknown control message type "signal"']);
      assert.ok(fake.seen.frames.every((f) => f.opcode !== undefined));  // all parsed as masked
      const close = fake.seen.frames.find((f) => f.opcode === 0x8);
      assert.equal(close.payload.readUInt16BE(0), 1000);
      assert.equal(shell.open, false);
      await assert.rejects(shell.write("late"), MoatConnectionError);
    } finally {
      client.close();
      await fake.close();
    }
  });

  it("resolves `exited` with an end event when the client closes", async () => {
    const fake = await fakeShell();
    const client = new Moat({ baseUrl: fake.url, token: "tok" });
    try {
      const shell = await client.environments.shell("env1");
      const chunks = [];
      shell.on("data", (c) => chunks.push(c));
      await once(shell, "data");
      await shell.close();
      const exited = await shell.exited;
      assert.equal(exited.type, "end");
      assert.match(exited.reason, /closed/);
    } finally {
      client.close();
      await fake.close();
    }
  });

  it("rejects a bad handshake and a plain HTTP answer", async () => {
    const bad = await fakeShell({ badAccept: true });
    const client = new Moat({ baseUrl: bad.url, token: "tok" });
    try {
      await assert.rejects(client.environments.shell("env1"), { code: "bad_handshake" });
    } finally {
      client.close();
      await bad.close();
    }
    const plain = await serve((req, res) => {
      res.writeHead(404, { "Content-Type": "application/json" });
      res.end(JSON.stringify({ error: { code: "not_found", message: "no environment env1" } }));
    });
    const c2 = new Moat({ baseUrl: plain.url, token: "tok" });
    try {
      await assert.rejects(c2.environments.shell("env1"), { name: "NotFoundError", status: 404 });
    } finally {
      c2.close();
      await plain.close();
    }
  });
});
