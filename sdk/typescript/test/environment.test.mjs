// The environment handle (moat.create/get/list, env.run/start/files/...)
// against a real moatd (started here; needs root, like moatd).

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import {
  CapacityError,
  CommandError,
  CommandHandle,
  ConflictError,
  DeniedByPolicyError,
  Environment,
  ForbiddenError,
  InvalidRequestError,
  MoatAbortError,
  MoatError,
  Moat,
  NotFoundError,
  UnauthorizedError,
} from "../dist/index.js";
import { startMoatd } from "./moatd.mjs";

/** An onStdout callback and a promise of the first text it gets. */
function outputSignal() {
  let resolve;
  const first = new Promise((r) => {
    resolve = r;
  });
  return { first, onStdout: (text) => resolve(text) };
}

const root = process.getuid?.() === 0;
const skip = root ? false : "needs root (moatd creates namespaces, cgroups and mounts)";

describe("the environment handle, against a real moatd", { skip }, () => {
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

  it("create, run, files, refresh, get, list, destroy: every call knows its environment", async () => {
    const env = await moat.create({ task_id: "handle", labels: { sdk: "handle" }, spec: { cpus: 1, ram_mb: 512 } });
    assert.ok(env instanceof Environment);
    assert.match(env.id, /^[0-9a-f]{12}$/);
    // The record's fields are on the handle, and in info.
    assert.equal(env.state, "running");
    assert.equal(env.task_id, "handle");
    assert.deepEqual(env.labels, { sdk: "handle" });
    assert.equal(env.spec.ram_mb, 512);
    assert.equal(env.info.id, env.id);
    assert.deepEqual(JSON.parse(JSON.stringify(env)), env.info);

    await env.files.write("/workspace/solve.py", "import sys\nprint(sys.stdin.read().upper(), end='')\nsys.exit(3)\n");
    assert.equal(await env.files.readText("/workspace/solve.py"), "import sys\nprint(sys.stdin.read().upper(), end='')\nsys.exit(3)\n");
    assert.deepEqual((await env.files.list("/workspace")).map((e) => e.name), ["solve.py"]);
    assert.equal(await env.files.exists("/workspace/solve.py"), true);

    const r = await env.run("python3 solve.py", { cwd: "/workspace", stdin: "forty-two\n" });
    assert.equal(r.exitCode, 3);
    assert.equal(r.stdout, "FORTY-TWO\n");
    assert.equal(r.stderr, "");
    assert.equal(r.timedOut, false);
    assert.equal(r.signal, 0);
    assert.equal(r.truncated, false);
    assert.deepEqual(r.stdoutRaw, Buffer.from("FORTY-TWO\n"));
    assert.ok(Number.isInteger(r.processId) && r.processId > 0);

    const withEnv = await env.run("echo \"$GREETING from $(pwd)\"", { env: { GREETING: "hello" }, cwd: "/tmp" });
    assert.equal(withEnv.stdout, "hello from /tmp\n");

    const slow = await env.run(["sleep", "30"], { timeoutMs: 200 });
    assert.equal(slow.timedOut, true);
    assert.equal(slow.exitCode, 137);

    await env.files.remove("/workspace/solve.py");
    assert.equal(await env.files.exists("/workspace/solve.py"), false);

    const again = await moat.get(env.id);
    assert.ok(again instanceof Environment);
    assert.equal(again.id, env.id);
    assert.equal((await again.run("echo same")).stdout, "same\n");
    const listed = await moat.list({ labels: { sdk: "handle" } });
    assert.deepEqual(listed.map((e) => e.id), [env.id]);
    assert.ok(listed[0] instanceof Environment);

    const before = env.expires_at;
    await env.setTimeout(60);
    assert.ok(Date.parse(env.expires_at) < Date.parse(before));
    assert.equal((await env.refresh()).expires_at, env.expires_at);
    assert.equal((await env.stats()).id, env.id);

    // The calls by id still return plain records; a record becomes a handle.
    const record = await moat.environments.get(env.id);
    assert.ok(!(record instanceof Environment));
    assert.equal(Object.getPrototypeOf(record), Object.prototype);
    assert.deepEqual(record, env.info);
    const wrapped = new Environment(moat, record);
    assert.equal((await wrapped.run(["echo", "wrapped"])).stdout, "wrapped\n");

    await env.destroy();
    assert.equal(env.state, "gone");
    assert.equal((await env.refresh()).state, "gone");
    assert.equal(env.reason, "destroyed");
    await env.destroy();  // idempotent
  });

  it("a string is a shell line, an array is argv", async () => {
    const env = await moat.create();
    const shell = await env.run("echo $((1+2)) | tr 3 x; echo err >&2");
    assert.equal(shell.stdout, "x\n");
    assert.equal(shell.stderr, "err\n");
    const argv = await env.run(["echo", "$((1+2))", "|", "tr", "3", "x"]);
    assert.equal(argv.stdout, "$((1+2)) | tr 3 x\n");
    const spaced = await env.run(["printf", "%s|", "a b", "'c'", ""]);
    assert.equal(spaced.stdout, "a b|'c'||");

    const missing = await env.run(["no-such-command", "x"]);
    assert.equal(missing.exitCode, 127);
    assert.match(missing.error, /no-such-command/);
    assert.match(missing.stderr, /no-such-command/);
    const missingInShell = await env.run("no-such-command x");
    assert.equal(missingInShell.exitCode, 127);  // the shell says so

    assert.equal(shell.ok, true);
    assert.equal(missing.ok, false);
    await assert.rejects(env.run("echo bad >&2; exit 4", { check: true }), (e) => {
      assert.ok(e instanceof CommandError);
      assert.equal(e.code, "command_failed");
      assert.equal(e.result.exitCode, 4);
      assert.equal(e.result.stderr, "bad\n");
      assert.deepEqual(e.cmd, ["/bin/sh", "-c", "echo bad >&2; exit 4"]);
      assert.match(e.message, /exited 4: bad$/);
      return true;
    });
    assert.equal((await env.run("true", { check: true })).exitCode, 0);

    await assert.rejects(env.run(""), TypeError);
    await assert.rejects(env.run([]), TypeError);
    await assert.rejects(env.run(["echo", 3]), /cmd\[1\]/);
    await env.destroy();
  });

  it("callbacks get the output as it arrives, in order, all before run resolves", async () => {
    const env = await moat.create();
    // The command waits at each step for a file a callback writes when it
    // sees the step's output: it can only finish if the callbacks ran while
    // it was running, as each piece arrived.
    const wait = (f) => `while [ ! -e /tmp/${f} ]; do sleep 0.01; done`;
    const script = [
      "echo ready", wait("go"),
      "for i in 1 2 3; do echo out $i; echo err $i >&2; done",
      "echo mid >&2", wait("go2"),
      "echo after",
      "printf '\\303'", wait("go3"), "printf '\\251'",  // é split across two pieces
      "printf x >&2",
    ].join("; ");
    const seen = [];
    let resolved = false;
    const r = await env.run(script, {
      timeoutMs: 20_000,
      onStdout: async (text, raw) => {
        assert.equal(resolved, false);
        assert.ok(Buffer.isBuffer(raw));
        seen.push(["out", text, raw]);
        if (text.includes("ready")) await env.files.write("/tmp/go", "");
        if (raw.length > 0 && raw[raw.length - 1] === 0xc3) await env.files.write("/tmp/go3", "");
      },
      onStderr: async (text) => {
        assert.equal(resolved, false);
        seen.push(["err", text]);
        if (text.includes("mid")) await env.files.write("/tmp/go2", "");
      },
    }).then((res) => {
      resolved = true;
      return res;
    });
    assert.equal(r.timedOut, false);
    assert.equal(r.exitCode, 0);
    const out = seen.filter(([s]) => s === "out").map(([, t]) => t).join("");
    const err = seen.filter(([s]) => s === "err").map(([, t]) => t).join("");
    // Each stream whole and in order, the same as the result.
    assert.equal(out, "ready\nout 1\nout 2\nout 3\nafter\né");
    assert.equal(err, "err 1\nerr 2\nerr 3\nmid\nx");
    assert.equal(r.stdout, out);
    assert.equal(r.stderr, err);
    assert.equal(seen[0][1], "ready\n");  // first, alone: the command waited on it
    const at = (stream, what) => seen.findIndex(([s, t]) => s === stream && t.includes(what));
    assert.ok(at("err", "mid") < at("out", "after"), JSON.stringify(seen.map(([s, t]) => `${s}:${t}`)));
    // The piece that ended with the first byte of é (the command waited
    // there) gave text without it; the next piece's text starts with é.
    const outs = seen.filter(([s]) => s === "out");
    const cutAt = outs.findIndex(([, , raw]) => raw.length > 0 && raw[raw.length - 1] === 0xc3);
    assert.ok(cutAt >= 0);
    assert.equal(outs[cutAt][1], outs[cutAt][2].subarray(0, -1).toString("utf8"));
    assert.ok(!outs[cutAt][1].includes("\ufffd"));
    assert.ok(outs[cutAt + 1][1].startsWith("é"), JSON.stringify(outs.slice(cutAt).map(([, t]) => t)));
    await env.destroy();
  });

  it("keeps every byte of a large output and cuts the result at maxOutputBytes", async () => {
    const env = await moat.create();
    let streamed = 0;
    const r = await env.run("head -c 3000000 /dev/zero | tr '\\0' a", {
      maxOutputBytes: 1_000_000,
      onStdout: (_text, raw) => {
        streamed += raw.length;
      },
    });
    assert.equal(r.exitCode, 0);
    assert.equal(streamed, 3_000_000);  // lossless: nothing dropped on the way
    assert.equal(r.stdout.length, 1_000_000);
    assert.equal(r.truncated, true);
    await env.destroy();
  });

  it("feeds stdin larger than moatd takes in one request", async () => {
    const env = await moat.create();
    const big = Buffer.alloc(3 << 20, 0x61);
    big[big.length - 1] = 0x0a;
    const r = await env.run("wc -c", { stdin: big });
    assert.equal(r.stdout.trim(), String(3 << 20));
    const text = "é".repeat(600_000);  // 1.2 MB of UTF-8, split inside characters
    assert.equal((await env.run(["sha256sum"], { stdin: text })).stdout.split(" ")[0],
      (await import("node:crypto")).createHash("sha256").update(text).digest("hex"));
    let echoed = 0;
    const cat = await env.start(["cat"], { stdin: true, onStdout: (_t, raw) => { echoed += raw.length; } });
    await cat.write(Buffer.alloc(2 << 20, 0x62));
    await cat.closeStdin();
    const done = await cat.wait();
    assert.equal(echoed, 2 << 20);
    assert.equal(done.stdout.length, 2 << 20);
    await env.destroy();
  });

  it("a throwing callback ends the command and rejects run; an AbortSignal kills it", async () => {
    const env = await moat.create();
    const boom = new Error("stop here");
    await assert.rejects(
      env.run("echo first; sleep 30; echo never", {
        onStdout: () => {
          throw boom;
        },
      }),
      (e) => e === boom,
    );
    const procs = await env.processes.list();
    const sleeper = procs.find((p) => p.info.cmd.at(-1)?.includes("sleep 30"));
    assert.ok(sleeper, JSON.stringify(procs.map((p) => p.info)));
    const ended = await sleeper.wait();
    assert.equal(ended.type, "exit");
    assert.equal(ended.exit_code, 137);

    const controller = new AbortController();
    const running = env.run("echo go; sleep 30", {
      signal: controller.signal,
      onStdout: () => controller.abort(),
    });
    await assert.rejects(running, MoatAbortError);
    const killed = (await env.processes.list()).filter((p) => p.info.cmd.at(-1) === "echo go; sleep 30");
    assert.equal(killed.length, 1);
    assert.equal((await killed[0].wait()).exit_code, 137);
    await env.destroy();
  });

  it("start: a background command with callbacks, stdin, onExit, wait and kill", async () => {
    const env = await moat.create();
    const lines = [];
    let exited;
    const cat = await env.start(["cat"], {
      stdin: true,
      onStdout: (text) => lines.push(text),
      onExit: (result) => {
        exited = result;
      },
    });
    assert.ok(cat instanceof CommandHandle);
    assert.ok(Number.isInteger(cat.id) && cat.id > 0);
    assert.ok(cat.pid > 0);
    assert.equal(cat.envId, env.id);
    assert.equal(cat.exitCode, undefined);
    await cat.write("one\n");
    await cat.write("two\n");
    await cat.closeStdin();
    const result = await cat.wait();
    assert.equal(result, exited);  // onExit got the same result, before wait resolved
    assert.equal(result.exitCode, 0);
    assert.equal(result.stdout, "one\ntwo\n");
    assert.equal(lines.join(""), "one\ntwo\n");
    assert.equal(cat.exitCode, 0);
    assert.equal(await cat.kill(), false);  // already ended

    // kill: the command dies of SIGKILL; onExit says so.
    let onExitResult;
    const listening = outputSignal();
    const server = await env.start("echo listening; exec sleep 1000", {
      onStdout: listening.onStdout,
      onExit: (r) => {
        onExitResult = r;
      },
    });
    assert.equal(await listening.first, "listening\n");
    assert.equal(await server.kill(), true);
    const killed = await server.wait();
    assert.equal(killed.exitCode, 137);
    assert.equal(killed.signal, 9);
    assert.equal(killed.stdout, "listening\n");
    assert.equal(onExitResult, killed);
    assert.equal(await server.kill(), false);

    // TERM by name; a string stdin is fed and closed.
    const up = outputSignal();
    const term = await env.start("trap 'echo got TERM; exit 5' TERM; echo up; while :; do sleep 0.05; done", { onStdout: up.onStdout });
    assert.equal(await up.first, "up\n");
    await term.kill("TERM");
    const t = await term.wait();
    assert.equal(t.exitCode, 5);
    assert.equal(t.stdout, "up\ngot TERM\n");
    const fed = await env.start("tr a-z A-Z", { stdin: "shout\n" });
    assert.equal((await fed.wait()).stdout, "SHOUT\n");

    // The process list holds the background commands by id.
    assert.equal((await env.processes.get(cat.id)).state, "exited");
    await env.destroy();
  });

  it("a background command whose environment ends: wait rejects, onError hears it", async () => {
    const env = await moat.create();
    let heard;
    const heardIt = new Promise((resolve) => {
      heard = resolve;
    });
    const up = outputSignal();
    const h = await env.start("echo up; sleep 1000", { onStdout: up.onStdout, onError: (e) => heard(e) });
    assert.equal(await up.first, "up\n");
    await env.destroy();
    await assert.rejects(h.wait(), (e) => e instanceof ConflictError && e.code === "gone");
    const e = await heardIt;
    assert.ok(e instanceof ConflictError);
    assert.match(e.message, /destroyed/);
  });

  it("snapshot, restore, fork from the handle", async () => {
    const env = await moat.create({ labels: { sdk: "snap" } });
    await env.files.write("/workspace/f", "one\n");
    const snap = await env.snapshot("one");
    assert.equal(snap.environment_id, env.id);
    assert.equal(snap.name, "one");
    assert.deepEqual((await env.snapshots()).map((s) => s.id), [snap.id]);
    await env.files.write("/workspace/f", "two\n");
    await env.restore(snap);
    assert.equal(await env.files.readText("/workspace/f"), "one\n");
    await env.files.write("/workspace/f", "three\n");
    await env.restore(snap.id);
    assert.equal((await env.run("cat /workspace/f")).stdout, "one\n");

    const fork = await env.fork({ task_id: "branch" });
    assert.ok(fork instanceof Environment);
    assert.notEqual(fork.id, env.id);
    assert.equal(fork.task_id, "branch");
    assert.deepEqual(fork.labels, { sdk: "snap" });
    assert.equal((await fork.run("cat /workspace/f")).stdout, "one\n");
    await fork.destroy();
    await moat.snapshots.delete(snap.id);
    await env.destroy();
  });

  it("errors are typed and carry code, message, status and field", async () => {
    await assert.rejects(moat.get("000000000000"), (e) => {
      assert.ok(e instanceof NotFoundError);
      assert.equal(e.status, 404);
      assert.equal(e.code, "not_found");
      assert.match(e.message, /000000000000/);
      return true;
    });
    for (const id of ["..", "../keys", "."]) await assert.rejects(moat.get(id), NotFoundError);
    await assert.rejects(moat.create({ spec: { cpus: 5000 } }), (e) => {
      assert.ok(e instanceof InvalidRequestError);
      assert.equal(e.status, 400);
      assert.equal(e.code, "invalid_request");
      assert.equal(e.field, "spec.cpus");
      return true;
    });
    const stranger = new Moat({ baseUrl: moatd.baseUrl, token: "0".repeat(64) });
    await assert.rejects(stranger.list(), (e) => e instanceof UnauthorizedError && e.status === 401 && e.code === "unauthorized");

    const key = await moat.keys.create({ name: "reader", scopes: ["read"] });
    const reader = new Moat({ baseUrl: moatd.baseUrl, token: key.token });
    await assert.rejects(reader.create(), (e) => {
      assert.ok(e instanceof ForbiddenError);
      assert.equal(e.status, 403);
      assert.equal(e.code, "forbidden");
      assert.match(e.message, /create/);
      return true;
    });

    const locked = await moat.create({ permissions: { run_command: "deny" } });
    await assert.rejects(locked.run("echo hi"), (e) => {
      assert.ok(e instanceof DeniedByPolicyError);
      assert.ok(e instanceof ForbiddenError);
      assert.equal(e.status, 403);
      assert.equal(e.code, "denied_by_policy");
      assert.equal(e.scope, "run_command");
      return true;
    });
    await locked.destroy();
    await assert.rejects(locked.run("echo hi"), (e) => e instanceof ConflictError && e.status === 409);
    await assert.rejects(locked.files.write("/workspace/x", "x"), ConflictError);
    for (const e of [NotFoundError, InvalidRequestError, UnauthorizedError, ForbiddenError, ConflictError, CapacityError]) {
      assert.ok(e.prototype instanceof MoatError);
    }
  });
});

describe("capacity, against a real moatd", { skip }, () => {
  let moatd;
  let moat;

  before(async () => {
    moatd = await startMoatd(["--max-environments", "1"]);
    moat = new Moat({ baseUrl: moatd.baseUrl, token: moatd.token });
  });

  after(async () => {
    moat?.close();
    await moatd?.stop();
  });

  it("is a CapacityError (429) when the environment limit is reached", async () => {
    const env = await moat.create();
    await assert.rejects(moat.create(), (e) => {
      assert.ok(e instanceof CapacityError);
      assert.equal(e.status, 429);
      assert.equal(e.code, "capacity");
      return true;
    });
    await env.destroy();
    const next = await moat.create();  // room again
    await next.destroy();
  });
});
