// Where the client finds moatd and its token, as the CLI does (src/cli/client.cc):
// the option, then MOAT_URL / MOAT_TOKEN, then the state directory
// (the stateDir option, MOAT_STATE, /var/lib/moat): its moatd.sock and master-token.
// This file changes process.env; node --test runs each file in its own process.

import assert from "node:assert/strict";
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, afterEach, before, beforeEach, describe, it } from "node:test";

import { MoatConnectionError, Moat, NoTokenError, UnauthorizedError } from "../dist/index.js";
import { startMoatd } from "./moatd.mjs";

const root = process.getuid?.() === 0;
const skip = root ? false : "needs root (moatd creates namespaces, cgroups and mounts)";
const VARS = ["MOAT_URL", "MOAT_TOKEN", "MOAT_STATE"];

let saved;
function clearVars() {
  saved = Object.fromEntries(VARS.map((k) => [k, process.env[k]]));
  for (const k of VARS) delete process.env[k];
}
function restoreVars() {
  for (const k of VARS) {
    if (saved[k] === undefined) delete process.env[k];
    else process.env[k] = saved[k];
  }
}

describe("token discovery without moatd", () => {
  let dir;
  beforeEach(() => {
    clearVars();
    dir = mkdtempSync(join(tmpdir(), "moat-sdk-discovery-"));
  });
  afterEach(() => {
    restoreVars();
    rmSync(dir, { recursive: true, force: true });
  });

  it("names every place it looked when there is no token, and sends nothing", async () => {
    process.env.MOAT_STATE = dir;
    // A server that must not be asked: no token, no request.
    const client = new Moat({ baseUrl: "http://127.0.0.1:1" });
    await assert.rejects(client.list(), (e) => {
      assert.ok(e instanceof NoTokenError);
      assert.ok(e instanceof UnauthorizedError);
      assert.equal(e.code, "no_token");
      assert.equal(e.status, 0);
      assert.match(e.message, /the token option \(not given\)/);
      assert.match(e.message, /\$MOAT_TOKEN \(not set\)/);
      assert.ok(e.message.includes(`${dir}/master-token (no such file; state directory from $MOAT_STATE)`), e.message);
      assert.deepEqual(e.looked, [
        "the token option (not given)",
        "$MOAT_TOKEN (not set)",
        `${dir}/master-token (no such file; state directory from $MOAT_STATE)`,
      ]);
      return true;
    });
  });

  it("says which setting was empty or unreadable, and the stateDir option beats MOAT_STATE", async () => {
    process.env.MOAT_STATE = "/nonexistent-state";
    process.env.MOAT_TOKEN = "";
    writeFileSync(join(dir, "master-token"), "  \n");
    const client = new Moat({ baseUrl: "http://127.0.0.1:1", token: "", stateDir: dir });
    await assert.rejects(client.create(), (e) => {
      assert.ok(e instanceof NoTokenError);
      assert.deepEqual(e.looked, [
        "the token option (empty)",
        "$MOAT_TOKEN (empty)",
        `${dir}/master-token (empty; state directory from the stateDir option)`,
      ]);
      return true;
    });
    writeFileSync(join(dir, "master-token"), "x".repeat(5000));  // as the CLI: not a token
    await assert.rejects(client.list(), (e) => e instanceof NoTokenError && /master-token \(larger than 4096 bytes/.test(e.message));
    // Only a user other than root can be refused a file (root reads any).
    if (process.getuid?.() !== 0) {
      writeFileSync(join(dir, "master-token"), "abc\n");
      chmodSync(join(dir, "master-token"), 0o000);
      await assert.rejects(client.list(), /master-token \(permission denied/);
    }
  });

  it("defaults to /var/lib/moat when nothing names a state directory", async () => {
    const client = new Moat({ baseUrl: "http://127.0.0.1:1" });
    assert.equal(client.transport.baseUrl, "http://127.0.0.1:1");
    const noState = new Moat();
    assert.equal(noState.transport.baseUrl, "unix:/var/lib/moat/moatd.sock");
    assert.match(noState.transport.baseUrlSource, /state directory \/var\/lib\/moat from the default/);
  });

  it("names MOAT_URL when its address is bad, and says where a default address came from", async () => {
    process.env.MOAT_URL = "ftp://x";
    assert.throws(() => new Moat(), (e) => e instanceof TypeError && /^MOAT_URL: /.test(e.message));
    delete process.env.MOAT_URL;
    process.env.MOAT_STATE = dir;
    process.env.MOAT_TOKEN = "t";
    const client = new Moat({ maxRetries: 0 });
    assert.equal(client.transport.baseUrl, `unix:${dir}/moatd.sock`);
    await assert.rejects(client.list(), (e) => {
      assert.ok(e instanceof MoatConnectionError);
      assert.ok(e.message.includes(`unix:${dir}/moatd.sock`), e.message);
      assert.match(e.message, /ENOENT/);
      assert.match(e.message, /no baseUrl option, \$MOAT_URL not set; state directory .* from \$MOAT_STATE/);
      return true;
    });
  });

  it("health needs no token", async () => {
    process.env.MOAT_STATE = dir;
    const http = await import("node:http");
    const { once } = await import("node:events");
    const seen = [];
    const server = http.createServer((req, res) => {
      seen.push(req.headers.authorization);
      res.writeHead(200, { "Content-Type": "application/json" });
      res.end('{"status":"ok"}');
    });
    server.listen(0, "127.0.0.1");
    await once(server, "listening");
    const client = new Moat({ baseUrl: `http://127.0.0.1:${server.address().port}` });
    assert.deepEqual(await client.health(), { status: "ok" });
    assert.deepEqual(seen, [undefined]);
    client.close();
    server.close();
  });
});

describe("token and address discovery, against a real moatd", { skip }, () => {
  let moatd;
  before(async () => {
    moatd = await startMoatd();
  });
  after(async () => {
    await moatd?.stop();
  });
  beforeEach(clearVars);
  afterEach(restoreVars);

  it("finds moatd's socket and token file from MOAT_STATE alone", async () => {
    process.env.MOAT_STATE = moatd.state;
    const moat = new Moat();
    assert.equal(moat.transport.baseUrl, `unix:${moatd.state}/moatd.sock`);
    assert.equal(moat.transport.tokenSource, `${moatd.state}/master-token`);
    const env = await moat.create({ task_id: "discovered" });
    assert.equal((await env.run("echo found")).stdout, "found\n");
    await env.destroy();
    moat.close();
  });

  it("and from the stateDir option", async () => {
    const moat = new Moat({ stateDir: moatd.state });
    assert.equal(moat.transport.baseUrl, `unix:${moatd.state}/moatd.sock`);
    assert.ok(Array.isArray(await moat.list()));
    moat.close();
  });

  it("uses MOAT_TOKEN before the token file, and the option before both", async () => {
    process.env.MOAT_STATE = moatd.state;  // its token file holds the right token
    process.env.MOAT_TOKEN = "0".repeat(64);  // a wrong one, looked at first
    const wrong = new Moat();
    assert.equal(wrong.transport.tokenSource, "$MOAT_TOKEN");
    await assert.rejects(wrong.list(), (e) => e instanceof UnauthorizedError && e.status === 401);
    const right = new Moat({ token: moatd.token });
    assert.equal(right.transport.tokenSource, "the token option");
    assert.ok(Array.isArray(await right.list()));

    process.env.MOAT_TOKEN = moatd.token;
    process.env.MOAT_URL = moatd.baseUrl;  // MOAT_URL before the state directory's socket
    const viaEnv = new Moat({ stateDir: "/nonexistent-state" });
    assert.equal(viaEnv.transport.baseUrl, moatd.baseUrl);
    assert.ok(Array.isArray(await viaEnv.list()));
    for (const c of [wrong, right, viaEnv]) c.close();
  });

  it("reads the token file when a request needs it, so a client made before moatd wrote it works", async () => {
    const dir = mkdtempSync(join(tmpdir(), "moat-sdk-late-"));
    try {
      const moat = new Moat({ baseUrl: moatd.baseUrl, stateDir: dir });
      await assert.rejects(moat.list(), NoTokenError);
      writeFileSync(join(dir, "master-token"), `${moatd.token}\n`);
      assert.ok(Array.isArray(await moat.list()));
      moat.close();
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
