// The gate (docs/GATE.md) through the SDK, against a real moatd started here
// with a short approval timeout (needs root, like moatd).

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";

import {
  ApprovalPendingError,
  ConflictError,
  DeniedByPolicyError,
  ForbiddenError,
  InvalidRequestError,
  Moat,
} from "../dist/index.js";
import { startMoatd } from "./moatd.mjs";

const root = process.getuid?.() === 0;
const skip = root ? false : "needs root (moatd creates namespaces, cgroups and mounts)";
const APPROVAL_TIMEOUT_S = 5;

describe("the gate, against a real moatd", { skip }, () => {
  let moatd;
  let client;  // the master token: the person who decides
  const clients = [];

  before(async () => {
    moatd = await startMoatd(["--approval-timeout", String(APPROVAL_TIMEOUT_S)]);
    client = new Moat({ baseUrl: moatd.baseUrl, token: moatd.token });
  });

  after(async () => {
    for (const c of clients) c.close();
    client?.close();
    await moatd?.stop();
  });

  /** A client with a new API key (an agent). */
  async function agentClient(request = {}) {
    const key = await client.keys.create({ name: "agent", scopes: ["create", "read", "exec", "files", "destroy"], ...request });
    const agent = new Moat({ baseUrl: moatd.baseUrl, token: key.token });
    clients.push(agent);
    return { key, agent };
  }

  /** Waits until the environment has a pending approval, and returns it. */
  async function pendingApproval(envId) {
    for (let i = 0; i < 100; i++) {
      const [pending] = await client.approvals.list({ state: "pending", environment: envId });
      if (pending) return pending;
      await sleep(50);
    }
    throw new Error(`no pending approval for ${envId}`);
  }

  it("throws DeniedByPolicyError with the scope, the action and the rule", async () => {
    const env = await client.environments.create({
      task_id: "gate-deny",
      permissions: {
        run_command: [{ match: ["rm", "*"], action: "deny" }, { action: "allow" }],
        write_file: [{ path: "/workspace/**", action: "allow" }, { action: "deny" }],
      },
    });
    assert.deepEqual(env.permissions.run_command, [{ match: ["rm", "*"], action: "deny" }, { action: "allow" }]);
    assert.equal(env.permissions.network, "deny");  // a default
    assert.equal((await client.environments.exec(env.id, { cmd: ["echo", "ok"] })).stdout, "ok\n");

    await assert.rejects(client.environments.exec(env.id, { cmd: ["/usr/bin/rm", "-rf", "/workspace"] }), (e) => {
      assert.ok(e instanceof DeniedByPolicyError);
      assert.ok(e instanceof ForbiddenError, "a DeniedByPolicyError is a ForbiddenError");
      assert.equal(e.status, 403);
      assert.equal(e.code, "denied_by_policy");
      assert.equal(e.scope, "run_command");
      assert.deepEqual(e.rule, { match: ["rm", "*"], action: "deny" });
      assert.deepEqual(e.action, { scope: "run_command", op: "exec", argv: ["/usr/bin/rm", "-rf", "/workspace"] });
      assert.equal(e.approval, undefined);
      assert.match(e.message, /rule 1 of the environment's permissions/);
      return true;
    });
    // Processes are gated the same way.
    await assert.rejects(client.environments.processes.start(env.id, { cmd: ["rm", "x"] }), DeniedByPolicyError);

    await client.environments.files.write(env.id, "/workspace/ok.txt", "fine");
    await assert.rejects(client.environments.files.write(env.id, "/workspace/../etc/evil", "x"), (e) => {
      assert.ok(e instanceof DeniedByPolicyError);
      assert.equal(e.scope, "write_file");
      assert.deepEqual(e.rule, { action: "deny" });
      assert.equal(e.action.path, "/etc/evil");
      assert.equal(e.action.op, "write");
      return true;
    });

    // No rule matched: deny, and no rule to name.
    const strict = await client.environments.create({
      task_id: "gate-deny", permissions: { run_command: [{ match: ["echo", "*"], action: "allow" }] },
    });
    await assert.rejects(client.environments.exec(strict.id, { cmd: ["true"] }), (e) => {
      assert.ok(e instanceof DeniedByPolicyError);
      assert.equal(e.rule, undefined);
      assert.match(e.message, /no rule .* matched/);
      return true;
    });
  });

  it("waits for a person: approved from a second client, exec returns its result", async () => {
    const { key, agent } = await agentClient();
    const env = await agent.environments.create({
      task_id: "gate-ask",
      permissions: { run_command: [{ match: ["echo", "*"], action: "ask" }, { action: "allow" }] },
    });
    const running = agent.environments.exec(env.id, { cmd: ["echo", "approved"] });
    const approval = await pendingApproval(env.id);
    assert.equal(approval.requester, key.id);
    assert.equal(approval.scope, "run_command");
    assert.deepEqual(approval.action, { scope: "run_command", op: "exec", argv: ["echo", "approved"] });
    assert.equal(approval.decided_by, undefined);
    // The agent cannot see (let alone decide) approvals without the approve scope.
    await assert.rejects(agent.approvals.approve(approval.id), (e) => e instanceof ForbiddenError && !(e instanceof DeniedByPolicyError));

    const decided = await client.approvals.approve(approval.id, { reason: "looks fine" });
    assert.equal(decided.state, "approved");
    assert.equal(decided.decided_by, "master");
    assert.equal(decided.reason, "looks fine");
    const result = await running;
    assert.equal(result.exit_code, 0);
    assert.equal(result.stdout, "approved\n");
    await assert.rejects(client.approvals.deny(approval.id), ConflictError);  // already decided

    // A person's "no" is a DeniedByPolicyError naming the approval.
    // (The rejection is handled from the start: it may come before deny() answers.)
    let second;
    const refused = assert.rejects(agent.environments.exec(env.id, { cmd: ["echo", "again"] }), (e) => {
      assert.ok(e instanceof DeniedByPolicyError);
      assert.equal(e.approval, second.id);
      assert.equal(e.scope, "run_command");
      assert.match(e.message, /denied by master: not now/);
      return true;
    });
    second = await pendingApproval(env.id);
    await client.approvals.deny(second.id, { reason: "not now" });
    await refused;

    // remember: the decision becomes a rule, and the same command no longer asks.
    const third = agent.environments.exec(env.id, { cmd: ["echo", "always"] });
    await client.approvals.approve((await pendingApproval(env.id)).id, { remember: true });
    assert.equal((await third).stdout, "always\n");
    assert.equal((await agent.environments.exec(env.id, { cmd: ["echo", "always"] })).stdout, "always\n");
    const { permissions } = await agent.environments.permissions.get(env.id);
    assert.deepEqual(permissions.run_command[0], { match: ["echo", "always"], action: "allow" });
  });

  it("expires an approval nobody decides", async () => {
    const env = await client.environments.create({ task_id: "gate-expire", permissions: { run_command: "ask" } });
    const started = Date.now();
    await assert.rejects(client.environments.exec(env.id, { cmd: ["true"] }), (e) => {
      assert.ok(e instanceof DeniedByPolicyError);
      assert.match(e.message, new RegExp(`no decision within ${APPROVAL_TIMEOUT_S} s`));
      assert.equal(typeof e.approval, "string");
      return true;
    });
    assert.ok(Date.now() - started >= (APPROVAL_TIMEOUT_S - 1) * 1000);
    const [expired] = await client.approvals.list({ environment: env.id });
    assert.equal(expired.state, "expired");
    await assert.rejects(client.approvals.approve(expired.id), ConflictError);
  });

  it("asks without waiting: ApprovalPendingError, approve, repeat", async () => {
    const { agent } = await agentClient();
    const env = await agent.environments.create({
      task_id: "gate-async",
      permissions: { run_command: "ask", write_file: [{ path: "/workspace/**", action: "ask" }, { action: "deny" }] },
    });
    const request = { cmd: ["sh", "-c", "echo ran"] };
    let pending;
    await assert.rejects(agent.environments.exec(env.id, request, { approval: "async" }), (e) => {
      assert.ok(e instanceof ApprovalPendingError);
      assert.equal(e.status, 202);
      assert.equal(e.code, "approval_pending");
      assert.equal(e.approval.state, "pending");
      assert.equal(e.approval.environment, env.id);
      assert.deepEqual(e.approval.action.argv, request.cmd);
      assert.equal(e.location, `/v1/approvals/${e.approval.id}`);
      pending = e.approval;
      return true;
    });
    // Still pending after a short wait; then decided while someone waits on it.
    assert.equal((await client.approvals.get(pending.id, { wait: 1 })).state, "pending");
    const following = client.approvals.get(pending.id, { wait: 30 });
    await sleep(200);
    await client.approvals.approve(pending.id);
    assert.equal((await following).state, "approved");

    const result = await agent.environments.exec(env.id, request, { approval: "async" });
    assert.equal(result.stdout, "ran\n");
    // The grant was used up: the same command asks again.
    await assert.rejects(agent.environments.exec(env.id, request, { approval: "async" }), (e) => {
      assert.ok(e instanceof ApprovalPendingError);
      assert.notEqual(e.approval.id, pending.id);
      return true;
    });

    // File writes (a PUT) and process starts take the same option.
    const write = () => agent.environments.files.write(env.id, "/workspace/out.txt", "hello", { approval: "async" });
    const writeError = await write().then(() => assert.fail("the write should ask"), (e) => e);
    assert.ok(writeError instanceof ApprovalPendingError);
    assert.equal(writeError.approval.scope, "write_file");
    assert.equal(writeError.approval.action.path, "/workspace/out.txt");
    assert.equal(writeError.approval.action.size, 5);
    await client.approvals.approve(writeError.approval.id);
    await write();
    assert.equal(await client.environments.files.readText(env.id, "/workspace/out.txt"), "hello");

    const start = () => agent.environments.processes.start(env.id, { cmd: ["true"] }, { approval: "async" });
    const startError = await start().then(() => assert.fail("the start should ask"), (e) => e);
    assert.ok(startError instanceof ApprovalPendingError);
    assert.equal(startError.approval.action.op, "process");
    await client.approvals.approve(startError.approval.id);
    const proc = await start();
    assert.equal((await proc.wait()).exit_code, 0);

    await assert.rejects(agent.environments.exec(env.id, request, { approval: "later" }), TypeError);
  });

  it("gets and sets permissions: a key adds a layer, replacing needs more", async () => {
    const { agent } = await agentClient();
    const env = await agent.environments.create({ task_id: "gate-layers" });
    const initial = await agent.environments.permissions.get(env.id);
    assert.deepEqual(initial.permissions, { read_file: "allow", write_file: "allow", run_command: "allow", network: "deny" });
    assert.deepEqual(initial.layers, [initial.permissions]);
    assert.equal(initial.ceiling, undefined);

    const layered = await agent.environments.permissions.set(env.id, {
      run_command: [{ match: ["rm", "*"], action: "deny" }, { action: "allow" }],
    });
    assert.equal(layered.layers.length, 2);
    assert.deepEqual(layered.permissions, initial.permissions);  // the first layer is unchanged
    assert.deepEqual(layered.layers[1].run_command, [{ match: ["rm", "*"], action: "deny" }, { action: "allow" }]);
    assert.equal(layered.layers[1].write_file, "allow");  // left out: does not restrict
    assert.equal((await agent.environments.get(env.id)).permission_layers, 2);
    await assert.rejects(agent.environments.exec(env.id, { cmd: ["rm", "-f", "/tmp/x"] }), (e) => {
      assert.ok(e instanceof DeniedByPolicyError);
      assert.match(e.message, /permission layer 1/);
      return true;
    });

    // Replacing can loosen: not for this key.
    await assert.rejects(agent.environments.permissions.set(env.id, { run_command: "allow" }, { replace: true }), (e) => {
      assert.ok(e instanceof ForbiddenError);
      assert.ok(!(e instanceof DeniedByPolicyError));
      assert.equal(e.field, "replace");
      return true;
    });
    await assert.rejects(agent.environments.permissions.set(env.id, { run_command: [{ action: "maybe" }] }), (e) => {
      assert.ok(e instanceof InvalidRequestError);
      assert.equal(e.field, "permissions.run_command[0].action");
      return true;
    });
    const replaced = await client.environments.permissions.set(env.id, { run_command: "allow" }, { replace: true });
    assert.equal(replaced.layers.length, 1);
    assert.equal((await agent.environments.exec(env.id, { cmd: ["rm", "-f", "/tmp/x"] })).exit_code, 0);

    // A key's ceiling binds every environment it acts on.
    const ceiling = { run_command: [{ match: ["echo", "*"], action: "allow" }, { action: "deny" }] };
    const { key, agent: bounded } = await agentClient({ permissions: ceiling });
    assert.deepEqual(key.permissions.run_command, ceiling.run_command);
    assert.deepEqual((await client.keys.list()).find((k) => k.id === key.id).permissions.run_command, ceiling.run_command);
    const boundedEnv = await bounded.environments.create({ task_id: "gate-ceiling", permissions: { run_command: "allow" } });
    const view = await bounded.environments.permissions.get(boundedEnv.id);
    assert.deepEqual(view.ceiling.run_command, ceiling.run_command);
    assert.equal((await bounded.environments.exec(boundedEnv.id, { cmd: ["echo", "hi"] })).stdout, "hi\n");
    await assert.rejects(bounded.environments.exec(boundedEnv.id, { cmd: ["true"] }), (e) => {
      assert.ok(e instanceof DeniedByPolicyError);
      assert.match(e.message, /ceiling/);
      return true;
    });
  });

  it("lists approvals filtered by state and environment", async () => {
    const env = await client.environments.create({ task_id: "gate-list", permissions: { run_command: "ask" } });
    const other = await client.environments.create({ task_id: "gate-list", permissions: { run_command: "ask" } });
    const ask = async (envId, cmd) => {
      const e = await client.environments.exec(envId, { cmd }, { approval: "async" }).then(() => assert.fail("should ask"), (x) => x);
      assert.ok(e instanceof ApprovalPendingError);
      return e.approval;
    };
    const denied = await ask(env.id, ["echo", "one"]);
    await client.approvals.deny(denied.id, { reason: "no" });
    const pending = await ask(env.id, ["echo", "two"]);
    const elsewhere = await ask(other.id, ["echo", "three"]);

    const all = await client.approvals.list({ environment: env.id });
    assert.deepEqual(all.map((a) => a.id), [pending.id, denied.id]);  // newest first
    assert.deepEqual((await client.approvals.list({ environment: env.id, state: "pending" })).map((a) => a.id), [pending.id]);
    const deniedList = await client.approvals.list({ environment: env.id, state: "denied" });
    assert.deepEqual(deniedList.map((a) => a.id), [denied.id]);
    assert.equal(deniedList[0].reason, "no");
    assert.equal(deniedList[0].remember, false);
    const pendingEverywhere = (await client.approvals.list({ state: "pending" })).map((a) => a.id);
    assert.ok(pendingEverywhere.includes(pending.id) && pendingEverywhere.includes(elsewhere.id));
    assert.ok(!pendingEverywhere.includes(denied.id));
    assert.deepEqual(await client.approvals.list({ environment: env.id, state: "expired" }), []);
    await assert.rejects(client.approvals.list({ state: "maybe" }), { code: "invalid_request", field: "state" });
  });
});
