// Pause and resume (docs/PAUSE.md): env.pause()/resume() and
// moat.environments.pause/resume(id) against a real moatd (started here;
// needs root, like moatd).

import assert from "node:assert/strict";
import { setTimeout as sleep } from "node:timers/promises";
import { after, before, describe, it } from "node:test";

import { ConflictError, Environment, Moat } from "../dist/index.js";
import { startMoatd } from "./moatd.mjs";

const root = process.getuid?.() === 0;
const skip = root ? false : "needs root (moatd creates namespaces, cgroups and mounts)";

/** Polls `check` until it answers something true (returned); fails after `timeoutMs`. */
async function waitUntil(check, what, timeoutMs = 10_000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (Date.now() >= deadline) throw new Error(`${what} did not happen within ${timeoutMs} ms`);
    await sleep(50);
  }
}

describe("pause and resume, against a real moatd", { skip }, () => {
  let moatd;
  let moat;

  before(async () => {
    moatd = await startMoatd();
    moat = new Moat({ baseUrl: moatd.baseUrl, token: moatd.token });
  });

  after(async () => {
    moat?.close();
    await moatd?.stop();
  });

  it("a paused environment's processes stop where they are, and go on after the resume", async () => {
    const env = await moat.create({ task_id: "pause", spec: { ram_mb: 256 }, ttl_s: 600 });
    try {
      assert.equal(env.ttl_while_paused, "stops");  // the default
      assert.equal(env.on_expiry, "destroy");  // the default
      assert.equal(env.paused_at, undefined);
      await env.start(["sh", "-c", "i=0; while :; do i=$((i+1)); echo $i > /workspace/n.tmp; mv /workspace/n.tmp /workspace/n; done"]);
      // The counter's value now (NaN while the file is being rewritten).
      const counter = async () => Number.parseInt(await env.files.readText("/workspace/n").catch(() => ""), 10);
      await waitUntil(async () => (await counter()) > 0, "the counter to start");

      const info = await env.pause();
      assert.equal(info.state, "paused");
      assert.equal(env.state, "paused");
      assert.ok(!Number.isNaN(Date.parse(env.paused_at)), `paused_at: ${env.paused_at}`);
      assert.deepEqual(env.info, info);
      assert.equal((await env.refresh()).state, "paused");

      // Commands are refused with a ConflictError (409 conflict) while paused.
      await assert.rejects(env.exec({ cmd: ["true"] }), (e) => {
        assert.ok(e instanceof ConflictError);
        assert.equal(e.status, 409);
        assert.equal(e.code, "conflict");
        assert.match(e.message, /paused/);
        return true;
      });

      // File reads still answer, and the counter stands still.
      const first = await env.files.readText("/workspace/n");
      await sleep(300);
      assert.equal(await env.files.readText("/workspace/n"), first);

      // Pausing a paused one is no error (the calls by id answer plain records).
      const again = await moat.environments.pause(env.id);
      assert.ok(!(again instanceof Environment));
      assert.equal(again.state, "paused");
      assert.equal(again.paused_at, env.paused_at);

      const stopped = Number.parseInt(first, 10);
      const resumed = await env.resume();
      assert.equal(resumed.state, "running");
      assert.equal(env.state, "running");
      assert.equal(env.paused_at, undefined);
      assert.ok(Date.parse(env.expires_at) >= Date.parse(again.expires_at));
      await waitUntil(async () => {
        const n = await counter();
        return Number.isNaN(stopped) ? n > 0 : n > stopped;
      }, "the counter to move again");
      assert.equal((await env.run("echo running")).stdout, "running\n");
      assert.equal((await moat.environments.resume(env.id)).state, "running");  // resuming a running one: no error
    } finally {
      await env.destroy();
    }
  });

  it("ttl_while_paused: runs is kept, and a paused environment can be destroyed", async () => {
    const env = await moat.create({ ttl_s: 600, ttl_while_paused: "runs" });
    assert.equal(env.ttl_while_paused, "runs");
    // A pause at expiry needs the time stopped while paused: refused by name.
    await assert.rejects(moat.create({ ttl_while_paused: "runs", on_expiry: "pause" }), /on_expiry/);
    const kept = await moat.create({ ttl_s: 600, on_expiry: "pause" });
    assert.equal(kept.on_expiry, "pause");
    await kept.destroy();
    const paused = await moat.environments.pause(env.id);
    assert.equal(paused.state, "paused");
    assert.equal(paused.ttl_while_paused, "runs");
    assert.ok(paused.paused_at);
    await env.destroy();
    assert.equal((await moat.environments.get(env.id)).state, "gone");
  });
});
