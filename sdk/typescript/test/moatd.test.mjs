// The SDK against a real moatd (started here; needs root, like moatd).

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import {
  ConflictError,
  FileError,
  ForbiddenError,
  InvalidRequestError,
  Moat,
  MoatConnectionError,
  MoatTimeoutError,
  NotFoundError,
  UnauthorizedError,
} from "../dist/index.js";
import { startMoatd } from "./moatd.mjs";

const root = process.getuid?.() === 0;
const skip = root ? false : "needs root (moatd creates namespaces, cgroups and mounts)";

describe("against a real moatd", { skip }, () => {
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

  async function newEnv(request = {}) {
    // Every environment goes when moatd stops (SIGTERM destroys them).
    return client.environments.create({ task_id: "sdk-test", ...request });
  }

  it("runs the seed's example end to end (over the unix socket)", async () => {
    process.env.MOAT_TOKEN = moatd.token;  // the token defaults to $MOAT_TOKEN
    const client = new Moat({ baseUrl: moatd.unixUrl });
    delete process.env.MOAT_TOKEN;
    const health = await client.health();
    assert.equal(health.status, "ok");
    assert.equal(typeof health.microvm.available, "boolean");

    const taskId = "42";
    const env = await client.environments.create({
      task_id: `agent-task-${taskId}`,
      spec: { cpus: 2, ram_mb: 2048, storage_gb: 10 },
    });
    assert.equal(env.state, "running");
    assert.deepEqual(env.spec, { cpus: 2, ram_mb: 2048, storage_gb: 10, pids: 1024, isolation: "namespaces" });

    await client.environments.files.write(
      env.id,
      "/workspace/solve.py",
      "import sys\nprint(open(sys.argv[2]).read().upper(), end='')\nsys.exit(3)\n",
    );
    await client.environments.files.write(env.id, "/workspace/input.txt", "forty-two\n");
    const inputPath = "/workspace/input.txt";
    const result = await client.environments.exec(env.id, {
      cmd: ["python3", "solve.py", "--input", inputPath],
      cwd: "/workspace",
      timeout_ms: 30_000,
    });
    assert.equal(result.exit_code, 3);
    assert.equal(result.stdout, "FORTY-TWO\n");
    assert.equal(result.stderr, "");
    assert.equal(result.timed_out, false);
    assert.deepEqual(result.stdout_raw, Buffer.from("FORTY-TWO\n"));

    const proc = await client.environments.processes.start(env.id, {
      cmd: ["sh", "-c", "for i in 1 2 3 4 5; do echo line $i; sleep 0.05; done; echo oops >&2; exit 7"],
    });
    assert.equal(proc.state, "running");
    let text = "";
    let stderr = "";
    const events = [];
    for await (const chunk of proc.output({ follow: true })) {
      events.push(chunk.type);
      if (chunk.type === "output") {
        if (chunk.stream === "stdout") text += chunk.data.toString();
        else stderr += chunk.data.toString();
      }
    }
    assert.equal(text, "line 1\nline 2\nline 3\nline 4\nline 5\n");
    assert.equal(stderr, "oops\n");
    assert.equal(events.at(-1), "exit");
    await proc.refresh();
    assert.equal(proc.state, "exited");
    assert.equal(proc.exit_code, 7);

    const listed = await client.environments.list({ task_id: `agent-task-${taskId}` });
    assert.deepEqual(listed.map((e) => e.id), [env.id]);

    await client.environments.destroy(env.id);
    await client.environments.destroy(env.id);  // idempotent
    const gone = await client.environments.get(env.id);
    assert.equal(gone.state, "gone");
    assert.equal(gone.reason, "destroyed");
    client.close();
  });

  it("lists with filters, sets the TTL, serves metrics", async () => {
    const a = await newEnv({ labels: { team: "search", tier: "1" } });
    const b = await newEnv({ labels: { team: "search" } });
    const both = await client.environments.list({ labels: { team: "search" } });
    assert.deepEqual(both.map((e) => e.id).sort(), [a.id, b.id].sort());
    const one = await client.environments.list({ labels: { team: "search", tier: "1" } });
    assert.deepEqual(one.map((e) => e.id), [a.id]);
    assert.deepEqual(await client.environments.list({ task_id: "nobody" }), []);

    const before = Date.parse(a.expires_at);
    const updated = await client.environments.setTimeout(a.id, 60);
    assert.ok(Date.parse(updated.expires_at) < before);
    assert.equal((await client.environments.get(a.id)).expires_at, updated.expires_at);
    const stats = await client.environments.stats(a.id);
    assert.equal(stats.id, a.id);
    assert.ok(stats.pids >= 1 && stats.memory_bytes > 0, JSON.stringify(stats));
    assert.equal(stats.memory_limit_bytes, a.spec.ram_mb * 1024 * 1024);

    const metrics = await client.metrics();
    assert.match(metrics, /^moat_environments\{state="running"\} \d+$/m);
    assert.match(metrics, /^moat_exec_total \d+$/m);
    await client.environments.destroy(b.id);
    assert.deepEqual((await client.environments.list({ labels: { team: "search" } })).map((e) => e.id), [a.id]);
    assert.ok((await client.environments.list({ state: "gone" })).some((e) => e.id === b.id));
  });

  it("exec returns non-UTF-8 output exactly and sends binary stdin", async () => {
    const env = await newEnv();
    const bytes = Buffer.from([0xff, 0xfe, 0x00, 0x61, 0x80, 0x0a]);
    const r = await client.environments.exec(env.id, { cmd: ["printf", "\\377\\376\\000a\\200\\n"] });
    assert.equal(r.exit_code, 0);
    assert.equal(r.encoding, "base64");
    assert.deepEqual(r.stdout_raw, bytes);
    assert.equal(r.stdout, bytes.toString("utf8"));  // lossy text; the raw bytes are exact
    assert.deepEqual(r.stderr_raw, Buffer.alloc(0));

    const all = Buffer.from(Array.from({ length: 256 }, (_, i) => i));
    const echoed = await client.environments.exec(env.id, { cmd: ["cat"], stdin: all });
    assert.deepEqual(echoed.stdout_raw, all);

    const forced = await client.environments.exec(env.id, { cmd: ["echo", "plain"], encoding: "base64", stdin: "ignored" });
    assert.equal(forced.encoding, "base64");
    assert.equal(forced.stdout, "plain\n");

    const timedOut = await client.environments.exec(env.id, { cmd: ["sleep", "5"], timeout_ms: 200 });
    assert.equal(timedOut.timed_out, true);
    assert.equal(timedOut.exit_code, 137);

    const missing = await client.environments.exec(env.id, { cmd: ["no-such-command"] });
    assert.equal(missing.exit_code, 127);
    assert.match(missing.stderr, /command not found/);
  });

  it("round-trips files", async () => {
    const env = await newEnv();
    const files = client.environments.files;
    const binary = Buffer.from(Array.from({ length: 70_000 }, (_, i) => (i * 7) & 0xff));
    await files.write(env.id, "/workspace/a/b/data.bin", binary);
    assert.deepEqual(await files.read(env.id, "/workspace/a/b/data.bin"), binary);
    assert.deepEqual(await files.read(env.id, "/workspace/a/b/data.bin", { offset: 10, length: 5 }), binary.subarray(10, 15));

    await files.write(env.id, "/workspace/notes.txt", "héllo\n", { mode: 0o640 });
    await files.write(env.id, "/workspace/notes.txt", "wörld\n", { append: true });
    assert.equal(await files.readText(env.id, "/workspace/notes.txt"), "héllo\nwörld\n");
    assert.equal(await files.read(env.id, "/workspace/notes.txt", { encoding: "utf8" }), "héllo\nwörld\n");
    const st = await files.stat(env.id, "/workspace/notes.txt");
    assert.equal(st.type, "file");
    assert.equal(st.size, Buffer.byteLength("héllo\nwörld\n"));
    assert.equal(st.mode, 0o640);

    await files.mkdir(env.id, "/workspace/x/y/z", { parents: true });
    await files.move(env.id, "/workspace/notes.txt", "/workspace/x/notes.txt");
    const names = (await files.list(env.id, "/workspace/x")).map((e) => `${e.name}:${e.type}`).sort();
    assert.deepEqual(names, ["notes.txt:file", "y:dir"]);
    assert.equal(await files.exists(env.id, "/workspace/notes.txt"), false);

    // The file is visible to commands too.
    const r = await client.environments.exec(env.id, { cmd: ["cat", "/workspace/x/notes.txt"] });
    assert.equal(r.stdout, "héllo\nwörld\n");

    await assert.rejects(files.remove(env.id, "/workspace/x"), (e) => {
      assert.ok(e instanceof FileError);
      assert.equal(e.code, "file_error");
      assert.equal(e.field, "path");
      assert.match(e.message, /not empty/);
      return true;
    });
    await files.remove(env.id, "/workspace/x", { recursive: true });
    await assert.rejects(files.read(env.id, "/workspace/x/notes.txt"), (e) => {
      assert.ok(e instanceof NotFoundError);
      assert.equal(e.field, "path");
      return true;
    });
  });

  it("raises typed errors", async () => {
    await assert.rejects(client.environments.get("000000000000"), (e) => {
      assert.ok(e instanceof NotFoundError);
      assert.equal(e.status, 404);
      assert.equal(e.code, "not_found");
      return true;
    });
    const stranger = new Moat({ baseUrl: moatd.baseUrl, token: "0".repeat(64) });
    await assert.rejects(stranger.environments.list(), (e) => {
      assert.ok(e instanceof UnauthorizedError);
      assert.equal(e.status, 401);
      assert.equal(e.code, "unauthorized");
      return true;
    });
    await assert.rejects(client.environments.create({ spec: { cpus: 0 } }), (e) => {
      assert.ok(e instanceof InvalidRequestError);
      assert.equal(e.status, 400);
      assert.equal(e.code, "invalid_request");
      assert.equal(e.field, "spec.cpus");
      assert.match(e.message, /spec\.cpus/);
      return true;
    });
    await assert.rejects(client.environments.create({ spec: { gpus: 1 } }), { code: "unknown_field", field: "spec.gpus" });
    await assert.rejects(client.environments.exec("000000000000", { cmd: [] }), { code: "invalid_request", field: "cmd" });

    const env = await newEnv();
    await client.environments.destroy(env.id);
    await assert.rejects(client.environments.exec(env.id, { cmd: ["true"] }), (e) => e instanceof ConflictError && e.status === 409);

    // Client side: a port nobody listens on, and an answer that takes too long.
    const nowhere = new Moat({ baseUrl: "http://127.0.0.1:1", token: "x", retryDelayMs: 1 });
    await assert.rejects(nowhere.health(), (e) => e instanceof MoatConnectionError && e.status === 0);
    const live = await newEnv();
    await assert.rejects(
      client.environments.exec(live.id, { cmd: ["sleep", "3"] }, { timeoutMs: 300 }),
      (e) => e instanceof MoatTimeoutError && e.code === "client_timeout",
    );
  });

  it("manages scoped keys", async () => {
    const key = await client.keys.create({ name: "sdk", scopes: ["create", "read", "destroy"] });
    assert.match(key.token, /^moat_[0-9a-f]{12}_[0-9a-f]{64}$/);
    assert.ok((await client.keys.list()).some((k) => k.id === key.id && !k.revoked));
    const agent = new Moat({ baseUrl: moatd.baseUrl, token: key.token });
    const own = await agent.environments.create({ task_id: "key-env" });
    await assert.rejects(agent.environments.exec(own.id, { cmd: ["true"] }), (e) => e instanceof ForbiddenError && /exec/.test(e.message));
    await assert.rejects(agent.keys.list(), ForbiddenError);
    const other = await newEnv();
    await assert.rejects(agent.environments.get(other.id), NotFoundError);
    assert.deepEqual((await agent.environments.list()).map((e) => e.id), [own.id]);
    await client.keys.revoke(key.id);
    await assert.rejects(agent.environments.list(), UnauthorizedError);
    assert.ok((await client.keys.list()).find((k) => k.id === key.id).revoked);
  });

  it("re-attaches to a long-running process from an offset without losing output", async () => {
    const env = await newEnv();
    const n = 400;
    const proc = await client.environments.processes.start(env.id, {
      cmd: ["sh", "-c", `i=0; while [ $i -lt ${n} ]; do echo "line $i"; i=$((i+1)); if [ $((i % 20)) = 0 ]; then sleep 0.05; fi; done`],
    });
    const expected = Array.from({ length: n }, (_, i) => `line ${i}\n`).join("");
    let received = Buffer.alloc(0);
    let next = 0;
    const check = (event) => {
      if (event.type !== "output") return;
      assert.equal(event.offset, next, "offsets are contiguous");
      next = event.offset + event.data.length;
      received = Buffer.concat([received, event.data]);
    };

    // First attach: leave after a few chunks.
    const first = proc.output({ follow: true });
    let seen = 0;
    for await (const event of first) {
      check(event);
      if (event.type === "output" && ++seen === 3) break;
    }
    assert.equal(first.offset, next);
    assert.ok(next > 0 && next < expected.length, `left early (at ${next})`);

    // Second attach, somewhere in the middle: again leave early.
    const second = client.environments.processes.output(env.id, proc.id, { since: first.offset, follow: true });
    for await (const event of second) {
      check(event);
      if (event.type === "output") break;
    }
    // Third: to the end.
    const third = proc.output({ since: second.offset, follow: true });
    for await (const event of third) check(event);
    assert.equal(third.final?.type, "exit");
    assert.equal(third.final.exit_code, 0);
    assert.equal(received.toString(), expected);
    assert.equal(third.offset, Buffer.byteLength(expected));

    // Without follow: what is there, from any offset, and the end.
    const tail = await proc.output({ since: expected.length - 9 }).collect();
    assert.equal(tail.output.toString(), `line ${n - 1}\n`);
    assert.equal(tail.final?.type, "exit");
  });

  it("reports a process that could not start as a normal answer", async () => {
    const env = await newEnv();
    const proc = await client.environments.processes.start(env.id, { cmd: ["no-such-command"] });
    assert.equal(proc.state, "failed");
    assert.equal(proc.exit_code, 127);
    assert.match(proc.info.error, /command not found/);
    const { final } = await proc.output({ follow: true }).collect();
    assert.deepEqual(final, {
      type: "exit", offset: 0, state: "failed", exit_code: 127,
      error: "command not found: no-such-command (exec: No such file or directory)",
    });
    await assert.rejects(client.environments.processes.get(env.id, 999), NotFoundError);
    await assert.rejects(client.environments.processes.start(env.id, { cmd: ["true"], rows: 5 }), { code: "invalid_request", field: "rows" });
  });

  it("writes stdin and closes it", async () => {
    const env = await newEnv();
    const proc = await client.environments.processes.start(env.id, { cmd: ["cat"] });
    assert.equal(proc.info.stdin_open, true);
    await proc.write("hello\n");
    await proc.write(Buffer.from([0x00, 0xff, 0x0a]));
    await proc.closeStdin();
    const final = await proc.wait();
    assert.equal(final?.type, "exit");
    assert.equal(final.exit_code, 0);
    const out = await proc.output().collect();
    assert.deepEqual(out.stdout, Buffer.concat([Buffer.from("hello\n"), Buffer.from([0x00, 0xff, 0x0a])]));
    await assert.rejects(proc.write("late\n"), ConflictError);
  });

  it("delivers signals", async () => {
    const env = await newEnv();
    const proc = await client.environments.processes.start(env.id, { cmd: ["sleep", "60"], stdin: false });
    const listed = await client.environments.processes.list(env.id);
    assert.ok(listed.some((p) => p.id === proc.id && p.state === "running"));
    await proc.signal("TERM");
    const final = await proc.wait();
    assert.equal(final?.type, "exit");
    assert.equal(final.exit_code, 143);
    assert.equal(final.signal, 15);
    assert.equal(proc.state, "exited");
    assert.equal(proc.info.signal, 15);
    await assert.rejects(proc.signal("TERM"), ConflictError);
    await assert.rejects(proc.signal("NOPE"), { code: "invalid_request", field: "signal" });
  });

  it("ends a follow with an `end` event when the environment is destroyed", async () => {
    const env = await newEnv();
    const proc = await client.environments.processes.start(env.id, { cmd: ["sh", "-c", "echo started; exec sleep 600"] });
    const stream = proc.output({ follow: true });
    const events = [];
    const following = (async () => {
      for await (const event of stream) {
        events.push(event);
        if (event.type === "output") await client.environments.destroy(env.id);
      }
    })();
    await following;
    const last = events.at(-1);
    assert.equal(last.type, "end");
    assert.match(last.reason, /destroyed/);
    assert.equal(stream.final, last);
  });

  it("attaches two shell viewers to a pty process", async () => {
    const env = await newEnv();
    const proc = await client.environments.processes.start(env.id, { cmd: ["sh"], pty: true, rows: 10, cols: 50 });
    assert.equal(proc.state, "running");
    assert.equal(proc.info.pty, true);
    await proc.resize(33, 77);
    const a = await client.environments.shell(env.id, { process: proc.id });
    const b = await client.environments.shell(env.id, { process: proc.id });
    let seenByB = "";
    b.on("data", (chunk) => (seenByB += chunk.toString()));
    await a.write("stty size\n");
    let seenByA = "";
    for await (const chunk of a) {
      seenByA += chunk.toString();
      if (seenByA.includes("33 77")) break;
    }
    await b.write("exit 5\n");
    const [endA, endB] = await Promise.all([a.exited, b.exited]);
    assert.equal(endA.exit_code, 5);
    assert.equal(endB.exit_code, 5);
    assert.match(seenByB, /33 77/);
    const final = await proc.wait();
    assert.equal(final.exit_code, 5);
  });

  it("opens a shell, resizes it and sees it exit", async () => {
    const env = await newEnv();
    const shell = await client.environments.shell(env.id, { rows: 24, cols: 80 });
    await shell.resize(40, 120);
    await shell.write("stty size\n");
    let output = "";
    let sentExit = false;
    const deadline = setTimeout(() => shell.close(), 20_000);
    for await (const chunk of shell) {
      output += chunk.toString();
      if (!sentExit && output.includes("40 120")) {
        sentExit = true;
        await shell.write("exit\n");
      }
    }
    clearTimeout(deadline);
    assert.match(output, /40 120/);
    // The first message named the terminal's process, which the API lists as a shell.
    assert.equal(typeof shell.processId, "number");
    const listed = await client.environments.processes.get(env.id, shell.processId);
    assert.equal(listed.info.kind, "shell");
    const exited = await shell.exited;
    assert.equal(exited.type, "exit");
    assert.equal(exited.exit_code, 0);
  });
});
