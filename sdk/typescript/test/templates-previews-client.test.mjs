// moat.templates and env.getUrl/env.previews against a fake moatd on loopback
// that answers as the issue-28 contract says (no root, no moatd): the requests
// the SDK sends, waiting for a template to be ready, a failed one, a timeout.
// The same calls against a real moatd are in test/pending/ (enabled once
// moatd serves /v1/templates and /previews).

import assert from "node:assert/strict";
import http from "node:http";
import { once } from "node:events";
import { describe, it } from "node:test";

import {
  ConflictError,
  Environment,
  Moat,
  MoatTimeoutError,
  NotFoundError,
  PortUnreachableError,
  TemplateFailedError,
} from "../dist/index.js";

/** A fake moatd: `routes[METHOD path]` answers; every request is recorded with its JSON body. */
async function fakeMoatd(routes) {
  const requests = [];
  const server = http.createServer(async (req, res) => {
    let body = "";
    for await (const chunk of req) body += chunk;
    const url = new URL(req.url, "http://x");
    requests.push({ method: req.method, path: url.pathname, body: body ? JSON.parse(body) : undefined, auth: req.headers.authorization });
    const route = routes[`${req.method} ${url.pathname}`];
    const [status, answer] = route ? route(body ? JSON.parse(body) : undefined, requests.length) : [404, { error: { code: "not_found", message: "no route" } }];
    res.writeHead(status, { "Content-Type": "application/json" });
    res.end(answer === undefined ? "" : JSON.stringify(answer));
  });
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  return {
    requests,
    url: `http://127.0.0.1:${server.address().port}`,
    close: () => new Promise((resolve) => {
      server.closeAllConnections();
      server.close(() => resolve());
    }),
  };
}

const template = (fields) => ({
  name: "python:3.12",
  source: "docker://python:3.12",
  state: "ready",
  created_at: "2026-12-03T10:00:00.000Z",
  config: { env: ["PATH=/usr/local/bin:/usr/bin"], working_dir: "/", user: "", entrypoint: [], cmd: ["python3"] },
  ...fields,
});

describe("templates (fake moatd)", () => {
  it("import posts {name, source}, reports progress and waits until ready", async (t) => {
    let polls = 0;
    const fake = await fakeMoatd({
      "POST /v1/templates": () => [202, template({ state: "importing", progress: { stage: "pulling" } })],
      "GET /v1/templates/python:3.12": () => {
        polls += 1;
        return [200, polls < 3 ? template({ state: "importing", progress: { stage: "unpacking", bytes: polls * 1000 } }) : template({ size_bytes: 123 })];
      },
    });
    t.after(() => fake.close());
    const moat = new Moat({ baseUrl: fake.url, token: "tok" });
    t.after(() => moat.close());
    const progress = [];
    const ready = await moat.templates.import("docker://python:3.12", {
      name: "python:3.12",
      pollIntervalMs: 5,
      onProgress: (t) => progress.push(t.progress?.stage),
    });
    assert.equal(ready.state, "ready");
    assert.equal(ready.size_bytes, 123);
    assert.deepEqual(fake.requests[0], { method: "POST", path: "/v1/templates", body: { name: "python:3.12", source: "docker://python:3.12" }, auth: "Bearer tok" });
    assert.equal(fake.requests[1].path, "/v1/templates/python:3.12");
    assert.deepEqual(progress, ["pulling", "unpacking", "unpacking"]);
    assert.equal(polls, 3);

    // wait: false returns the 202's template at once.
    const started = await moat.templates.import("docker://python:3.12", { name: "python:3.12", wait: false });
    assert.equal(started.state, "importing");
    assert.equal(polls, 3);
  });

  it("build posts the recipe; a failed build is a TemplateFailedError with the template's error", async (t) => {
    const failed = template({ name: "tools", source: "build", state: "failed", error: { code: "failed", message: "run[1]: exit 2" } });
    const fake = await fakeMoatd({
      "POST /v1/templates": () => [202, template({ name: "tools", source: "build", state: "building" })],
      "GET /v1/templates/tools": () => [200, failed],
    });
    t.after(() => fake.close());
    const moat = new Moat({ baseUrl: fake.url, token: "tok" });
    t.after(() => moat.close());
    await assert.rejects(
      moat.templates.build({ name: "tools", base: "python:3.12", run: ["pip install ruff", "false"], env: { PIP_NO_CACHE_DIR: "1" } }, { pollIntervalMs: 5 }),
      (e) => {
        assert.ok(e instanceof TemplateFailedError);
        assert.equal(e.code, "failed");
        assert.match(e.message, /template tools failed: run\[1\]: exit 2/);
        assert.deepEqual(e.template, failed);
        return true;
      },
    );
    assert.deepEqual(fake.requests[0].body, {
      name: "tools",
      build: { base: "python:3.12", run: ["pip install ruff", "false"], env: { PIP_NO_CACHE_DIR: "1" } },
    });
    // A single line may be a string.
    await moat.templates.build({ name: "tools", base: "host", run: "echo hi" }, { wait: false });
    assert.deepEqual(fake.requests.at(-1).body, { name: "tools", build: { base: "host", run: ["echo hi"] } });
  });

  it("gives up waiting after waitTimeoutMs; list, get, remove and their errors", async (t) => {
    const fake = await fakeMoatd({
      "GET /v1/templates": () => [200, { templates: [template({ name: "host", source: "builtin" }), template()] }],
      "GET /v1/templates/slow": () => [200, template({ name: "slow", state: "building" })],
      "DELETE /v1/templates/python:3.12": () => [409, { error: { code: "conflict", message: "environment 3f9a1c2b7d4e uses template python:3.12" } }],
      "DELETE /v1/templates/old": () => [204, undefined],
    });
    t.after(() => fake.close());
    const moat = new Moat({ baseUrl: fake.url, token: "tok" });
    t.after(() => moat.close());
    await assert.rejects(moat.templates.wait("slow", { pollIntervalMs: 5, waitTimeoutMs: 50 }), MoatTimeoutError);
    assert.deepEqual((await moat.templates.list()).map((t) => t.name), ["host", "python:3.12"]);
    await assert.rejects(moat.templates.get("missing"), NotFoundError);
    await assert.rejects(moat.templates.remove("python:3.12"), ConflictError);
    await moat.templates.remove("old");
    assert.equal(fake.requests.at(-1).method, "DELETE");
  });
});

describe("previews (fake moatd)", () => {
  const info = { id: "3f9a1c2b7d4e", task_id: "", template: "host", state: "running", spec: {}, created_at: "", expires_at: "", labels: {}, network: "none" };

  it("getUrl posts {port, ttl_s} and returns the url; previews list and revoke", async (t) => {
    const fake = await fakeMoatd({
      "POST /v1/environments": () => [201, info],
      "POST /v1/environments/3f9a1c2b7d4e/previews": (body) =>
        body.port === 9
          ? [502, { error: { code: "port_unreachable", message: "nothing listens on port 9" } }]
          : [201, { id: "pv-1", port: body.port, url: "http://s3cret.preview.localhost:7070/", expires_at: "2026-12-03T11:00:00.000Z" }],
      "GET /v1/environments/3f9a1c2b7d4e/previews": () => [200, { previews: [{ id: "pv-1", port: 3000, expires_at: "x", created_at: "y" }] }],
      "DELETE /v1/environments/3f9a1c2b7d4e/previews/pv-1": () => [204, undefined],
    });
    t.after(() => fake.close());
    const moat = new Moat({ baseUrl: fake.url, token: "tok" });
    t.after(() => moat.close());
    const env = await moat.create();
    assert.ok(env instanceof Environment);
    assert.equal(await env.getUrl(3000, { ttlS: 600 }), "http://s3cret.preview.localhost:7070/");
    assert.deepEqual(fake.requests[1].body, { port: 3000, ttl_s: 600 });
    await env.getUrl(8080);
    assert.deepEqual(fake.requests[2].body, { port: 8080 });
    const created = await env.previews.create(3000);
    assert.equal(created.id, "pv-1");
    assert.deepEqual((await env.previews.list()).map((p) => p.port), [3000]);
    await env.previews.revoke("pv-1");
    assert.equal(fake.requests.at(-1).method, "DELETE");
    await assert.rejects(env.getUrl(9), (e) => e instanceof PortUnreachableError && e.status === 502 && e.code === "port_unreachable");
    const sent = fake.requests.length;
    await assert.rejects(env.getUrl(0), TypeError);
    await assert.rejects(env.getUrl(70000), TypeError);
    assert.equal(fake.requests.length, sent);  // refused before sending
  });
});
