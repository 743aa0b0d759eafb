// Snapshots, restores and forks through the SDK, against a real moatd
// (needs root, like moatd).

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import { DeniedByPolicyError, InvalidRequestError, Moat, NotFoundError } from "../dist/index.js";
import { startMoatd } from "./moatd.mjs";

const root = process.getuid?.() === 0;
const skip = root ? false : "needs root (moatd creates namespaces, cgroups and mounts)";

describe("snapshots, against a real moatd", { skip }, () => {
  let moatd;
  let client;

  before(async () => {
    moatd = await startMoatd();
    client = new Moat({ baseUrl: moatd.baseUrl, token: moatd.token });
  });

  after(async () => {
    client?.close();
    await moatd?.stop();
  });

  const sh = async (id, script) => (await client.environments.exec(id, { cmd: ["sh", "-c", script] })).stdout;

  it("snapshot, change, restore: the files come back; a fork copies them", async () => {
    const env = await client.environments.create({ labels: { sdk: "snapshots" } });
    await client.environments.files.write(env.id, "/workspace/f", "one\n");
    const snap = await client.snapshots.create(env.id, { name: "one" });
    assert.match(snap.id, /^snap-[0-9a-f]{12}$/);
    assert.equal(snap.environment_id, env.id);
    assert.equal(snap.name, "one");
    await client.environments.files.write(env.id, "/workspace/f", "two\n");
    const restored = await client.snapshots.restore(env.id, snap.id);
    assert.equal(restored.id, env.id);
    assert.equal(await sh(env.id, "cat /workspace/f"), "one\n");

    const fork = await client.snapshots.fork(env.id, { task_id: "branch" });
    assert.notEqual(fork.id, env.id);
    assert.equal(fork.task_id, "branch");
    assert.deepEqual(fork.labels, { sdk: "snapshots" });
    assert.equal(await sh(fork.id, "cat /workspace/f"), "one\n");

    const fromSnap = await client.environments.create({ snapshot: snap.id });
    assert.equal(await sh(fromSnap.id, "cat /workspace/f"), "one\n");

    assert.deepEqual((await client.snapshots.list({ environment_id: env.id })).map((s) => s.id), [snap.id]);
    assert.equal((await client.snapshots.get(snap.id)).id, snap.id);
    await client.snapshots.delete(snap.id);
    await assert.rejects(client.snapshots.get(snap.id), NotFoundError);
    for (const id of [env.id, fork.id, fromSnap.id]) await client.environments.destroy(id);
  });

  it("errors are typed: a bad id, a template with a snapshot, a denied restore", async () => {
    const env = await client.environments.create({ permissions: { write_file: "deny" } });
    const snap = await client.snapshots.create(env.id);
    await assert.rejects(client.snapshots.restore(env.id, "snap-000000000000"), NotFoundError);
    await assert.rejects(client.snapshots.restore(env.id, "../x"), InvalidRequestError);
    await assert.rejects(client.environments.create({ snapshot: snap.id, template: "host" }), InvalidRequestError);
    await assert.rejects(client.snapshots.restore(env.id, snap.id), DeniedByPolicyError);
    await client.snapshots.delete(snap.id);
    await client.environments.destroy(env.id);
  });
});
