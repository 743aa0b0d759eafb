// The behaviours docs/MCP.md promises on every transport, as node:test tests.
// A *.test.mjs file calls toolBehaviours(ctx) inside its describe(), with
//   ctx.kind    "stdio" | "http" | "standalone"
//   ctx.conn    the session the tests share (set in its before())
//   ctx.rest()  moatd's REST API (master token), to check what MCP did
//   ctx.fresh() a new session of the same transport (undefined: none)

import assert from "node:assert/strict";
import { it } from "node:test";

import { EmptyResultSchema, McpError } from "@modelcontextprotocol/sdk/types.js";
import Ajv from "ajv";
import Ajv2019 from "ajv/dist/2019.js";
import Ajv2020 from "ajv/dist/2020.js";

import { LATEST, describeResult, environmentOf, sleep, text, waitFor } from "./harness.mjs";

// docs/MCP.md, "Tools": each tool and the arguments it documents.
export const DOCUMENTED_TOOLS = {
  create_environment: ["template", "cpus", "ram_mb", "storage_gb", "pids", "ttl_s", "labels", "network", "permissions"],
  list_environments: [],
  destroy_environment: ["environment_id"],
  run_command: ["command", "argv", "cwd", "timeout_s", "stdin"],
  start_process: ["command", "argv", "cwd"],
  read_process_output: ["process_id", "since", "wait_s"],
  send_input: ["process_id", "input", "close"],
  kill_process: ["process_id", "signal"],
  read_file: ["path", "start_line", "end_line"],
  write_file: ["path", "content"],
  edit_file: ["path", "old_string", "new_string", "replace_all"],
  list_files: ["path"],
  search_files: ["pattern", "path", "glob"],
  set_network_policy: ["network"],
  snapshot_environment: ["name"],
  restore_environment: ["snapshot_id"],
  fork_environment: ["task_id", "labels", "ttl_s"],
  pause_environment: [],
  resume_environment: [],
};
// Arguments that are optional by the docs (so must not be "required").
const OPTIONAL = {
  create_environment: DOCUMENTED_TOOLS.create_environment,
  run_command: ["environment_id", "command", "argv", "cwd", "timeout_s", "stdin"],
  start_process: ["environment_id", "command", "argv", "cwd"],
  read_process_output: ["environment_id", "since", "wait_s"],
  send_input: ["environment_id", "close"],
  kill_process: ["environment_id", "signal"],
  read_file: ["environment_id", "start_line", "end_line"],
  write_file: ["environment_id"],
  edit_file: ["environment_id", "replace_all"],
  list_files: ["environment_id", "path"],
  search_files: ["environment_id", "path", "glob"],
  set_network_policy: ["environment_id"],
  snapshot_environment: ["environment_id", "name"],
  restore_environment: ["environment_id"],
  fork_environment: ["environment_id", "task_id", "labels", "ttl_s"],
  pause_environment: ["environment_id"],
  resume_environment: ["environment_id"],
};
// Tools about one environment take environment_id (create/list are not).
const NO_ENVIRONMENT_ID = new Set(["create_environment", "list_environments"]);

// An Ajv for the JSON Schema draft a schema declares ($schema); without one,
// MCP (2025-11-25) says 2020-12.
export function ajvFor(schema) {
  const s = schema?.$schema ?? "";
  const opts = { strict: false, allErrors: true, validateSchema: true };
  if (/draft-07|draft-06/.test(s)) return new Ajv(opts);
  if (/2019-09/.test(s)) return new Ajv2019(opts);
  if (s === "" || /2020-12/.test(s)) return new Ajv2020(opts);
  throw new Error(`a $schema this suite does not know: ${s}`);
}

export function toolBehaviours(ctx) {
  // Validators of each tool's inputSchema (filled in by the tools/list test
  // or lazily): every call's arguments are checked against them first, so a
  // schema that refuses documented arguments is caught.
  let validators;
  async function inputValidators() {
    if (validators) return validators;
    const { tools } = await ctx.conn.client.listTools();
    validators = new Map();
    for (const t of tools) {
      try {
        validators.set(t.name, ajvFor(t.inputSchema).compile(t.inputSchema));
      } catch {
        // reported by the tools/list test
      }
    }
    return validators;
  }

  // tools/call on conn (default: the shared session). `raw` skips the
  // checks (for calls meant to be errors).
  async function call(name, args = {}, { conn = ctx.conn, options, raw = false } = {}) {
    if (!raw) {
      const v = (await inputValidators()).get(name);
      if (v && !v(args)) {
        assert.fail(`${name}: these documented arguments fail its inputSchema: ${JSON.stringify(args)}: ${JSON.stringify(v.errors)}`);
      }
    }
    const result = await conn.client.callTool({ name, arguments: args }, undefined, options);
    assert.ok(Array.isArray(result.content), `${name}: a result has content: ${describeResult(result)}`);
    if (!result.isError) {
      assert.equal(typeof result.structuredContent, "object", `${name}: a result has structuredContent: ${describeResult(result)}`);
      assert.ok(text(result).length > 0, `${name}: a result has text content: ${describeResult(result)}`);
    }
    return result;
  }
  // The call must succeed (isError not true); its structuredContent.
  async function ok(name, args, opts) {
    const result = await call(name, args, opts);
    assert.ok(!result.isError, `${name}(${JSON.stringify(args)}) failed: ${describeResult(result)}`);
    return result.structuredContent;
  }
  // The call must be a tool error (isError: true, text saying why).
  async function toolError(name, args, opts) {
    const result = await call(name, args, { raw: true, ...opts });
    assert.equal(result.isError, true, `${name}(${JSON.stringify(args)}) should be isError: ${describeResult(result)}`);
    assert.ok(text(result).length > 0, `${name}: an error says why: ${describeResult(result)}`);
    return result;
  }

  // create_environment: the environment it returns (docs/MCP.md: "the
  // environment (id, state, spec)": structuredContent is it, or holds it as
  // "environment").
  async function create(args = {}, opts) {
    const e = environmentOf(await ok("create_environment", args, opts));
    assert.match(String(e?.id), /^[0-9a-f]{12}$/, `create_environment gives the environment's id: ${JSON.stringify(e)}`);
    return e;
  }

  // One environment for the tool tests (created by the first that needs it).
  let envId;
  async function env() {
    if (envId) return envId;
    const e = await create({ labels: { suite: "mcp-test", transport: ctx.kind }, cpus: 1, ram_mb: 512 });
    envId = e.id;
    return envId;
  }

  // Count of processes in the environment whose command line starts with
  // `prefix` (checked through moatd's REST exec, not through the session).
  async function processCount(environmentId, prefix) {
    const re = "^" + prefix.replace(/[.[\]\\*^$]/g, "\\$&");
    const probe = `for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < "$f"; echo; done 2>/dev/null | grep -c '${re}' || true`;
    const r = await (await ctx.rest()).call("POST", `/v1/environments/${environmentId}/exec`, { cmd: ["sh", "-c", probe], timeout_ms: 10_000 });
    assert.equal(r.status, 200, `REST exec: ${r.text}`);
    return Number(r.json.stdout.trim());
  }

  it("initialize negotiates the latest protocol version and announces tools and resources", { timeout: 30_000 }, () => {
    const init = ctx.conn.received.find((m) => m.result?.protocolVersion);
    assert.ok(init, "the initialize answer was seen");
    assert.equal(init.result.protocolVersion, LATEST);
    assert.equal(typeof init.result.serverInfo?.name, "string");
    assert.equal(typeof init.result.serverInfo?.version, "string");
    const caps = ctx.conn.client.getServerCapabilities();
    assert.ok(caps?.tools, `tools capability: ${JSON.stringify(caps)}`);
    assert.ok(caps?.resources, `resources capability: ${JSON.stringify(caps)}`);
  });

  it("ping is answered", { timeout: 30_000 }, async () => {
    assert.deepEqual(await ctx.conn.client.ping(), {});
  });

  it("tools/list lists the documented tools, each with a valid JSON Schema taking the documented arguments", { timeout: 30_000 }, async () => {
    const { tools } = await ctx.conn.client.listTools();
    const names = tools.map((t) => t.name).sort();
    assert.deepEqual(names, Object.keys(DOCUMENTED_TOOLS).sort(), "exactly the tools of docs/MCP.md");
    const problems = [];
    for (const t of tools) {
      const schema = t.inputSchema;
      if (schema?.type !== "object") {
        problems.push(`${t.name}: inputSchema.type is not "object"`);
        continue;
      }
      let ajv;
      try {
        ajv = ajvFor(schema);
      } catch (e) {
        problems.push(`${t.name}: ${e.message}`);
        continue;
      }
      if (!ajv.validateSchema(schema)) {
        problems.push(`${t.name}: inputSchema fails its meta-schema: ${ajv.errorsText(ajv.errors)}`);
      }
      try {
        ajv.compile(schema);
      } catch (e) {
        problems.push(`${t.name}: inputSchema does not compile: ${e.message}`);
      }
      if (t.outputSchema) {
        const ajvOut = ajvFor(t.outputSchema);
        if (!ajvOut.validateSchema(t.outputSchema)) problems.push(`${t.name}: outputSchema fails its meta-schema: ${ajvOut.errorsText(ajvOut.errors)}`);
      }
      const props = schema.properties ?? {};
      const required = schema.required ?? [];
      const expected = [...(DOCUMENTED_TOOLS[t.name] ?? [])];
      if (!NO_ENVIRONMENT_ID.has(t.name)) expected.push("environment_id");
      for (const p of new Set(expected)) {
        if (!(p in props)) problems.push(`${t.name}: the documented argument ${p} is missing`);
      }
      for (const p of OPTIONAL[t.name] ?? []) {
        if (required.includes(p)) problems.push(`${t.name}: ${p} is optional by docs/MCP.md but required`);
      }
    }
    const destroy = tools.find((t) => t.name === "destroy_environment");
    if (destroy && !(destroy.inputSchema.required ?? []).includes("environment_id")) {
      problems.push("destroy_environment: environment_id is not required");
    }
    assert.deepEqual(problems, []);
  });

  it("every tool and every argument of its inputSchema has a description", { timeout: 30_000 }, async () => {
    const { tools } = await ctx.conn.client.listTools();
    const missing = [];
    for (const t of tools) {
      if (typeof t.description !== "string" || t.description.trim().length < 10) missing.push(t.name);
      for (const [p, s] of Object.entries(t.inputSchema?.properties ?? {})) {
        if (typeof s?.description !== "string" || s.description.trim() === "") missing.push(`${t.name}.${p}`);
      }
    }
    assert.deepEqual(missing, [], "these have no description");
  });

  it("create_environment creates a running environment that list_environments and REST show", { timeout: 30_000 }, async () => {
    const e = await create({
      template: "host",
      cpus: 0.5,
      ram_mb: 256,
      ttl_s: 600,
      labels: { suite: "mcp-test", case: "create" },
    });
    assert.match(e.id, /^[0-9a-f]{12}$/);
    assert.equal(e.state, "running");
    assert.equal(e.spec?.cpus, 0.5);
    assert.equal(e.spec?.ram_mb, 256);
    const viaRest = await (await ctx.rest()).environment(e.id);
    assert.equal(viaRest?.state, "running");
    assert.deepEqual(viaRest.labels, { suite: "mcp-test", case: "create" });
    const listed = await ok("list_environments", {});
    assert.ok(JSON.stringify(listed).includes(e.id), `list_environments shows ${e.id}: ${JSON.stringify(listed)}`);
    await ok("destroy_environment", { environment_id: e.id });
  });

  it("run_command runs a shell command: echo hi gives stdout hi and exit code 0", { timeout: 30_000 }, async () => {
    const r = await call("run_command", { environment_id: await env(), command: "echo hi" });
    assert.ok(!r.isError, describeResult(r));
    const s = r.structuredContent;
    assert.equal(s.stdout, "hi\n");
    assert.equal(s.stderr, "");
    assert.equal(s.exit_code, 0);
    assert.equal(s.timed_out, false);
    assert.equal(typeof s.duration_ms, "number");
    assert.match(text(r), /hi/);
  });

  it("run_command: a command that fails is a normal result with its exit code, not isError", { timeout: 30_000 }, async () => {
    const r = await call("run_command", { environment_id: await env(), command: "echo oops >&2; exit 3" });
    assert.notEqual(r.isError, true, describeResult(r));
    assert.equal(r.structuredContent.exit_code, 3);
    assert.equal(r.structuredContent.stderr, "oops\n");
  });

  it("run_command takes argv, cwd (default /workspace) and stdin", { timeout: 30_000 }, async () => {
    const id = await env();
    assert.equal((await ok("run_command", { environment_id: id, argv: ["pwd"] })).stdout, "/workspace\n");
    assert.equal((await ok("run_command", { environment_id: id, argv: ["pwd"], cwd: "/tmp" })).stdout, "/tmp\n");
    // argv is not run by a shell: $HOME stays literal
    assert.equal((await ok("run_command", { environment_id: id, argv: ["echo", "$HOME", "a b"] })).stdout, "$HOME a b\n");
    assert.equal((await ok("run_command", { environment_id: id, command: "tr a-z A-Z", stdin: "piped in\n" })).stdout, "PIPED IN\n");
  });

  it("run_command: timeout_s stops the command and says timed_out", { timeout: 30_000 }, async () => {
    const t0 = Date.now();
    const r = await call("run_command", { environment_id: await env(), command: "sleep 20", timeout_s: 1 });
    assert.equal(r.structuredContent?.timed_out, true, describeResult(r));
    assert.ok(Date.now() - t0 < 10_000, `took ${Date.now() - t0} ms`);
  });

  it("run_command caps each stream at 32 KiB, keeping the first 8 KiB and the last 24 KiB", { timeout: 30_000 }, async () => {
    // seq 1 30000: 168,894 bytes
    const s = await ok("run_command", { environment_id: await env(), command: "seq 1 30000" });
    assert.equal(s.exit_code, 0);
    const full = Array.from({ length: 30000 }, (_, i) => `${i + 1}\n`).join("");
    assert.ok(s.stdout.length <= 32 * 1024 + 200, `stdout is ${s.stdout.length} bytes`);
    assert.ok(s.stdout.startsWith(full.slice(0, 8 * 1024)), "the first 8 KiB are kept");
    assert.ok(s.stdout.endsWith(full.slice(-24 * 1024)), "the last 24 KiB are kept");
    const middle = s.stdout.slice(8 * 1024, s.stdout.length - 24 * 1024);
    assert.match(middle, new RegExp(String(full.length - 32 * 1024)), `the line in between says how many bytes were left out: ${JSON.stringify(middle)}`);
  });

  it("run_command with bad arguments is a tool error, not a JSON-RPC error", { timeout: 30_000 }, async () => {
    const id = await env();
    await toolError("run_command", { environment_id: id }); // neither command nor argv
    await toolError("run_command", { environment_id: id, command: "true", timeout_s: 4000 }); // above 3600
    await toolError("run_command", { environment_id: "000000000000", command: "true" }); // no such environment
  });

  it("write_file creates parents; read_file reads it back, whole and by line range", { timeout: 30_000 }, async () => {
    const id = await env();
    const content = "one\ntwo\nthree\nfour\nfive\n";
    const w = await ok("write_file", { environment_id: id, path: "/workspace/deep/er/f.txt", content });
    assert.ok(JSON.stringify(w).includes(String(Buffer.byteLength(content))), `bytes written: ${JSON.stringify(w)}`);
    assert.equal(text(await call("read_file", { environment_id: id, path: "/workspace/deep/er/f.txt" })), content);
    assert.equal(text(await call("read_file", { environment_id: id, path: "/workspace/deep/er/f.txt", start_line: 2, end_line: 4 })), "two\nthree\nfour\n");
    assert.equal(text(await call("read_file", { environment_id: id, path: "/workspace/deep/er/f.txt", start_line: 4 })), "four\nfive\n");
    assert.equal(text(await call("read_file", { environment_id: id, path: "/workspace/deep/er/f.txt", end_line: 1 })), "one\n");
    // what write_file wrote is what a command sees
    assert.equal((await ok("run_command", { environment_id: id, command: "wc -l < deep/er/f.txt" })).stdout.trim(), "5");
  });

  it("read_file returns at most 256 KiB", { timeout: 30_000 }, async () => {
    const id = await env();
    // 342,858 bytes: lines "00000\n".."57142\n"
    await ok("run_command", { environment_id: id, command: "seq -w 0 57142 > /workspace/big.txt" });
    const t = text(await call("read_file", { environment_id: id, path: "/workspace/big.txt" }));
    assert.ok(t.length <= 256 * 1024 + 200, `read_file gave ${t.length} bytes`);
    assert.ok(t.startsWith("00000\n00001\n"), t.slice(0, 40));
    // a line range far into the file still works
    assert.equal(text(await call("read_file", { environment_id: id, path: "/workspace/big.txt", start_line: 50001, end_line: 50002 })), "50000\n50001\n");
  });

  it("read_file of a missing file is a tool error", { timeout: 30_000 }, async () => {
    const r = await toolError("read_file", { environment_id: await env(), path: "/workspace/no/such/file" });
    assert.match(text(r), /no such|not found|does not exist|ENOENT/i);
  });

  it("edit_file replaces exactly old_string; missing or ambiguous old_string is a tool error", { timeout: 30_000 }, async () => {
    const id = await env();
    const path = "/workspace/edit.py";
    await ok("write_file", { environment_id: id, path, content: "x = 1\ny = 2\nx = 1\nz = 3\n" });
    await ok("edit_file", { environment_id: id, path, old_string: "y = 2\n", new_string: "y = 20\n" });
    assert.equal(text(await call("read_file", { environment_id: id, path })), "x = 1\ny = 20\nx = 1\nz = 3\n");
    // missing
    const missing = await toolError("edit_file", { environment_id: id, path, old_string: "w = 9", new_string: "w = 0" });
    assert.match(text(missing), /not found|missing|no match|does not (contain|occur|appear)/i);
    // found twice without replace_all
    await toolError("edit_file", { environment_id: id, path, old_string: "x = 1", new_string: "x = 5" });
    assert.equal(text(await call("read_file", { environment_id: id, path })), "x = 1\ny = 20\nx = 1\nz = 3\n", "a failed edit changes nothing");
    // exact, not a regular expression
    await toolError("edit_file", { environment_id: id, path, old_string: "z = .", new_string: "z = 4" });
    await ok("edit_file", { environment_id: id, path, old_string: "x = 1", new_string: "x = 5", replace_all: true });
    assert.equal(text(await call("read_file", { environment_id: id, path })), "x = 5\ny = 20\nx = 5\nz = 3\n");
  });

  it("list_files lists entries with type and size", { timeout: 30_000 }, async () => {
    const id = await env();
    await ok("write_file", { environment_id: id, path: "/workspace/ls/a.txt", content: "12345" });
    await ok("write_file", { environment_id: id, path: "/workspace/ls/sub/b.txt", content: "b" });
    const s = await ok("list_files", { environment_id: id, path: "/workspace/ls" });
    const entries = s.entries;
    assert.ok(Array.isArray(entries), `entries: ${JSON.stringify(s)}`);
    const a = entries.find((e) => e.name === "a.txt");
    const sub = entries.find((e) => e.name === "sub");
    assert.ok(a && sub, JSON.stringify(entries));
    assert.equal(a.type, "file");
    assert.equal(a.size, 5);
    assert.match(sub.type, /^dir/);
    assert.match(text(await call("list_files", { environment_id: id, path: "/workspace/ls" })), /a\.txt/);
    // default path: /workspace
    const top = await ok("list_files", { environment_id: id });
    assert.ok(top.entries.some((e) => e.name === "ls"), JSON.stringify(top));
  });

  it("search_files finds matching lines as file:line:text, filtered by glob", { timeout: 30_000 }, async () => {
    const id = await env();
    await ok("write_file", { environment_id: id, path: "/workspace/srch/a.py", content: "import os\nneedle = 42\n" });
    await ok("write_file", { environment_id: id, path: "/workspace/srch/b.txt", content: "a needle too\n" });
    const all = text(await call("search_files", { environment_id: id, pattern: "nee+dle", path: "/workspace/srch" }));
    assert.match(all, /(^|\n)(\/workspace\/srch\/)?a\.py:2:needle = 42(\n|$)/, all);
    assert.match(all, /(^|\n)(\/workspace\/srch\/)?b\.txt:1:a needle too(\n|$)/, all);
    const py = text(await call("search_files", { environment_id: id, pattern: "needle", path: "/workspace/srch", glob: "*.py" }));
    assert.match(py, /a\.py:2:needle = 42/, py);
    assert.doesNotMatch(py, /b\.txt/, py);
    // default path /workspace
    const def = text(await call("search_files", { environment_id: id, pattern: "^needle = 42$" }));
    assert.match(def, /srch\/a\.py:2:needle = 42/, def);
  });

  it("search_files gives at most 200 matching lines", { timeout: 30_000 }, async () => {
    const id = await env();
    await ok("run_command", { environment_id: id, command: "mkdir -p /workspace/many && seq 1 300 | sed 's/^/hit /' > /workspace/many/m.txt" });
    const t = text(await call("search_files", { environment_id: id, pattern: "^hit", path: "/workspace/many" }));
    const hits = t.split("\n").filter((l) => /m\.txt:\d+:hit \d+$/.test(l));
    assert.ok(hits.length > 0 && hits.length <= 200, `${hits.length} matching lines`);
  });

  it("start_process, read_process_output, send_input and kill_process drive a background process", { timeout: 30_000 }, async () => {
    const id = await env();
    const started = await ok("start_process", {
      environment_id: id,
      command: "echo ready; read line; echo got:$line; sleep 60",
    });
    const pid = started.process_id;
    assert.ok(pid !== undefined && pid !== null && pid !== "", JSON.stringify(started));
    // read_process_output answers stdout and stderr (src/mcp/tools.cc), each a string.
    const outputOf = (s) => {
      assert.equal(typeof s.stdout, "string", JSON.stringify(s));
      assert.equal(typeof s.stderr, "string", JSON.stringify(s));
      return s.stdout + s.stderr;
    };

    let since = 0;
    let seen = "";
    const readUntil = async (pred, ms = 10_000) => {
      const end = Date.now() + ms;
      for (;;) {
        const s = await ok("read_process_output", { environment_id: id, process_id: pid, since, wait_s: 2 });
        assert.equal(typeof s.next, "number", JSON.stringify(s));
        seen += outputOf(s);
        since = s.next;
        if (pred(s)) return s;
        assert.ok(Date.now() < end, `waited ${ms} ms; output so far ${JSON.stringify(seen)}, last ${JSON.stringify(s)}`);
      }
    };
    const first = await readUntil(() => seen.includes("ready\n"));
    assert.equal(first.state, "running");
    await ok("send_input", { environment_id: id, process_id: pid, input: "hello\n" });
    await readUntil(() => seen.includes("got:hello\n"));
    // reading again from the start gives everything
    const again = await ok("read_process_output", { environment_id: id, process_id: pid, since: 0 });
    assert.equal(outputOf(again), "ready\ngot:hello\n");
    await ok("kill_process", { environment_id: id, process_id: pid });
    const end = await readUntil((s) => s.state !== "running");
    assert.notEqual(end.state, "running");
  });

  it("kill_process sends TERM by default, and the signal asked for", { timeout: 30_000 }, async () => {
    const id = await env();
    // ignores TERM: only KILL ends it
    const { process_id } = await ok("start_process", { environment_id: id, command: "trap '' TERM; echo armed; while :; do sleep 0.1; done" });
    assert.ok(await waitFor(async () => {
      const r = await ok("read_process_output", { environment_id: id, process_id, wait_s: 1 });
      assert.equal(typeof r.stdout, "string", JSON.stringify(r));
      return r.stdout.includes("armed");
    }, 10_000), "the process started");
    await ok("kill_process", { environment_id: id, process_id });
    await sleep(500);
    assert.equal((await ok("read_process_output", { environment_id: id, process_id })).state, "running", "TERM was ignored");
    await ok("kill_process", { environment_id: id, process_id, signal: "KILL" });
    const s = await waitFor(async () => {
      const r = await ok("read_process_output", { environment_id: id, process_id, wait_s: 1 });
      return r.state !== "running" && r;
    }, 10_000);
    assert.ok(s, "KILL ended it");
  });

  it("send_input with close ends the process's stdin; read_process_output reports the exit code", { timeout: 30_000 }, async () => {
    const id = await env();
    const { process_id } = await ok("start_process", { environment_id: id, argv: ["sh", "-c", "cat; exit 4"] });
    await ok("send_input", { environment_id: id, process_id, input: "abc", close: true });
    const s = await waitFor(async () => {
      const r = await ok("read_process_output", { environment_id: id, process_id, wait_s: 2 });
      return r.state !== "running" && r;
    }, 15_000);
    assert.ok(s, "the process ended after its stdin was closed");
    assert.equal(s.stdout, "abc");
    assert.equal(s.exit_code, 4);
  });

  it("a command the environment's permissions deny is a tool error reading 'denied by policy'", { timeout: 30_000 }, async () => {
    const e = await create({
      permissions: { run_command: [{ match: ["rm", "*"], action: "deny" }, { action: "allow" }] },
    });
    const r = await toolError("run_command", { environment_id: e.id, argv: ["rm", "-rf", "/workspace"] });
    assert.match(text(r), /^denied by policy/);
    assert.match(text(r), /rm/, "the denial names the rule");
    // nothing was removed, and what is allowed still runs
    assert.equal((await ok("run_command", { environment_id: e.id, argv: ["ls", "-d", "/workspace"] })).stdout, "/workspace\n");
    await ok("destroy_environment", { environment_id: e.id });
  });

  it("an 'ask' permission waits for a person's decision, with progress notifications, then runs", { timeout: 30_000 }, async () => {
    const e = await create({
      permissions: { run_command: [{ match: ["echo", "ask-me"], action: "ask" }, { action: "allow" }] },
    });
    const rest = await ctx.rest();
    const progress = [];
    const pending = call("run_command", { environment_id: e.id, argv: ["echo", "ask-me"] }, {
      options: { timeout: 1500, resetTimeoutOnProgress: true, onprogress: (p) => progress.push(p) },
    });
    pending.catch(() => {});
    const approval = await waitFor(async () => {
      const r = await rest.call("GET", `/v1/approvals?state=pending&environment=${e.id}`);
      return r.json?.approvals?.[0];
    }, 10_000);
    assert.ok(approval, "a pending approval appears");
    assert.deepEqual(approval.action?.argv, ["echo", "ask-me"]);
    // two, about a second apart: the 1.5 s timeout has passed once at least
    assert.ok(await waitFor(() => progress.length >= 2, 5_000), `progress while waiting: ${JSON.stringify(progress)}`);
    const decided = await rest.call("POST", `/v1/approvals/${approval.id}`, { decision: "approve", reason: "test" });
    assert.equal(decided.status, 200, decided.text);
    const r = await pending;
    assert.ok(!r.isError, describeResult(r));
    assert.equal(r.structuredContent.stdout, "ask-me\n");
    await ok("destroy_environment", { environment_id: e.id });
  });

  it("a command longer than the request timeout completes, kept alive by progress notifications", { timeout: 30_000 }, async () => {
    const progress = [];
    const t0 = Date.now();
    const r = await call("run_command", { environment_id: await env(), command: "sleep 3; echo done" }, {
      options: { timeout: 1500, resetTimeoutOnProgress: true, onprogress: (p) => progress.push(p) },
    });
    assert.ok(!r.isError, describeResult(r));
    assert.equal(r.structuredContent.stdout, "done\n");
    assert.ok(Date.now() - t0 >= 3000);
    assert.ok(progress.length >= 1, "at least one progress notification");
    for (let i = 1; i < progress.length; i++) {
      assert.ok(progress[i].progress > progress[i - 1].progress, `progress increases: ${JSON.stringify(progress)}`);
    }
  });

  it("cancelling a run_command (AbortSignal) returns at once and kills the command; the session keeps serving", { timeout: 30_000 }, async () => {
    const id = await env();
    const ac = new AbortController();
    const pending = call("run_command", { environment_id: id, argv: ["sleep", "30.25"] }, { options: { signal: ac.signal, timeout: 60_000 } });
    pending.catch(() => {});
    assert.ok(await waitFor(async () => (await processCount(id, "sleep 30.25")) === 1, 10_000), "the command runs");
    const t0 = Date.now();
    ac.abort("test cancels");
    await assert.rejects(pending);
    assert.ok(Date.now() - t0 < 2000, "the call returns promptly");
    assert.ok(await waitFor(async () => (await processCount(id, "sleep 30.25")) === 0, 5_000), "the command is gone after the cancel");
    assert.equal((await ok("run_command", { environment_id: id, command: "echo still here" })).stdout, "still here\n");
  });

  it("set_network_policy sets the network policy and reports it", { timeout: 30_000 }, async () => {
    const id = await env();
    const s = await ok("set_network_policy", {
      environment_id: id,
      network: { mode: "allowlist", allow: [{ host: "example.com", ports: [443] }] },
    });
    assert.match(JSON.stringify(s), /example\.com/, JSON.stringify(s));
    const viaRest = await (await ctx.rest()).call("GET", `/v1/environments/${id}/network`);
    assert.equal(viaRest.status, 200, viaRest.text);
    assert.match(JSON.stringify(viaRest.json.network), /example\.com/);
    const none = await ok("set_network_policy", { environment_id: id, network: "none" });
    assert.match(JSON.stringify(none), /"none"/, JSON.stringify(none));
    await toolError("set_network_policy", { environment_id: id, network: { mode: "no-such-mode" } });
  });

  it("pause_environment stops its processes and refuses commands; resume_environment lets them go on", { timeout: 30_000 }, async () => {
    const id = await env();
    await ok("start_process", { environment_id: id, command: "i=0; while :; do i=$((i+1)); echo $i > /workspace/n.tmp; mv /workspace/n.tmp /workspace/n; done" });
    const count = async () => {
      const r = await call("read_file", { environment_id: id, path: "/workspace/n" }, { raw: true });
      return r.isError ? 0 : Number(text(r)) || 0;
    };
    assert.ok(await waitFor(async () => (await count()) > 0, 10_000), "the counter counts");
    const paused = await ok("pause_environment", { environment_id: id });
    assert.equal(paused.state, "paused", JSON.stringify(paused));
    const at = await count();
    await new Promise((r) => setTimeout(r, 300)); // stillness can only be seen over a span of time
    assert.equal(await count(), at, "a paused process ran");
    const refused = await toolError("run_command", { environment_id: id, command: "true" });
    assert.match(JSON.stringify(refused), /is paused: resume it/);
    const resumed = await ok("resume_environment", { environment_id: id });
    assert.equal(resumed.state, "running", JSON.stringify(resumed));
    assert.ok(await waitFor(async () => (await count()) > at, 10_000), "the counter goes on after the resume");
  });

  it("snapshot_environment saves the files, restore_environment puts them back, fork_environment copies them", { timeout: 60_000 }, async () => {
    const rest = await ctx.rest();
    const e = await create({ labels: { suite: "mcp-test", transport: ctx.kind } });
    await ok("write_file", { environment_id: e.id, path: "/workspace/state.txt", content: "v1\n" });
    const snap = await ok("snapshot_environment", { environment_id: e.id, name: "v1" });
    assert.match(String(snap?.id), /^snap-[0-9a-f]{12}$/, JSON.stringify(snap));
    await ok("write_file", { environment_id: e.id, path: "/workspace/state.txt", content: "v2\n" });
    await ok("write_file", { environment_id: e.id, path: "/workspace/later.txt", content: "later\n" });
    await ok("restore_environment", { environment_id: e.id, snapshot_id: snap.id });
    assert.equal((await ok("run_command", { environment_id: e.id, command: "cat state.txt; ls later.txt 2>&1 | grep -c 'No such'" })).stdout, "v1\n1\n");
    const fork = environmentOf(await ok("fork_environment", { environment_id: e.id, task_id: "branch" }));
    assert.match(String(fork?.id), /^[0-9a-f]{12}$/, JSON.stringify(fork));
    assert.notEqual(fork.id, e.id);
    await ok("write_file", { environment_id: fork.id, path: "/workspace/state.txt", content: "fork\n" });
    assert.equal((await ok("run_command", { environment_id: e.id, command: "cat state.txt" })).stdout, "v1\n", "the original is untouched");
    assert.equal((await ok("run_command", { environment_id: fork.id, command: "cat state.txt" })).stdout, "fork\n");
    // A snapshot that does not exist, or an id that could be a path: tool errors.
    await toolError("restore_environment", { environment_id: e.id, snapshot_id: "snap-000000000000" });
    const bad = await call("restore_environment", { environment_id: e.id, snapshot_id: "../../etc" }, { raw: true }).catch((err) => ({ isError: true, content: [{ type: "text", text: String(err) }] }));
    assert.equal(bad.isError, true, describeResult(bad));
    for (const id of [fork.id, e.id]) assert.equal((await rest.call("DELETE", `/v1/environments/${id}`)).status, 204);
    assert.equal((await rest.call("DELETE", `/v1/snapshots/${snap.id}`)).status, 204);
  });

  it("destroy_environment destroys it; later calls on it are tool errors", { timeout: 30_000 }, async () => {
    const e = await create({});
    await ok("destroy_environment", { environment_id: e.id });
    assert.ok(await (await ctx.rest()).isGone(e.id), "REST sees it gone");
    const r = await toolError("run_command", { environment_id: e.id, command: "true" });
    assert.match(text(r), new RegExp(`${e.id}|not found|gone|no such`, "i"));
  });

  it("without environment_id the session's default environment is created on first use and reused", { timeout: 30_000 }, async () => {
    const rest = await ctx.rest();
    const before = await rest.runningIds();
    await ok("write_file", { path: "/workspace/default.txt", content: "default env\n" });
    const after = await rest.runningIds();
    const created = [...after].filter((id) => !before.has(id));
    assert.equal(created.length, 1, `one default environment was created: ${JSON.stringify(created)}`);
    const d = await rest.environment(created[0]);
    assert.equal(d.template, "host");
    assert.equal((await ok("run_command", { command: "cat /workspace/default.txt" })).stdout, "default env\n");
    assert.equal(text(await call("read_file", { path: "/workspace/default.txt" })), "default env\n");
    assert.deepEqual(await rest.runningIds(), after, "no other environment was created");
    // the network of the default environment is none
    const net = await rest.call("GET", `/v1/environments/${created[0]}/network`);
    assert.equal(net.json?.network?.mode, "none", net.text);
  });

  if (ctx.fresh) {
    it("ending the session destroys its default environment; environments it created outlive it", { timeout: 30_000 }, async () => {
      const rest = await ctx.rest();
      const conn = await ctx.fresh();
      let closed = false;
      try {
        const before = await rest.runningIds();
        await ok("run_command", { command: "echo default" }, { conn });
        const defaults = [...(await rest.runningIds())].filter((id) => !before.has(id));
        assert.equal(defaults.length, 1, JSON.stringify(defaults));
        const kept = await create({ labels: { suite: "mcp-test", case: "outlives" } }, { conn });
        await conn.close();
        closed = true;
        assert.ok(await waitFor(() => rest.isGone(defaults[0]), 15_000), `the default environment ${defaults[0]} is destroyed`);
        assert.equal((await rest.environment(kept.id))?.state, "running", "the created environment outlives the session");
        await rest.call("DELETE", `/v1/environments/${kept.id}`);
      } finally {
        if (!closed) await conn.close().catch(() => {});
      }
    });
  }

  it("resources/list lists each environment's state and events; resources/read reads them", { timeout: 30_000 }, async () => {
    const id = await env();
    const { resources } = await ctx.conn.client.listResources();
    const uris = resources.map((r) => r.uri);
    assert.ok(uris.includes(`moat://environments/${id}`), JSON.stringify(uris));
    assert.ok(uris.includes(`moat://environments/${id}/events`), JSON.stringify(uris));
    for (const r of resources) assert.equal(typeof r.name, "string");

    const state = await ctx.conn.client.readResource({ uri: `moat://environments/${id}` });
    assert.equal(state.contents.length, 1);
    assert.equal(state.contents[0].uri, `moat://environments/${id}`);
    assert.equal(state.contents[0].mimeType, "application/json");
    const e = JSON.parse(state.contents[0].text);
    assert.equal(e.id, id);
    assert.equal(e.state, "running");

    const events = await ctx.conn.client.readResource({ uri: `moat://environments/${id}/events` });
    assert.equal(events.contents[0].mimeType, "application/json");
    const ev = JSON.parse(events.contents[0].text);
    assert.ok(JSON.stringify(ev).includes(id), `the events are this environment's: ${events.contents[0].text.slice(0, 500)}`);

    await assert.rejects(ctx.conn.client.readResource({ uri: "moat://environments/000000000000" }), McpError);
  });

  it("an unknown tool or method is a JSON-RPC error, and the server keeps serving", { timeout: 30_000 }, async () => {
    await assert.rejects(ctx.conn.client.callTool({ name: "no_such_tool", arguments: {} }), McpError);
    await assert.rejects(
      ctx.conn.client.request({ method: "no/such_method", params: {} }, EmptyResultSchema),
      (e) => e instanceof McpError && e.code === -32601,
    );
    assert.deepEqual(await ctx.conn.client.ping(), {});
  });

  return {
    async cleanup() {
      if (envId) await ctx.conn?.client.callTool({ name: "destroy_environment", arguments: { environment_id: envId } }).catch(() => {});
    },
  };
}

