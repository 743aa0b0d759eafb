// moat's MCP server over stdio: `moat mcp` (the official SDK's
// StdioClientTransport spawns it) driving a moatd started here.

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { chmodSync, copyFileSync, mkdirSync, readFileSync, rmSync } from "node:fs";
import { after, before, describe, it } from "node:test";

import { toolBehaviours } from "./behaviours.mjs";
import { LATEST, PATH, connectStdio, moatBin, restClient, skipReason, spawnRawStdio, startMoatd } from "./harness.mjs";

// The way desktop clients run MCP servers: as a normal user, here a member
// of the group moatd's --socket-group names, with a key of their own that
// root wrote with `moat keys create --for-user` (docs/INSTALL.md).
describe("moat mcp as a normal user with a key of their own", { skip: skipReason, timeout: 120_000 }, () => {
  const tag = process.pid;
  const group = `moatmg${tag}`;
  const user = `moatmu${tag}`;
  const home = `/tmp/${user}-home`;
  const binDir = `/tmp/moat-mcp-bin-${tag}`;
  let moatd;
  const run = (argv, opts = {}) => spawnSync(argv[0], argv.slice(1), { encoding: "utf8", ...opts });

  before(async () => {
    assert.equal(run(["/usr/sbin/groupadd", group]).status, 0);
    assert.equal(run(["/usr/sbin/useradd", "-M", "-d", home, "-s", "/bin/sh", "-G", group, user]).status, 0);
    mkdirSync(home, { mode: 0o700 });
    assert.equal(run(["/bin/chown", `${user}:`, home]).status, 0);
    // The moat binary where any user may run it (the build tree may not be).
    mkdirSync(binDir, { mode: 0o755 });
    copyFileSync(moatBin, `${binDir}/moat`);
    chmodSync(`${binDir}/moat`, 0o755);
    moatd = await startMoatd(["--socket-group", group]);
    const made = run([moatBin, "keys", "create", "--for-user", user, "--scope", "create", "--scope", "exec",
                      "--scope", "read", "--scope", "files", "--scope", "destroy"],
                     { env: { PATH, MOAT_STATE: moatd.state } });
    assert.equal(made.status, 0, made.stderr);
  });

  after(async () => {
    await moatd?.stop();
    run(["/usr/sbin/userdel", user]);
    run(["/usr/sbin/groupdel", group]);
    rmSync(home, { recursive: true, force: true });
    rmSync(binDir, { recursive: true, force: true });
  });

  it("finds moatd's socket and the key by itself, and its tools act as that key", { timeout: 60_000 }, async () => {
    const conn = await connectStdio({ state: moatd.state, asUser: user, bin: `${binDir}/moat` });
    try {
      const ran = await conn.client.callTool({ name: "run_command", arguments: { command: "echo from a member" } });
      assert.ok(!ran.isError, JSON.stringify(ran));
      assert.equal(ran.structuredContent?.stdout, "from a member\n", JSON.stringify(ran));
      // The environment is the key's: the key (from the user's file) sees
      // it among its own.
      const token = readFileSync(`${home}/.config/moat/token`, "utf8").trim();
      const asKey = restClient({ socketPath: moatd.socketPath, token });
      assert.equal((await asKey.runningIds()).size, 1);
    } finally {
      await conn.close();
    }
  });
});

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
