// Egress control (docs/EGRESS.md) through the SDK, against a real moatd
// started here (needs root, like moatd): network policies and secrets on
// create, environments.network get/set, validation naming the field, and a
// moatd run with --no-egress. No traffic leaves: no real host is reached.

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import { ForbiddenError, InvalidRequestError, Moat, UnavailableError } from "../dist/index.js";
import { startMoatd } from "./moatd.mjs";

const root = process.getuid?.() === 0;
const skip = root ? false : "needs root (moatd creates namespaces, cgroups and mounts)";

const TOKEN_VALUE = "ghp_sdk-test-never-shown-0123456789";
const PLACEHOLDER = /^moat-secret-[0-9a-f]{32}$/;

/** The variables of a command in the environment: `name=value` lines, "unset" when a variable is. */
async function variables(client, envId, names) {
  const script = names.map((n) => `echo "${n}=\${${n}-unset}"`).join("; ");
  const r = await client.environments.exec(envId, { cmd: ["sh", "-c", script] });
  assert.equal(r.exit_code, 0, r.stderr);
  return Object.fromEntries(r.stdout.trimEnd().split("\n").map((line) => line.split(/=(.*)/s).slice(0, 2)));
}

describe("egress, against a real moatd", { skip }, () => {
  let moatd;
  let client;
  const clients = [];

  before(async () => {
    moatd = await startMoatd();
    client = new Moat({ baseUrl: moatd.baseUrl, token: moatd.token });
  });

  after(async () => {
    for (const c of clients) c.close();
    client?.close();
    await moatd?.stop();
  });

  it("creates an agent environment with an allowlist and a secret it never sees", async () => {
    const network = {
      allow: ["pypi.org", "files.pythonhosted.org:443",
              { host: "api.github.com", methods: ["GET", "POST"], paths: ["/repos/**"] }],
      deny: ["upload.pypi.org"],
    };
    const secrets = [{ name: "GITHUB_TOKEN", value: TOKEN_VALUE, hosts: ["api.github.com"],
                       header: "Authorization: Bearer {value}" }];
    const env = await client.environments.create({ task_id: "sdk-egress", network, secrets });
    assert.equal(env.state, "running");
    assert.equal(env.network, "allowlist");  // an object without mode is an allowlist
    assert.deepEqual(env.secrets, [{ name: "GITHUB_TOKEN", hosts: ["api.github.com"], header: "Authorization" }]);
    assert.ok(!JSON.stringify(env).includes(TOKEN_VALUE), "the create answer shows the secret's value");

    // Nor does any later answer.
    const again = await client.environments.get(env.id);
    assert.deepEqual(again.secrets, env.secrets);
    assert.equal(again.network, "allowlist");
    const listed = (await client.environments.list({ task_id: "sdk-egress" })).find((e) => e.id === env.id);
    assert.deepEqual(listed.secrets, env.secrets);
    const state = await client.environments.network.get(env.id);
    for (const answer of [again, listed, state]) {
      assert.ok(!JSON.stringify(answer).includes(TOKEN_VALUE), `an answer shows the secret's value: ${JSON.stringify(answer)}`);
    }

    // The policy as stored: every field written out, entries as given.
    assert.deepEqual(state.network, { mode: "allowlist", allow: network.allow, deny: network.deny, max_connections: 64 });
    assert.match(state.link.address, /^100\.(6[4-9]|[7-9]\d|1[01]\d|12[0-7])\.\d+\.\d+$/);
    assert.equal(state.link.proxy, `http://${state.link.gateway}:3128`);

    // Inside: a placeholder in the variable, the proxy in HTTPS_PROXY, and the value nowhere.
    const vars = await variables(client, env.id, ["GITHUB_TOKEN", "HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY"]);
    assert.match(vars.GITHUB_TOKEN, PLACEHOLDER);
    assert.equal(vars.HTTPS_PROXY, state.link.proxy);
    assert.equal(vars.HTTP_PROXY, state.link.proxy);
    assert.equal(vars.NO_PROXY, "localhost,127.0.0.1,::1");
    const everything = await client.environments.exec(env.id, {
      cmd: ["sh", "-c", "env; tr '\\0' '\\n' < /proc/1/environ; cat /etc/environment 2>/dev/null; true"],
    });
    assert.match(everything.stdout, /^GITHUB_TOKEN=moat-secret-[0-9a-f]{32}$/m);
    assert.ok(!everything.stdout.includes(TOKEN_VALUE), "the environment sees the secret's value");
  });

  it("gets and sets the network policy: none -> allowlist -> none", async () => {
    const env = await client.environments.create({ task_id: "sdk-egress" });
    assert.equal(env.network, "none");
    assert.equal(env.secrets, undefined);
    const none = await client.environments.network.get(env.id);
    assert.deepEqual(none, { network: { mode: "none", allow: [], deny: [], max_connections: 64 } });
    assert.deepEqual(await variables(client, env.id, ["HTTPS_PROXY"]), { HTTPS_PROXY: "unset" });

    const policy = {
      mode: "allowlist",
      allow: ["*.pypi.org", { host: "api.github.com", ports: [443], methods: ["GET"], paths: ["/repos/**"] }, "203.0.113.0/24"],
      deny: ["upload.pypi.org"],
      max_connections: 8,
      bandwidth_mbps: 10,
    };
    const allowlist = await client.environments.network.set(env.id, policy);
    assert.deepEqual(allowlist.network, policy);
    assert.ok(allowlist.link, "no link after leaving none");
    assert.equal(allowlist.link.proxy, `http://${allowlist.link.gateway}:3128`);
    assert.deepEqual(await client.environments.network.get(env.id), allowlist);
    assert.equal((await client.environments.get(env.id)).network, "allowlist");
    // Commands started from now on get the proxy.
    assert.deepEqual(await variables(client, env.id, ["HTTPS_PROXY"]), { HTTPS_PROXY: allowlist.link.proxy });

    // The shorthand, and back to none: the link is taken out.
    const open = await client.environments.network.set(env.id, "open");
    assert.equal(open.network.mode, "open");
    assert.deepEqual(open.link, allowlist.link);
    const back = await client.environments.network.set(env.id, "none");
    assert.deepEqual(back, { network: { mode: "none", allow: [], deny: [], max_connections: 64 } });
    assert.equal((await client.environments.get(env.id)).network, "none");
    assert.deepEqual(await variables(client, env.id, ["HTTPS_PROXY"]), { HTTPS_PROXY: "unset" });
  });

  it("rejects a bad policy with an error naming the field", async () => {
    const rejectsWith = (promise, field, message) =>
      assert.rejects(promise, (e) => {
        assert.ok(e instanceof InvalidRequestError, `${e.name}: ${e.message}`);
        assert.equal(e.status, 400);
        assert.equal(e.code, "invalid_request");
        assert.equal(e.field, field);
        if (message) assert.match(e.message, message);
        return true;
      });

    await rejectsWith(client.environments.create({ network: { allow: ["[::1]:443"] } }), "network.allow[0]", /IPv6/);
    await rejectsWith(client.environments.create({ network: { allow: ["10.0.0.0/40"] } }), "network.allow[0]");
    await rejectsWith(client.environments.create({ network: { mode: "sometimes" } }), "network.mode");
    await rejectsWith(client.environments.create({ network: "closed" }), "network");
    await rejectsWith(client.environments.create({ network: { allow: [{ host: "x.example", ports: [0] }] } }),
                      "network.allow[0].ports[0]");
    await rejectsWith(client.environments.create({ network: { allow: [{ host: "x", verbs: ["GET"] }] } }),
                      "network.allow[0].verbs");
    await rejectsWith(client.environments.create({ network: "open", secrets: [{ name: "T", value: "v", hosts: ["*"] }] }),
                      "secrets[0].hosts[0]");

    const env = await client.environments.create({ task_id: "sdk-egress" });
    await rejectsWith(client.environments.network.set(env.id, { allow: ["pypi.org", "[2001:db8::1]"] }), "network.allow[1]", /IPv6/);
    await rejectsWith(client.environments.network.set(env.id, { deny: [{ host: "a.example", paths: ["no-slash"] }] }),
                      "network.deny[0].paths[0]");
    // Nothing changed.
    assert.equal((await client.environments.network.get(env.id)).network.mode, "none");
  });

  it("needs the permissions scope to change the policy, not to read it", async () => {
    const key = await client.keys.create({ name: "agent", scopes: ["create", "read", "exec", "destroy"] });
    const agent = new Moat({ baseUrl: moatd.baseUrl, token: key.token });
    clients.push(agent);
    const env = await agent.environments.create({ task_id: "sdk-egress", network: { allow: ["pypi.org"] } });
    assert.equal((await agent.environments.network.get(env.id)).network.mode, "allowlist");
    await assert.rejects(agent.environments.network.set(env.id, "open"), (e) => {
      assert.ok(e instanceof ForbiddenError);
      assert.equal(e.code, "forbidden");
      assert.match(e.message, /permissions/);
      return true;
    });
    assert.equal((await client.environments.network.set(env.id, "open")).network.mode, "open");
  });
});

describe("egress, against a moatd run with --no-egress", { skip }, () => {
  let moatd;
  let client;

  before(async () => {
    moatd = await startMoatd(["--no-egress"]);
    // No retries: a 503 is retried for idempotent calls, and this one stays.
    client = new Moat({ baseUrl: moatd.baseUrl, token: moatd.token, maxRetries: 0 });
  });

  after(async () => {
    client?.close();
    await moatd?.stop();
  });

  it("answers UnavailableError for anything but none", async () => {
    const unavailable = (e) => {
      assert.ok(e instanceof UnavailableError, `${e.name}: ${e.message}`);
      assert.equal(e.status, 503);
      assert.equal(e.code, "unavailable");
      return true;
    };
    await assert.rejects(client.environments.create({ network: "open" }), unavailable);
    await assert.rejects(
      client.environments.create({ secrets: [{ name: "T", value: "v", hosts: ["api.example.com"] }] }),
      unavailable,
    );
    const env = await client.environments.create({ task_id: "sdk-no-egress", network: "none" });
    assert.equal(env.network, "none");
    assert.equal((await client.environments.network.get(env.id)).network.mode, "none");
    assert.equal((await client.environments.network.set(env.id, "none")).network.mode, "none");
    await assert.rejects(client.environments.network.set(env.id, { allow: ["pypi.org"] }), unavailable);
  });
});
