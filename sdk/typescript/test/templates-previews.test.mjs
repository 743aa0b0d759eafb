// moat.templates and env.getUrl / env.previews against a real moatd (root).
//
// The SDK side of the same calls is tested now against a fake moatd:
// test/templates-previews-client.test.mjs.

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { copyFileSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import http from "node:http";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { after, before, describe, it } from "node:test";

import {
  ConflictError,
  ForbiddenError,
  InvalidRequestError,
  Moat,
  NotFoundError,
  PortUnreachableError,
  TemplateFailedError,
} from "../dist/index.js";
import { binDir, startMoatd } from "./moatd.mjs";

// moat-init of a sanitized build (make sanitize) is linked dynamically (ASan
// has no static runtime with glibc): an image it starts in must hold its
// loader and libraries. A release build's moat-init is static: ldd says so
// and nothing is added.
function addMoatInitLibraries(rootfs) {
  const r = spawnSync("ldd", [join(binDir, "moat-init")], { encoding: "utf8" });
  if (r.status !== 0) return;
  for (const m of r.stdout.matchAll(/(\/\S+) \(0x/g)) {
    const target = join(rootfs, m[1]);
    mkdirSync(dirname(target), { recursive: true });
    copyFileSync(m[1], target);
  }
}

const root = process.getuid?.() === 0;
const skip = root ? false : "needs root (moatd creates namespaces, cgroups and mounts)";
const umoci = spawnSync("umoci", ["--version"], { stdio: "ignore" }).status === 0;

/** GET `path` from moatd's TCP port with the given Host header and no token. */
function getWithHost(port, host, path = "/") {
  return new Promise((resolve, reject) => {
    const req = http.get({ host: "127.0.0.1", port, path, headers: { Host: host } }, (res) => {
      let body = "";
      res.setEncoding("utf8");
      res.on("data", (c) => (body += c));
      res.on("end", () => resolve({ status: res.statusCode, body }));
    });
    req.on("error", reject);
  });
}

describe("templates, against a real moatd", { skip }, () => {
  let moatd;
  let moat;
  let work;

  before(async () => {
    moatd = await startMoatd();
    moat = new Moat({ baseUrl: moatd.baseUrl, token: moatd.token });
    work = mkdtempSync(join(tmpdir(), "moat-sdk-templates-"));
  });

  after(async () => {
    moat?.close();
    await moatd?.stop();
    if (work) rmSync(work, { recursive: true, force: true });
  });

  it("lists the built-in host template", async () => {
    const host = (await moat.templates.list()).find((t) => t.name === "host");
    assert.ok(host);
    assert.equal(host.source, "builtin");
    assert.equal(host.state, "ready");
    assert.equal((await moat.templates.get("host")).name, "host");
  });

  it("builds a template from a recipe, waiting until it is ready; environments start from it", async () => {
    const stages = [];
    const t = await moat.templates.build(
      { name: "sdk-recipe", base: "host", run: ["mkdir -p /opt/sdk", "echo \"built $MARK\" > /opt/sdk/mark"], env: { MARK: "by-sdk" } },
      { onProgress: (p) => stages.push(p.state) },
    );
    assert.equal(t.state, "ready");
    assert.ok(stages.every((s) => s === "building"), stages.join(","));
    const env = await moat.create({ template: "sdk-recipe" });
    assert.equal(env.template, "host");  // the base: the built files are a fork of its snapshot (docs/TEMPLATES.md)
    assert.equal((await env.run("cat /opt/sdk/mark")).stdout, "built by-sdk\n");

    await assert.rejects(moat.templates.build({ name: "sdk-recipe", base: "host", run: "true" }), ConflictError);
    // Deleting a built template leaves the environments made from it their own copies.
    await moat.templates.remove("sdk-recipe");
    await assert.rejects(moat.templates.get("sdk-recipe"), NotFoundError);
    assert.equal((await env.run("cat /opt/sdk/mark")).stdout, "built by-sdk\n");
    await env.destroy();
  });

  it("a failing recipe is a TemplateFailedError; a bad name an InvalidRequestError", async () => {
    await assert.rejects(moat.templates.build({ name: "sdk-broken", base: "host", run: ["true", "exit 3"] }), (e) => {
      assert.ok(e instanceof TemplateFailedError, String(e));
      assert.equal(e.template.state, "failed");
      assert.ok(e.template.error?.message);
      return true;
    });
    await assert.rejects(moat.templates.build({ name: "host", base: "host", run: "true" }), InvalidRequestError);
    await assert.rejects(moat.templates.build({ name: "Bad Name", base: "host", run: "true" }), InvalidRequestError);
  });

  it("imports an OCI layout (umoci) with its config; a key may not name host paths", { skip: umoci ? false : "umoci is not installed" }, async () => {
    const layout = join(work, "layout");
    const bundle = join(work, "bundle");
    const run = (...args) => {
      const r = spawnSync("umoci", args, { encoding: "utf8" });
      assert.equal(r.status, 0, `umoci ${args.join(" ")}: ${r.stderr}`);
    };
    run("init", "--layout", layout);
    run("new", "--image", `${layout}:latest`);
    run("unpack", "--image", `${layout}:latest`, bundle);
    mkdirSync(join(bundle, "rootfs", "etc"), { recursive: true });
    writeFileSync(join(bundle, "rootfs", "etc", "greeting"), "hello from the image\n");
    addMoatInitLibraries(join(bundle, "rootfs"));
    run("repack", "--image", `${layout}:latest`, bundle);
    run("config", "--image", `${layout}:latest`, "--config.env", "GREETING=hi", "--config.workingdir", "/etc");

    const t = await moat.templates.import(`oci:${layout}:latest`, { name: "sdk-oci:1" });
    assert.equal(t.state, "ready");
    assert.equal(t.name, "sdk-oci:1");
    assert.ok(t.config.env.includes("GREETING=hi"), JSON.stringify(t.config));
    assert.equal(t.config.working_dir, "/etc");
    const env = await moat.create({ template: "sdk-oci:1" });
    assert.equal(await env.files.readText("/etc/greeting"), "hello from the image\n");
    await env.destroy();
    await moat.templates.remove("sdk-oci:1");

    await assert.rejects(moat.templates.import(`oci:${work}/nothing-here`, { name: "sdk-missing" }), (e) =>
      e instanceof TemplateFailedError || e instanceof InvalidRequestError || e instanceof NotFoundError);

    const key = await moat.keys.create({ name: "templater", scopes: ["templates", "read"] });
    const agent = new Moat({ baseUrl: moatd.baseUrl, token: key.token });
    await assert.rejects(agent.templates.import(`oci:${layout}:latest`, { name: "sdk-by-key" }), (e) => {
      assert.ok(e instanceof ForbiddenError);
      assert.equal(e.field, "source");
      return true;
    });
    agent.close();
  });
});

describe("previews, against a real moatd", { skip }, () => {
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

  it("getUrl opens a server inside without the token until revoked", async () => {
    const env = await moat.create();  // network "none": inbound still works
    await env.files.write("/workspace/index.html", "hello through the preview\n");
    let serving;
    const ready = new Promise((resolve) => {
      serving = resolve;
    });
    const server = await env.start("exec python3 -u -m http.server 8000 --bind 127.0.0.1", {
      cwd: "/workspace",
      onStdout: (text) => text.includes("Serving HTTP") && serving(),
      onStderr: (text) => text.includes("Serving HTTP") && serving(),
    });
    await ready;

    const url = new URL(await env.getUrl(8000, { ttlS: 120 }));
    assert.match(url.hostname, /\.preview\.localhost$/);
    assert.equal(Number(url.port), moatd.port);
    const page = await getWithHost(moatd.port, url.host, "/index.html");
    assert.equal(page.status, 200);
    assert.equal(page.body, "hello through the preview\n");

    const listed = await env.previews.list();
    assert.equal(listed.length, 1);
    assert.equal(listed[0].port, 8000);
    assert.equal(listed[0].url, undefined);  // the secret is shown only once
    await env.previews.revoke(listed[0].id);
    const revoked = await getWithHost(moatd.port, url.host, "/index.html");
    assert.ok(revoked.status >= 400, `revoked preview answered ${revoked.status}`);
    assert.ok(JSON.parse(revoked.body).error.code);

    // Nothing listening: the authenticated proxy says port_unreachable.
    await assert.rejects(
      moat.transport.request({ method: "GET", path: `/v1/environments/${env.id}/ports/9/` }),
      (e) => e instanceof PortUnreachableError && e.status === 502,
    );
    await server.kill();
    await env.destroy();
  });

  it("needs the ports scope", async () => {
    const key = await moat.keys.create({ name: "no-ports", scopes: ["create", "read", "exec", "destroy"] });
    const agent = new Moat({ baseUrl: moatd.baseUrl, token: key.token });
    const env = await agent.create();
    await assert.rejects(env.getUrl(8000), (e) => e instanceof ForbiddenError && e.code === "forbidden");
    await env.destroy();
    agent.close();
  });
});
