// Commands on an environment handle: run() to the end and start() in the
// background, both with output callbacks. Either starts a background process
// (POST .../processes, lossless) and follows its NDJSON output from offset 0
// (docs/API.md, "Processes"), so output reaches the callbacks as it is
// produced, in order, and nothing is dropped however long the command runs.

import { StringDecoder } from "node:string_decoder";

import { CommandError, ConflictError, MoatAbortError } from "./errors.js";
import { type Process, type Processes } from "./processes.js";
import type { ExitEvent, GatedOptions, StartProcessRequest } from "./types.js";

/** A shell line (run with `/bin/sh -c`) or an argv array (run as is, no shell). */
export type Command = string | readonly string[];

/** Called with each piece of output as it arrives: text (UTF-8, split only between characters) and its exact bytes. A promise it returns is awaited (the command waits meanwhile). */
export type OutputCallback = (text: string, raw: Buffer) => unknown;

export interface CommandOptions extends Omit<GatedOptions, "timeoutMs"> {
  /** The working directory (default: the template's, `/workspace` for `host`). */
  cwd?: string;
  /** Variables for this command, on top of the environment's. */
  env?: Record<string, string>;
  /** Kills the command's process group after this many ms (the result says `timedOut`). Default: no limit. */
  timeoutMs?: number;
  /** Each piece of stdout as it arrives, in order; awaited when it returns a promise (the command then waits). */
  onStdout?: OutputCallback;
  /** Each piece of stderr, likewise. */
  onStderr?: OutputCallback;
  /**
   * Bytes of each stream kept for the result (default 16 MiB); the callbacks
   * still get everything. Beyond it the result's text is cut and `truncated` set.
   */
  maxOutputBytes?: number;
}

export interface RunOptions extends CommandOptions {
  /** Fed to the command's stdin, which is then closed. Default: stdin is /dev/null. */
  stdin?: string | Uint8Array;
  /** Throw CommandError (carrying the result) unless the command exits 0. Default false: a failure is a result. */
  check?: boolean;
}

export interface StartOptions extends CommandOptions {
  /**
   * `true`: a pipe stays open for `handle.write()` until `handle.closeStdin()`;
   * a string or bytes: fed, then closed. Default: /dev/null.
   */
  stdin?: boolean | string | Uint8Array;
  /** Run on a terminal (stdout and stderr are the terminal, all of it reported as stdout). */
  pty?: boolean;
  rows?: number;
  cols?: number;
  /** Called once with the result when the command ends (before `wait()` resolves). */
  onExit?: (result: RunResult) => unknown;
  /** Called once when the command can no longer be followed (environment gone, connection lost, a callback threw). */
  onError?: (error: Error) => unknown;
}

/** How a command ended. A failing command is a result, not an error. */
export interface RunResult {
  /** 0 on success; 128+N when signal N killed it; 127 not found, 126 not runnable (`error` says why). */
  exitCode: number;
  /** exitCode is 0. */
  ok: boolean;
  /** The signal that killed it, 0 if none. */
  signal: number;
  /** Its `timeoutMs` ran out and it was killed. */
  timedOut: boolean;
  /** stdout as text (lossy UTF-8 when it was not text; the exact bytes are `stdoutRaw`). */
  stdout: string;
  stderr: string;
  stdoutRaw: Buffer;
  stderrRaw: Buffer;
  /** Output was left out of stdout/stderr: beyond `maxOutputBytes`, or dropped by moatd. */
  truncated: boolean;
  /** Why the command could not start (exitCode 127 or 126); also the end of `stderr`. */
  error?: string;
  /** moatd's id of the process that ran it (`env.processes` lists it while moatd keeps it). */
  processId: number;
}

const DEFAULT_MAX_OUTPUT = 16 << 20;

/** argv for a Command: a string becomes `/bin/sh -c LINE`. */
export function toArgv(cmd: Command): string[] {
  if (typeof cmd === "string") {
    if (cmd.trim() === "") throw new TypeError("cmd: the shell line is empty");
    return ["/bin/sh", "-c", cmd];
  }
  if (!Array.isArray(cmd) || cmd.length === 0) throw new TypeError("cmd: a shell line (string) or a non-empty argv array");
  cmd.forEach((arg, i) => {
    if (typeof arg !== "string") throw new TypeError(`cmd[${i}]: must be a string`);
  });
  return [...cmd];
}

/** Bytes of stdin sent per request: base64 of it stays well under moatd's 1 MiB JSON body limit. */
const STDIN_PIECE = 512 << 10;

/**
 * Writes all of `data` to a process's stdin, in pieces moatd takes (a JSON
 * body is at most 1 MiB), sending a piece again when moatd answers
 * `stdin_full` (the process has not read the earlier input yet; none of the
 * piece was taken). `close` closes stdin after the last piece.
 */
export async function writeAll(process: Process, data: string | Uint8Array, close: boolean): Promise<void> {
  const bytes = typeof data === "string" ? Buffer.from(data, "utf8") : Buffer.from(data.buffer, data.byteOffset, data.byteLength);
  if (bytes.length === 0) {
    if (close) await process.closeStdin();
    return;
  }
  for (let at = 0; at < bytes.length; at += STDIN_PIECE) {
    const piece = bytes.subarray(at, at + STDIN_PIECE);
    const last = at + STDIN_PIECE >= bytes.length;
    for (;;) {
      try {
        await process.write(piece, { close: close && last });
        break;
      } catch (e) {
        if (e instanceof ConflictError && e.code === "stdin_full") continue;  // moatd waited 30 s; wait again
        throw e;
      }
    }
  }
}

/** Collects one stream: its text for the callback, its bytes for the result (up to a cap). */
class StreamSink {
  private readonly decoder = new StringDecoder("utf8");
  private readonly parts: Buffer[] = [];
  private kept = 0;
  truncated = false;

  constructor(
    private readonly callback: OutputCallback | undefined,
    private readonly max: number,
  ) {}

  async push(data: Buffer): Promise<void> {
    const room = this.max - this.kept;
    if (room > 0) {
      const piece = data.length <= room ? data : data.subarray(0, room);
      this.parts.push(piece);
      this.kept += piece.length;
    }
    if (data.length > room) this.truncated = true;
    if (this.callback) {
      const text = this.decoder.write(data);
      await this.callback(text, data);
    }
  }

  /** Whatever the decoder still holds (a character cut at the very end). */
  async flush(): Promise<void> {
    const rest = this.decoder.end();
    if (this.callback && rest !== "") await this.callback(rest, Buffer.alloc(0));
  }

  bytes(): Buffer {
    return Buffer.concat(this.parts);
  }
}

function resultOf(final: ExitEvent, out: StreamSink, err: StreamSink, dropped: boolean, processId: number): RunResult {
  const stdoutRaw = out.bytes();
  let stderrRaw = err.bytes();
  if (final.error) {
    // As exec says it: the reason a command could not start is on stderr.
    stderrRaw = Buffer.concat([stderrRaw, Buffer.from(`${final.error}\n`, "utf8")]);
  }
  const result: RunResult = {
    exitCode: final.exit_code,
    ok: final.exit_code === 0,
    signal: final.signal ?? 0,
    timedOut: final.timed_out ?? false,
    stdout: stdoutRaw.toString("utf8"),
    stderr: stderrRaw.toString("utf8"),
    stdoutRaw,
    stderrRaw,
    truncated: out.truncated || err.truncated || dropped,
    processId,
  };
  if (final.error) result.error = final.error;
  return result;
}

function processRequest(cmd: Command, options: CommandOptions, stdin: boolean, pty?: Pick<StartOptions, "pty" | "rows" | "cols">): StartProcessRequest {
  const request: StartProcessRequest = { cmd: toArgv(cmd), stdin, lossless: true };
  if (options.cwd !== undefined) request.cwd = options.cwd;
  if (options.env !== undefined) request.env = options.env;
  if (options.timeoutMs !== undefined) request.timeout_ms = options.timeoutMs;
  if (pty?.pty) {
    request.pty = true;
    if (pty.rows !== undefined) request.rows = pty.rows;
    if (pty.cols !== undefined) request.cols = pty.cols;
  }
  return request;
}

/**
 * A command running in the background (`env.start()`): its output goes to
 * the callbacks as it arrives and is kept for `wait()`.
 */
export class CommandHandle {
  /** The low-level process handle (stdin, signals, resize, output from any offset). */
  readonly process: Process;
  private readonly done: Promise<RunResult>;
  private readonly out: StreamSink;
  private readonly err: StreamSink;
  private finished: RunResult | undefined;
  private stopFollowing: (() => void) | undefined;

  /** @internal Use `env.start()`. */
  constructor(process: Process, options: StartOptions) {
    this.process = process;
    const max = options.maxOutputBytes ?? DEFAULT_MAX_OUTPUT;
    this.out = new StreamSink(options.onStdout, max);
    this.err = new StreamSink(options.onStderr, max);
    this.done = this.follow(options);
    // wait() is optional for a background command: a failure nobody waits
    // for goes to onError, never to an unhandled rejection.
    this.done.catch((e: Error) => options.onError?.(e));
  }

  /** moatd's id of the process (1, 2, ... per environment). */
  get id(): number {
    return this.process.id;
  }

  /** The process id inside the environment. */
  get pid(): number {
    return this.process.pid;
  }

  /** The environment's id. */
  get envId(): string {
    return this.process.envId;
  }

  /** Its stdout so far (up to maxOutputBytes). */
  get stdout(): string {
    return this.out.bytes().toString("utf8");
  }

  get stderr(): string {
    return this.err.bytes().toString("utf8");
  }

  /** The exit code once it ended; undefined while it runs. */
  get exitCode(): number | undefined {
    return this.finished?.exitCode;
  }

  /**
   * Resolves with the result once the command ended and every byte of its
   * output went through the callbacks. Rejects when it can no longer be
   * followed: ConflictError `gone` when the environment ended first.
   */
  wait(): Promise<RunResult> {
    return this.done;
  }

  /**
   * Sends a signal (default KILL) to the command's process group. Resolves
   * true when sent, false when the command had already ended.
   */
  async kill(signal: string | number = "KILL"): Promise<boolean> {
    if (this.finished) return false;
    try {
      await this.process.signal(signal);
      return true;
    } catch (e) {
      if (e instanceof ConflictError) return false;  // it ended meanwhile
      throw e;
    }
  }

  /**
   * Writes to its stdin (started with `stdin: true`), in pieces of at most
   * 512 KiB, waiting while the command has not read earlier input.
   */
  write(data: string | Uint8Array): Promise<void> {
    return writeAll(this.process, data, false);
  }

  /** Closes its stdin (EOF). */
  closeStdin(): Promise<void> {
    return this.process.closeStdin();
  }

  /**
   * Stops following: the command runs on in the environment (moatd keeps its
   * output), the callbacks get nothing more and `wait()` rejects with a
   * MoatAbortError. Reattach with `env.processes.get(id)`.
   */
  detach(): void {
    this.stopFollowing?.();
  }

  private async follow(options: StartOptions): Promise<RunResult> {
    const controller = new AbortController();
    const outer = options.signal;
    const onOuterAbort = () => controller.abort(outer?.reason);
    outer?.addEventListener("abort", onOuterAbort, { once: true });
    this.stopFollowing = () => controller.abort(new Error("detached"));
    const stream = this.process.output({ since: 0, follow: true, signal: controller.signal });
    let dropped = false;
    let callbackError: { error: unknown } | undefined;
    try {
      for await (const event of stream) {
        if (event.type === "output") {
          try {
            await (event.stream === "stderr" ? this.err : this.out).push(event.data);
          } catch (e) {
            callbackError = { error: e };
            break;  // ends the request
          }
        } else if (event.type === "dropped") {
          dropped = true;
        }
      }
      if (!callbackError) {
        try {
          await this.out.flush();
          await this.err.flush();
        } catch (e) {
          callbackError = { error: e };
        }
      }
    } finally {
      outer?.removeEventListener("abort", onOuterAbort);
    }
    if (callbackError) {
      // Nobody would read on: a throwing callback ends the command.
      await this.process.signal("KILL").catch(() => undefined);
      throw callbackError.error;
    }
    const final = stream.final;
    if (!final) throw new MoatAbortError(controller.signal.reason);
    if (final.type === "end") {
      throw new ConflictError({ status: 409, code: "gone", message: `process ${this.id} can no longer be followed: ${final.reason}` });
    }
    this.finished = resultOf(final, this.out, this.err, dropped, this.id);
    await options.onExit?.(this.finished);
    return this.finished;
  }
}

/**
 * Starts `cmd` in the background in environment `envId` and returns its
 * handle at once (once the gate allows it).
 */
export async function startCommand(processes: Processes, envId: string, cmd: Command, options: StartOptions = {}): Promise<CommandHandle> {
  const { stdin } = options;
  const feed = stdin === undefined || typeof stdin === "boolean" ? undefined : stdin;
  const request = processRequest(cmd, options, stdin !== undefined && stdin !== false, options);
  const gated: GatedOptions = {};
  if (options.approval !== undefined) gated.approval = options.approval;
  if (options.signal !== undefined) gated.signal = options.signal;
  const process = await processes.start(envId, request, gated);
  const handle = new CommandHandle(process, options);
  if (feed !== undefined) {
    try {
      await writeAll(process, feed, true);
    } catch (e) {
      // It ended before reading (a command that ignores stdin): not an error.
      if (!(e instanceof ConflictError)) {
        await handle.kill().catch(() => undefined);
        handle.detach();
        throw e;
      }
    }
  }
  return handle;
}

/**
 * Runs `cmd` to its end in environment `envId`: output reaches the callbacks
 * as it comes; resolves with the result. An AbortSignal kills the command.
 */
export async function runCommand(processes: Processes, envId: string, cmd: Command, options: RunOptions = {}): Promise<RunResult> {
  const { onExit: _ignored, check, ...rest } = options as StartOptions & RunOptions;
  void _ignored;
  const handle = await startCommand(processes, envId, cmd, { ...rest, onError: () => undefined });
  const signal = options.signal;
  const onAbort = () => void handle.process.signal("KILL").catch(() => undefined);
  signal?.addEventListener("abort", onAbort, { once: true });
  let result: RunResult;
  try {
    result = await handle.wait();
  } finally {
    signal?.removeEventListener("abort", onAbort);
  }
  if (check && result.exitCode !== 0) throw new CommandError(handle.process.info.cmd, result);
  return result;
}
