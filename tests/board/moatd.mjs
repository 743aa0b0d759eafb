// A real moatd for the board's browser tests (the idea of
// sdk/typescript/test/moatd.mjs, kept small): a fresh state directory, TCP
// on an ephemeral port, the board from MOAT_BOARD_DIR, the master token
// from <state>/master-token. stop() sends SIGTERM (which destroys every
// environment), waits for moatd to exit and removes the state directory.

import { spawn, spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

export const binDir = resolve(process.env.MOAT_BIN_DIR ?? join(dirname(fileURLToPath(import.meta.url)), "..", "..", "build", "bin"));

function removeState(state) {
  // moatd leaves its storage pool mounted under the state directory.
  spawnSync("umount", ["-l", join(state, "storage")], { stdio: "ignore" });
  rmSync(state, { recursive: true, force: true });
}

export async function startMoatd(extraArgs = []) {
  const moatd = join(binDir, "moatd");
  if (!existsSync(moatd)) throw new Error(`${moatd} is not built (set MOAT_BIN_DIR to the build's bin directory)`);
  const boardDir = process.env.MOAT_BOARD_DIR;
  const state = mkdtempSync(join(tmpdir(), "moatd-board-"));
  const args = ["--state", state, "--listen", "127.0.0.1:0", ...(boardDir ? ["--board-dir", boardDir] : []), ...extraArgs];
  const proc = spawn(moatd, args, {
    env: { PATH: "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", MOAT_STORAGE_GB: "32" },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let log = "";
  const exited = new Promise((res) => proc.once("exit", (code, signal) => res({ code, signal })));
  const serving = new Promise((res, rej) => {
    const onData = (chunk) => {
      log += chunk.toString();
      const m = /moatd: serving http:\/\/127\.0\.0\.1:(\d+) and unix:(\S+)/.exec(log);
      if (m) res(Number(m[1]));
    };
    proc.stdout.on("data", onData);
    proc.stderr.on("data", onData);
    exited.then(({ code, signal }) => rej(new Error(`moatd exited at start (${code ?? signal}):\n${log}`)));
  });
  let timer;
  const timeout = new Promise((_, rej) => {
    timer = setTimeout(() => rej(new Error(`moatd did not start within 30 s:\n${log}`)), 30_000);
  });
  let port;
  try {
    port = await Promise.race([serving, timeout]);
  } catch (e) {
    proc.kill("SIGKILL");
    await exited;
    removeState(state);
    throw e;
  } finally {
    clearTimeout(timer);
  }
  let stopped;
  return {
    state,
    token: readFileSync(join(state, "master-token"), "utf8").trim(),
    baseUrl: `http://127.0.0.1:${port}`,
    log: () => log,
    stop() {
      stopped ??= (async () => {
        if (proc.exitCode === null && proc.signalCode === null) {
          proc.kill("SIGTERM");
          const killer = setTimeout(() => proc.kill("SIGKILL"), 120_000);
          await exited;
          clearTimeout(killer);
        }
        removeState(state);
      })();
      return stopped;
    },
  };
}
