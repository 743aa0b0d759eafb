// moat's MCP server over Streamable HTTP: moatd's POST /mcp, with the official
// SDK's StreamableHTTPClientTransport and with raw requests for what the SDK
// will not send (foreign Origin/Host, no or unknown session, bad JSON).

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import { toolBehaviours } from "./behaviours.mjs";
import { LATEST, connectHttp, environmentOf, httpRequest, skipReason, startMoatd, text } from "./harness.mjs";

const INIT = (version = LATEST, id = 1) => ({
  jsonrpc: "2.0",
  id,
  method: "initialize",
  params: { protocolVersion: version, capabilities: {}, clientInfo: { name: "raw", version: "0" } },
});

// The JSON-RPC messages of an answer: application/json or text/event-stream.
function messagesOf(r) {
  const type = r.headers["content-type"] ?? "";
  if (type.startsWith("application/json")) return [JSON.parse(r.text)].flat();
  if (type.startsWith("text/event-stream")) {
    const out = [];
    for (const event of r.text.split(/\r?\n\r?\n/)) {
      const data = event
        .split(/\r?\n/)
        .filter((l) => l.startsWith("data:"))
        .map((l) => l.slice(5).replace(/^ /, ""))
        .join("\n");
      if (data) out.push(JSON.parse(data));
    }
    return out;
  }
  throw new Error(`unexpected answer ${r.status} ${type}: ${r.text}`);
}

describe("MCP over Streamable HTTP (moatd POST /mcp)", { skip: skipReason, timeout: 240_000 }, () => {
  let moatd;
  const ctx = { kind: "http" };
  ctx.rest = async () => moatd.rest;
  ctx.fresh = () => connectHttp({ mcpUrl: moatd.mcpUrl, token: moatd.token });

  // A raw request to /mcp over TCP.
  function mcp({ method = "POST", body, session, token = moatd.token, headers = {} } = {}) {
    const h = { Accept: "application/json, text/event-stream", ...headers };
    if (token !== null) h.Authorization = `Bearer ${token}`;
    if (body !== undefined) h["Content-Type"] = "application/json";
    if (session) {
      h["Mcp-Session-Id"] = session;
      h["MCP-Protocol-Version"] ??= LATEST;
    }
    return httpRequest({
      port: moatd.port,
      method,
      path: "/mcp",
      headers: h,
      body: body === undefined ? undefined : typeof body === "string" ? body : JSON.stringify(body),
    });
  }
  // A new session (raw): its id.
  async function rawSession(token = moatd.token) {
    const r = await mcp({ body: INIT(), token });
    assert.equal(r.status, 200, r.text);
    const session = r.headers["mcp-session-id"];
    assert.ok(session, `initialize carries Mcp-Session-Id: ${JSON.stringify(r.headers)}`);
    const n = await mcp({ body: { jsonrpc: "2.0", method: "notifications/initialized" }, session, token });
    assert.equal(n.status, 202, n.text);
    return session;
  }

  before(async () => {
    moatd = await startMoatd();
    ctx.conn = await connectHttp({ mcpUrl: moatd.mcpUrl, token: moatd.token });
  });

  after(async () => {
    await shared.cleanup().catch(() => {});
    await ctx.conn?.close().catch(() => {});
    await moatd?.stop();
  });

  const shared = toolBehaviours(ctx);

  it("initialize answers with the client's protocol version when supported, else the latest, with a session id", { timeout: 30_000 }, async () => {
    const ids = new Set();
    for (const [asked, answered] of [
      ["2025-11-25", "2025-11-25"],
      ["2025-06-18", "2025-06-18"],
      ["2025-03-26", "2025-03-26"],
      ["2024-11-05", "2024-11-05"],
      ["1999-01-01", LATEST],
    ]) {
      const r = await mcp({ body: INIT(asked) });
      assert.equal(r.status, 200, r.text);
      assert.match(r.headers["content-type"], /^application\/json/);
      const [m] = messagesOf(r);
      assert.equal(m.id, 1);
      assert.equal(m.result?.protocolVersion, answered, `asked ${asked}: ${r.text}`);
      const session = r.headers["mcp-session-id"];
      assert.match(session ?? "", /^[\x21-\x7e]+$/, "a visible-ASCII Mcp-Session-Id");
      ids.add(session);
      await mcp({ method: "DELETE", session });
    }
    assert.equal(ids.size, 5, "each initialize opens its own session");
    assert.ok(ctx.conn.transport.sessionId, "the SDK client holds a session id");
  });

  it("notifications and responses are accepted with 202", { timeout: 30_000 }, async () => {
    const session = await rawSession();
    const n = await mcp({ body: { jsonrpc: "2.0", method: "notifications/cancelled", params: { requestId: 99 } }, session });
    assert.equal(n.status, 202, n.text);
    assert.equal(n.text, "");
    const resp = await mcp({ body: { jsonrpc: "2.0", id: "from-client", result: {} }, session });
    assert.equal(resp.status, 202, resp.text);
    await mcp({ method: "DELETE", session });
  });

  it("a tools/call with a progressToken is answered as an event stream, everything else as JSON", { timeout: 30_000 }, async () => {
    const session = await rawSession();
    const plain = await mcp({ body: { jsonrpc: "2.0", id: 2, method: "tools/list" }, session });
    assert.equal(plain.status, 200, plain.text);
    assert.match(plain.headers["content-type"], /^application\/json/);
    assert.ok(messagesOf(plain)[0].result.tools.length > 0);

    const env = await ctx.conn.client.callTool({ name: "create_environment", arguments: {} });
    const id = environmentOf(env.structuredContent).id;
    const streamed = await mcp({
      body: {
        jsonrpc: "2.0",
        id: 3,
        method: "tools/call",
        params: { name: "run_command", arguments: { environment_id: id, command: "sleep 2.5; echo streamed" }, _meta: { progressToken: "tok-1" } },
      },
      session,
    });
    assert.equal(streamed.status, 200, streamed.text);
    assert.match(streamed.headers["content-type"], /^text\/event-stream/);
    const msgs = messagesOf(streamed);
    const last = msgs.at(-1);
    assert.equal(last.id, 3, `the response comes last: ${streamed.text}`);
    assert.equal(last.result.structuredContent.stdout, "streamed\n");
    const progress = msgs.filter((m) => m.method === "notifications/progress");
    assert.ok(progress.length >= 1, `progress notifications first: ${streamed.text}`);
    for (const p of progress) assert.equal(p.params.progressToken, "tok-1");

    const quick = await mcp({
      body: { jsonrpc: "2.0", id: 4, method: "tools/call", params: { name: "run_command", arguments: { environment_id: id, command: "echo quick" } } },
      session,
    });
    assert.match(quick.headers["content-type"], /^application\/json/);
    assert.equal(messagesOf(quick)[0].result.structuredContent.stdout, "quick\n");
    await ctx.conn.client.callTool({ name: "destroy_environment", arguments: { environment_id: id } });
    await mcp({ method: "DELETE", session });
  });

  it("GET /mcp is 405 (the server sends nothing unasked)", { timeout: 30_000 }, async () => {
    const session = await rawSession();
    const r = await mcp({ method: "GET", session, headers: { Accept: "text/event-stream" } });
    assert.equal(r.status, 405, r.text);
    await mcp({ method: "DELETE", session });
  });

  it("a request with a foreign Origin is refused with 403, before anything else", { timeout: 30_000 }, async () => {
    for (const origin of ["http://evil.example", "https://evil.example", "http://localhost.evil.example", "null"]) {
      const r = await mcp({ body: INIT(), headers: { Origin: origin } });
      assert.equal(r.status, 403, `Origin ${origin}: ${r.status} ${r.text}`);
      assert.equal(r.headers["mcp-session-id"], undefined);
    }
    // before authentication: no token, foreign Origin → 403, not 401
    assert.equal((await mcp({ body: INIT(), token: null, headers: { Origin: "http://evil.example" } })).status, 403);
    // local origins are fine
    for (const origin of [`http://localhost:${moatd.port}`, "http://127.0.0.1:3000", "https://localhost", "http://[::1]:8080"]) {
      const r = await mcp({ body: INIT(), headers: { Origin: origin } });
      assert.equal(r.status, 200, `Origin ${origin}: ${r.status} ${r.text}`);
      await mcp({ method: "DELETE", session: r.headers["mcp-session-id"] });
    }
  });

  it("a request with a foreign Host is refused with 403, before anything else", { timeout: 30_000 }, async () => {
    for (const host of ["evil.example:80", "evil.example", `evil.example:${moatd.port}`, "127.0.0.1.evil.example"]) {
      const r = await mcp({ body: INIT(), headers: { Host: host } });
      assert.equal(r.status, 403, `Host ${host}: ${r.status} ${r.text}`);
    }
    assert.equal((await mcp({ body: INIT(), token: null, headers: { Host: "evil.example:80" } })).status, 403);
    for (const host of [`localhost:${moatd.port}`, "localhost", `127.0.0.1:${moatd.port}`, "[::1]:9"]) {
      const r = await mcp({ body: INIT(), headers: { Host: host } });
      assert.equal(r.status, 200, `Host ${host}: ${r.status} ${r.text}`);
      await mcp({ method: "DELETE", session: r.headers["mcp-session-id"] });
    }
  });

  it("a wrong or missing bearer token is 401", { timeout: 30_000 }, async () => {
    const wrong = await mcp({ body: INIT(), token: "0".repeat(64) });
    assert.equal(wrong.status, 401, wrong.text);
    assert.equal((await mcp({ body: INIT(), token: null })).status, 401);
    // and for an open session too
    const session = await rawSession();
    assert.equal((await mcp({ body: { jsonrpc: "2.0", id: 2, method: "ping" }, session, token: "moat_000000000000_" + "0".repeat(64) })).status, 401);
    await mcp({ method: "DELETE", session });
  });

  it("a request without Mcp-Session-Id is 400; an unknown one is 404", { timeout: 30_000 }, async () => {
    const none = await mcp({ body: { jsonrpc: "2.0", id: 2, method: "tools/list" } });
    assert.equal(none.status, 400, none.text);
    const unknown = await mcp({ body: { jsonrpc: "2.0", id: 2, method: "tools/list" }, session: "no-such-session-0123456789" });
    assert.equal(unknown.status, 404, unknown.text);
  });

  it("DELETE /mcp ends the session: later requests with its id are 404", { timeout: 30_000 }, async () => {
    const session = await rawSession();
    assert.equal((await mcp({ body: { jsonrpc: "2.0", id: 2, method: "ping" }, session })).status, 200);
    const del = await mcp({ method: "DELETE", session });
    assert.ok(del.status >= 200 && del.status < 300, `DELETE: ${del.status} ${del.text}`);
    assert.equal((await mcp({ body: { jsonrpc: "2.0", id: 3, method: "ping" }, session })).status, 404);
  });

  it("a session opened with one token is 404 with another; a key may do over MCP what it may over REST", { timeout: 30_000 }, async () => {
    const key = await moatd.rest.call("POST", "/v1/keys", { name: "mcp-reader", scopes: ["read"] });
    assert.equal(key.status, 201, key.text);
    const keySession = await rawSession(key.json.token);
    // the master token cannot use the key's session, nor the key the master's
    assert.equal((await mcp({ body: { jsonrpc: "2.0", id: 2, method: "ping" }, session: keySession })).status, 404);
    const masterSession = ctx.conn.transport.sessionId;
    assert.equal((await mcp({ body: { jsonrpc: "2.0", id: 2, method: "ping" }, session: masterSession, token: key.json.token })).status, 404);

    // a key without the create scope: create_environment is a tool error
    const r = await mcp({
      body: { jsonrpc: "2.0", id: 3, method: "tools/call", params: { name: "create_environment", arguments: {} } },
      session: keySession,
      token: key.json.token,
    });
    assert.equal(r.status, 200, r.text);
    const [m] = messagesOf(r);
    assert.equal(m.result?.isError, true, r.text);
    assert.match(text(m.result), /create/, r.text);
    // and it sees only its own environments (none): not the master's
    const masterEnv = await ctx.conn.client.callTool({ name: "create_environment", arguments: {} });
    const list = await mcp({
      body: { jsonrpc: "2.0", id: 4, method: "tools/call", params: { name: "list_environments", arguments: {} } },
      session: keySession,
      token: key.json.token,
    });
    const [lm] = messagesOf(list);
    assert.ok(!lm.result?.isError, list.text);
    assert.ok(!JSON.stringify(lm.result).includes(environmentOf(masterEnv.structuredContent).id), `a key sees only its own environments: ${list.text}`);
    const res = await mcp({
      body: { jsonrpc: "2.0", id: 5, method: "tools/call", params: { name: "run_command", arguments: { environment_id: environmentOf(masterEnv.structuredContent).id, command: "true" } } },
      session: keySession,
      token: key.json.token,
    });
    assert.equal(messagesOf(res)[0].result?.isError, true, res.text);
    await ctx.conn.client.callTool({ name: "destroy_environment", arguments: { environment_id: environmentOf(masterEnv.structuredContent).id } });
    await mcp({ method: "DELETE", session: keySession, token: key.json.token });
  });

  it("one key cannot take every session: at most 16 each, and others still open theirs", { timeout: 60_000 }, async () => {
    const key = await moatd.rest.call("POST", "/v1/keys", { name: "mcp-hog", scopes: ["read"] });
    assert.equal(key.status, 201, key.text);
    const opened = [];
    for (let i = 0; i < 16; i++) opened.push(await rawSession(key.json.token));
    const refused = await mcp({ body: INIT(), token: key.json.token });
    assert.equal(refused.status, 429, refused.text);
    assert.match(refused.text, /16 per key/);
    const other = await moatd.rest.call("POST", "/v1/keys", { name: "mcp-other", scopes: ["read"] });
    const theirs = await rawSession(other.json.token);
    const mine = await rawSession();  // the master's
    for (const [session, token] of [[theirs, other.json.token], [mine, moatd.token]]) {
      await mcp({ method: "DELETE", session, token });
    }
    await mcp({ method: "DELETE", session: opened[0], token: key.json.token });
    const again = await mcp({ body: INIT(), token: key.json.token });
    assert.equal(again.status, 200, "one ended, one more may open");
    opened.push(again.headers["mcp-session-id"]);
    for (const session of opened.slice(1)) await mcp({ method: "DELETE", session, token: key.json.token });
  });

  it("a malformed JSON body is a JSON-RPC parse error, and the server keeps serving", { timeout: 30_000 }, async () => {
    const session = await rawSession();
    const bad = await mcp({ body: "{this is not json", session });
    assert.ok(bad.status === 200 || bad.status === 400, `${bad.status} ${bad.text}`);
    const [err] = messagesOf(bad);
    assert.equal(err.jsonrpc, "2.0");
    assert.equal(err.id, null);
    assert.equal(err.error?.code, -32700, bad.text);
    // the session and the server go on
    const ok = await mcp({ body: { jsonrpc: "2.0", id: 2, method: "ping" }, session });
    assert.equal(ok.status, 200, ok.text);
    assert.deepEqual(messagesOf(ok)[0].result, {});
    assert.deepEqual(await ctx.conn.client.ping(), {});
    await mcp({ method: "DELETE", session });
  });
});
