// What the MCP tests share: a real moatd from MOAT_BIN_DIR (fresh state
// directory, TCP on an ephemeral port), MCP clients of the official SDK over
// each transport, raw access for what the SDK will not send, and moatd's REST
// API to check what the MCP server did (docs/API.md).
//
// moatd keeps its storage pool mounted after it stops: stop() unmounts
// <state>/storage (umount -l) and removes the state directory, as
// sdk/typescript/test/moatd.mjs and tests/api do.

import { spawn, spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync } from "node:fs";
import http from "node:http";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const here = dirname(fileURLToPath(import.meta.url));
export const binDir = resolve(process.env.MOAT_BIN_DIR ?? join(here, "..", "..", "build", "bin"));
export const moatBin = join(binDir, "moat");
export const PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

export const root = process.getuid?.() === 0;
export const skipReason = !root
  ? "needs root (moatd creates namespaces, cgroups and mounts)"
  : !existsSync(join(binDir, "moatd")) || !existsSync(moatBin)
    ? `moatd/moat not built in ${binDir} (set MOAT_BIN_DIR)`
    : false;

export const LATEST = "2025-11-25";
export const SUPPORTED = ["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Polls fn() until it returns a truthy value (returned) or `ms` pass (then
// the last value, falsy).
export async function waitFor(fn, ms = 10_000, every = 100) {
  const end = Date.now() + ms;
  for (;;) {
    const v = await fn();
    if (v || Date.now() > end) return v;
    await sleep(every);
  }
}

export function removeState(state) {
  spawnSync("umount", ["-l", join(state, "storage")], { stdio: "ignore" });
  rmSync(state, { recursive: true, force: true });
}

export async function startMoatd(extraArgs = []) {
  const state = mkdtempSync(join(tmpdir(), "moatd-mcp-"));
  const proc = spawn(join(binDir, "moatd"), ["--state", state, "--listen", "127.0.0.1:0", ...extraArgs], {
    env: { PATH, MOAT_STORAGE_GB: "16" },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let log = "";
  const exited = new Promise((res) => proc.once("exit", (code, signal) => res({ code, signal })));
  const serving = new Promise((res, rej) => {
    const onData = (chunk) => {
      log += chunk.toString();
      const m = /moatd: serving http:\/\/127\.0\.0\.1:(\d+)(?: and unix:(\S+))?/.exec(log);
      if (m) res({ port: Number(m[1]), socketPath: m[2] ?? join(state, "moatd.sock") });
    };
    proc.stdout.on("data", onData);
    proc.stderr.on("data", onData);
    exited.then(({ code, signal }) => rej(new Error(`moatd exited at start (${code ?? signal}):\n${log}`)));
  });
  let timer;
  const timeout = new Promise((_, rej) => {
    timer = setTimeout(() => rej(new Error(`moatd did not start within 30 s:\n${log}`)), 30_000);
  });
  let where;
  try {
    where = await Promise.race([serving, timeout]);
  } catch (e) {
    proc.kill("SIGKILL");
    await exited;
    removeState(state);
    throw e;
  } finally {
    clearTimeout(timer);
  }
  const token = readFileSync(join(state, "master-token"), "utf8").trim();
  let stopped;
  return {
    state,
    token,
    port: where.port,
    socketPath: where.socketPath,
    baseUrl: `http://127.0.0.1:${where.port}`,
    mcpUrl: `http://127.0.0.1:${where.port}/mcp`,
    rest: restClient({ socketPath: where.socketPath, token }),
    log: () => log,
    async stop() {
      stopped ??= (async () => {
        if (proc.exitCode === null && proc.signalCode === null) {
          proc.kill("SIGTERM");
          const killer = setTimeout(() => proc.kill("SIGKILL"), 60_000);
          await exited;
          clearTimeout(killer);
        }
        removeState(state);
      })();
      return stopped;
    },
  };
}

// ---------------------------------------------------------------------------
// Raw HTTP (node:http, so that Host can be set and unix sockets reached).

export function httpRequest({ socketPath, port, host = "127.0.0.1", method = "GET", path, headers = {}, body }) {
  return new Promise((res, rej) => {
    const req = http.request(
      { socketPath, host: socketPath ? undefined : host, port, method, path, headers, setHost: !("Host" in headers) },
      (resp) => {
        const chunks = [];
        resp.on("data", (c) => chunks.push(c));
        resp.on("end", () => res({ status: resp.statusCode, headers: resp.headers, text: Buffer.concat(chunks).toString() }));
        resp.on("error", rej);
      },
    );
    req.on("error", rej);
    req.setTimeout(30_000, () => req.destroy(new Error(`${method} ${path}: no answer within 30 s`)));
    if (body !== undefined) req.write(body);
    req.end();
  });
}

// moatd's REST API with the master token (over its unix socket).
export function restClient({ socketPath, token }) {
  async function call(method, path, body) {
    const headers = { Authorization: `Bearer ${token}` };
    let data;
    if (body !== undefined) {
      data = JSON.stringify(body);
      headers["Content-Type"] = "application/json";
    }
    const r = await httpRequest({ socketPath, method, path, headers, body: data });
    let json;
    try {
      json = r.text ? JSON.parse(r.text) : undefined;
    } catch {
      json = undefined;
    }
    return { status: r.status, json, text: r.text };
  }
  return {
    call,
    // ids of the running environments (every key's: this is the master token)
    async runningIds() {
      const r = await call("GET", "/v1/environments");
      if (r.status !== 200) throw new Error(`GET /v1/environments: ${r.status} ${r.text}`);
      return new Set(r.json.environments.filter((e) => e.state === "running" || e.state === "creating").map((e) => e.id));
    },
    async environment(id) {
      const r = await call("GET", `/v1/environments/${id}`);
      return r.status === 200 ? r.json : undefined;
    },
    async isGone(id) {
      const r = await call("GET", `/v1/environments/${id}`);
      return r.status === 404 || (r.status === 200 && (r.json.state === "gone" || r.json.state === "failed"));
    },
  };
}

// ---------------------------------------------------------------------------
// MCP clients of the official SDK.

// Records every JSON-RPC message the transport delivers to the client.
function tapTransport(transport) {
  const received = [];
  let handler;
  Object.defineProperty(transport, "onmessage", {
    configurable: true,
    // undefined until set: Protocol.connect() chains to what it finds here
    get: () =>
      handler &&
      ((message, extra) => {
        received.push(message);
        handler(message, extra);
      }),
    set: (h) => {
      handler = h;
    },
  });
  return received;
}

function newClient() {
  return new Client({ name: "moat-mcp-tests", version: "0.0.0" }, { capabilities: {} });
}

// `moat mcp` (MOAT_STATE=state: talks to that moatd) or `moat mcp
// --standalone` (state undefined: it starts its own moatd). `asUser`: run
// as that user (setpriv: its uid and groups, its HOME, nothing else of this
// environment), `bin` the moat it may run.
export async function connectStdio({ state, standalone = false, asUser, bin = moatBin } = {}) {
  const env = { PATH, MOAT_STORAGE_GB: "16" };
  if (state) env.MOAT_STATE = state;
  const args = standalone ? ["mcp", "--standalone"] : ["mcp"];
  const transport = asUser
    ? new StdioClientTransport({
        command: "/usr/bin/setpriv",
        args: [`--reuid=${asUser}`, `--regid=${asUser}`, "--init-groups", "--reset-env", "--", "/usr/bin/env",
               `MOAT_STATE=${state}`, bin, ...args],
        env: { PATH },
        stderr: "pipe",
      })
    : new StdioClientTransport({ command: moatBin, args, env, stderr: "pipe" });
  let stderr = "";
  transport.stderr.on("data", (c) => {
    stderr += c.toString();
  });
  const received = tapTransport(transport);
  const client = newClient();
  const connecting = client.connect(transport, { timeout: 30_000 });
  const pid = transport.pid; // spawned synchronously by connect()
  try {
    await connecting;
  } catch (e) {
    // A --standalone that never answered: its moatd and state go too.
    const priv = standalone ? privateMoatd(pid) : undefined;
    await client.close().catch(() => {});
    if (priv) {
      if (alive(priv.pid)) process.kill(priv.pid, "SIGTERM");
      await waitFor(() => !alive(priv.pid), 20_000);
      if (alive(priv.pid)) process.kill(priv.pid, "SIGKILL");
      if (priv.state?.startsWith("/tmp/")) removeState(priv.state);
    }
    throw new Error(`${e.message}\nmoat mcp stderr:\n${stderr}`);
  }
  return {
    kind: standalone ? "standalone" : "stdio",
    client,
    transport,
    received,
    pid,
    stderr: () => stderr,
    // Ends the session: stdin closes (the SDK then waits for the exit).
    async close() {
      await client.close();
    },
  };
}

export async function connectHttp({ mcpUrl, token }) {
  const transport = new StreamableHTTPClientTransport(new URL(mcpUrl), {
    requestInit: { headers: { Authorization: `Bearer ${token}` } },
  });
  const received = tapTransport(transport);
  const client = newClient();
  await client.connect(transport);
  return {
    kind: "http",
    client,
    transport,
    received,
    stderr: () => "",
    // Ends the session: DELETE /mcp, then drop the connection.
    async close() {
      try {
        await transport.terminateSession();
      } finally {
        await client.close();
      }
    },
  };
}

// ---------------------------------------------------------------------------
// Tool results.

export function text(result) {
  return (result.content ?? []).filter((c) => c.type === "text").map((c) => c.text).join("");
}

// create_environment's structuredContent: the environment itself, or
// {"environment": {...}}.
export function environmentOf(structuredContent) {
  return structuredContent?.environment ?? structuredContent;
}

export function describeResult(result) {
  return JSON.stringify(result, null, 1).slice(0, 2000);
}

// ---------------------------------------------------------------------------
// Raw stdio: `moat mcp` driven line by line (for what the SDK client will not
// send: another protocol version, a malformed line).

export function spawnRawStdio({ state }) {
  const proc = spawn(moatBin, ["mcp"], {
    env: { PATH, MOAT_STATE: state },
    stdio: ["pipe", "pipe", "pipe"],
  });
  let buf = "";
  let stderr = "";
  const messages = [];
  const badLines = [];
  const waiters = [];
  const exited = new Promise((res) => proc.once("exit", (code, signal) => res({ code, signal })));
  proc.stderr.on("data", (c) => {
    stderr += c.toString();
  });
  proc.stdout.on("data", (c) => {
    buf += c.toString();
    let nl;
    while ((nl = buf.indexOf("\n")) >= 0) {
      const line = buf.slice(0, nl);
      buf = buf.slice(nl + 1);
      if (!line.trim()) continue;
      try {
        messages.push(JSON.parse(line));
      } catch {
        badLines.push(line);
      }
      for (const w of [...waiters]) w();
    }
  });
  return {
    messages,
    badLines,
    stderr: () => stderr,
    send(msg) {
      proc.stdin.write(typeof msg === "string" ? msg : JSON.stringify(msg) + "\n");
    },
    // The first message (seen so far or to come) that pred accepts.
    next(pred, ms = 15_000) {
      return new Promise((res, rej) => {
        const check = () => {
          const m = messages.find(pred);
          if (m) {
            waiters.splice(waiters.indexOf(check), 1);
            clearTimeout(timer);
            res(m);
            return true;
          }
          return false;
        };
        const timer = setTimeout(() => {
          waiters.splice(waiters.indexOf(check), 1);
          rej(new Error(`no matching message within ${ms} ms; got ${JSON.stringify(messages)}; stderr:\n${stderr}`));
        }, ms);
        waiters.push(check);
        check();
      });
    },
    async close() {
      proc.stdin.end();
      const t = setTimeout(() => proc.kill("SIGKILL"), 10_000);
      const r = await exited;
      clearTimeout(t);
      return r;
    },
  };
}

// ---------------------------------------------------------------------------
// Processes: descendants of a pid, and what they were started with.

function ppidOf(pid) {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
  } catch {
    return undefined;
  }
}

export function descendants(pid) {
  const children = new Map();
  for (const d of readdirSync("/proc")) {
    if (!/^\d+$/.test(d)) continue;
    const pp = ppidOf(d);
    if (pp === undefined) continue;
    if (!children.has(pp)) children.set(pp, []);
    children.get(pp).push(Number(d));
  }
  const out = [];
  const todo = [pid];
  while (todo.length) {
    const p = todo.pop();
    for (const c of children.get(p) ?? []) {
      out.push(c);
      todo.push(c);
    }
  }
  return out;
}

export function cmdline(pid) {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0").filter(Boolean);
  } catch {
    return undefined;
  }
}

export function environ(pid) {
  try {
    return Object.fromEntries(
      readFileSync(`/proc/${pid}/environ`, "utf8")
        .split("\0")
        .filter(Boolean)
        .map((kv) => [kv.slice(0, kv.indexOf("=")), kv.slice(kv.indexOf("=") + 1)]),
    );
  } catch {
    return undefined;
  }
}

export function alive(pid) {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 2)[0] !== "Z";
  } catch {
    return false;
  }
}

// The moatd a `moat mcp --standalone` started: its pid and state directory.
export function privateMoatd(mcpPid) {
  for (const p of descendants(mcpPid)) {
    const argv = cmdline(p);
    if (!argv || !argv[0]?.endsWith("moatd")) continue;
    let state;
    const i = argv.indexOf("--state");
    if (i >= 0) state = argv[i + 1];
    else state = argv.find((a) => a.startsWith("--state="))?.slice(8) ?? environ(p)?.MOAT_STATE;
    return { pid: p, state };
  }
  return undefined;
}

export function mountedUnder(dir) {
  return readFileSync("/proc/mounts", "utf8")
    .split("\n")
    .map((l) => l.split(" ")[1])
    .filter((m) => m && (m === dir || m.startsWith(dir + "/")));
}
