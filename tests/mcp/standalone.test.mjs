// moat's MCP server over stdio with no moatd running: `moat mcp --standalone`
// starts a private moatd on a temporary state directory and stops it, with
// every environment, when the session ends (docs/MCP.md).

import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";

import { toolBehaviours } from "./behaviours.mjs";
import { alive, connectStdio, mountedUnder, privateMoatd, removeState, restClient, skipReason, waitFor } from "./harness.mjs";

describe("MCP over stdio (moat mcp --standalone)", { skip: skipReason, timeout: 240_000 }, () => {
  const ctx = { kind: "standalone" };
  let priv; // {pid, state} of the private moatd
  let rest;
  ctx.rest = async () => {
    if (rest) return rest;
    priv ??= await waitFor(() => privateMoatd(ctx.conn.pid), 10_000);
    assert.ok(priv?.state, "moat mcp --standalone runs a moatd with a state directory");
    const socketPath = join(priv.state, "moatd.sock");
    assert.ok(await waitFor(() => existsSync(join(priv.state, "master-token")) && existsSync(socketPath), 10_000));
    rest = restClient({ socketPath, token: readFileSync(join(priv.state, "master-token"), "utf8").trim() });
    return rest;
  };

  before(async () => {
    ctx.conn = await connectStdio({ standalone: true });
  });

  after(async () => {
    await ctx.conn?.close().catch(() => {});
    // whatever the session left behind
    if (priv) {
      if (alive(priv.pid)) process.kill(priv.pid, "SIGKILL");
      if (priv.state?.startsWith("/") && priv.state !== "/" && existsSync(priv.state)) removeState(priv.state);
    }
  });

  toolBehaviours(ctx);

  it("ending the session stops the private moatd and its environments, and removes its state directory", { timeout: 30_000 }, async () => {
    await ctx.rest();
    const { pid, state } = priv;
    const r = await rest.call("GET", "/v1/environments");
    const running = r.json.environments.filter((e) => e.state === "running");
    assert.ok(running.length >= 1, "the session has environments (its default one at least)");
    const mcpPid = ctx.conn.pid;
    await ctx.conn.close();
    ctx.conn = undefined;
    assert.ok(!alive(mcpPid), "moat mcp exited");
    assert.ok(await waitFor(() => !alive(pid), 15_000), "the private moatd stopped");
    assert.deepEqual(mountedUnder(state), [], "nothing stays mounted under the temporary state directory");
    assert.ok(!existsSync(state), `the temporary state directory ${state} is removed`);
  });
});
