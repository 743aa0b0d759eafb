// moat's MCP server over stdio: `moat mcp` (the official SDK's
// StdioClientTransport spawns it) driving a moatd started here.

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import { toolBehaviours } from "./behaviours.mjs";
import { LATEST, connectStdio, skipReason, spawnRawStdio, startMoatd } from "./harness.mjs";

describe("MCP over stdio (moat mcp)", { skip: skipReason, timeout: 240_000 }, () => {
  let moatd;
  const ctx = { kind: "stdio" };
  ctx.rest = async () => moatd.rest;
  ctx.fresh = () => connectStdio({ state: moatd.state });

  before(async () => {
    moatd = await startMoatd();
    ctx.conn = await connectStdio({ state: moatd.state });
  });

  after(async () => {
    await shared.cleanup().catch(() => {});
    await ctx.conn?.close().catch(() => {});
    await moatd?.stop();
  });

  const shared = toolBehaviours(ctx);

  it("initialize answers with the client's protocol version when supported, else the latest", { timeout: 30_000 }, async () => {
    for (const [asked, answered] of [
      ["2025-11-25", "2025-11-25"],
      ["2025-06-18", "2025-06-18"],
      ["2025-03-26", "2025-03-26"],
      ["2024-11-05", "2024-11-05"],
      ["1999-01-01", LATEST],
    ]) {
      const raw = spawnRawStdio({ state: moatd.state });
      try {
        raw.send({
          jsonrpc: "2.0",
          id: 1,
          method: "initialize",
          params: { protocolVersion: asked, capabilities: {}, clientInfo: { name: "raw", version: "0" } },
        });
        const m = await raw.next((m) => m.id === 1);
        assert.equal(m.result?.protocolVersion, answered, `asked ${asked}: ${JSON.stringify(m)}`);
      } finally {
        await raw.close();
      }
    }
  });

  it("a malformed line is a JSON-RPC parse error; the server keeps serving; stdout is only JSON-RPC", { timeout: 30_000 }, async () => {
    const raw = spawnRawStdio({ state: moatd.state });
    try {
      raw.send({ jsonrpc: "2.0", id: 1, method: "initialize", params: { protocolVersion: LATEST, capabilities: {}, clientInfo: { name: "raw", version: "0" } } });
      await raw.next((m) => m.id === 1);
      raw.send({ jsonrpc: "2.0", method: "notifications/initialized" });
      raw.send("{this is not json\n");
      const err = await raw.next((m) => m.error);
      assert.equal(err.error.code, -32700, JSON.stringify(err));
      assert.equal(err.id, null);
      raw.send({ jsonrpc: "2.0", id: 2, method: "ping" });
      assert.deepEqual((await raw.next((m) => m.id === 2)).result, {});
      // valid JSON that is not a JSON-RPC request: an Invalid Request error
      raw.send({ jsonrpc: "2.0", id: 3, params: {} });
      const inv = await raw.next((m) => m.id === 3);
      assert.equal(inv.error?.code, -32600, JSON.stringify(inv));
      raw.send({ jsonrpc: "2.0", id: 4, method: "tools/list" });
      assert.ok((await raw.next((m) => m.id === 4)).result?.tools?.length > 0);
      assert.deepEqual(raw.badLines, [], "every line on stdout is JSON");
      for (const m of raw.messages) assert.equal(m.jsonrpc, "2.0");
    } finally {
      await raw.close();
    }
  });

  it("moat mcp exits (status 0) when its stdin closes", { timeout: 30_000 }, async () => {
    const raw = spawnRawStdio({ state: moatd.state });
    raw.send({ jsonrpc: "2.0", id: 1, method: "initialize", params: { protocolVersion: LATEST, capabilities: {}, clientInfo: { name: "raw", version: "0" } } });
    await raw.next((m) => m.id === 1);
    const t0 = Date.now();
    const { code, signal } = await raw.close();
    assert.equal(signal, null, "it was not killed");
    assert.equal(code, 0);
    assert.ok(Date.now() - t0 < 10_000);
  });
});
