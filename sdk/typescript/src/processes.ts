// /v1/environments/{id}/processes: background commands, their output log
// (NDJSON, from any offset, optionally followed), stdin, signals, resize.

import type { ClientRequest } from "node:http";

import { type Transport, gatedCall, seg } from "./client.js";
import { MoatAbortError, MoatConnectionError, MoatError, MoatTimeoutError } from "./errors.js";
import type {
  Encoding,
  FinalEvent,
  GatedOptions,
  OutputEvent,
  OutputOptions,
  ProcessInfo,
  ProcessState,
  RequestOptions,
  StartProcessRequest,
} from "./types.js";

/** Turns one NDJSON line into a typed event (output data decoded to a Buffer). */
export function parseOutputEvent(line: string): OutputEvent {
  const raw = JSON.parse(line) as Record<string, unknown> & { type?: unknown };
  if (raw.type === "output") {
    const encoding = raw.encoding === "base64" ? "base64" : "utf8";
    const text = typeof raw.data === "string" ? raw.data : "";
    return {
      type: "output",
      stream: raw.stream === "stderr" ? "stderr" : "stdout",
      offset: Number(raw.offset),
      data: Buffer.from(text, encoding),
      encoding,
    };
  }
  return raw as unknown as OutputEvent;
}

/** The offset after an event: where the next read starts. */
export function offsetAfter(event: OutputEvent): number | undefined {
  switch (event.type) {
    case "output":
      return event.offset + event.data.length;
    case "dropped":
      return event.offset + event.bytes;
    default:
      return typeof event.offset === "number" ? event.offset : undefined;
  }
}

/**
 * A process's output from an offset: `for await (const event of stream)`.
 * `offset` is always where the next read would start, so after a `break` a
 * new `output({ since: stream.offset })` (or iterating this stream again)
 * continues without losing or repeating a byte. Breaking out of the loop, or
 * `close()`, ends the HTTP request.
 */
export class OutputStream implements AsyncIterable<OutputEvent> {
  /** Where the next read starts (moatd's byte offset, both streams together). */
  offset: number;
  /** The `exit` or `end` event, once seen. */
  final: FinalEvent | undefined;
  private req: ClientRequest | undefined;
  private closed = false;

  constructor(
    private readonly transport: Transport,
    private readonly path: string,
    private readonly options: OutputOptions = {},
  ) {
    this.offset = options.since ?? 0;
  }

  /** Ends the stream: a pending or later iteration finishes without error. */
  close(): void {
    this.closed = true;
    this.req?.destroy();
  }

  /** Collects every output byte until the stream ends (with follow: until the process ends). */
  async collect(): Promise<{ stdout: Buffer; stderr: Buffer; output: Buffer; final: FinalEvent | undefined }> {
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    const all: Buffer[] = [];
    for await (const event of this) {
      if (event.type !== "output") continue;
      (event.stream === "stderr" ? err : out).push(event.data);
      all.push(event.data);
    }
    return { stdout: Buffer.concat(out), stderr: Buffer.concat(err), output: Buffer.concat(all), final: this.final };
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<OutputEvent, void, undefined> {
    const { follow = false, encoding, signal } = this.options;
    const idleTimeoutMs = this.options.idleTimeoutMs ?? 60_000;
    let failures = 0;
    while (!this.final && !this.closed) {
      const { req, res } = await this.transport.stream({
        method: "GET",
        path: this.path,
        query: { since: this.offset, follow: follow ? true : undefined, encoding },
        timeoutMs: this.options.timeoutMs,
        signal,
      });
      this.req = req;
      if (this.closed) req.destroy();
      let stop: MoatError | undefined;  // why we broke the connection ourselves
      let idle: NodeJS.Timeout | undefined;
      const armIdle = () => {
        if (!follow || idleTimeoutMs <= 0) return;
        if (idle) clearTimeout(idle);
        idle = setTimeout(() => {
          stop = new MoatTimeoutError(`no output or heartbeat for ${idleTimeoutMs} ms while following ${this.path}`);
          req.destroy();
        }, idleTimeoutMs);
      };
      const onAbort = () => {
        stop = new MoatAbortError(signal?.reason);
        req.destroy();
      };
      signal?.addEventListener("abort", onAbort, { once: true });
      armIdle();
      let pending: Buffer = Buffer.alloc(0);
      let broken: unknown;
      try {
        for await (const chunk of res as AsyncIterable<Buffer>) {
          armIdle();
          pending = pending.length ? Buffer.concat([pending, chunk]) : chunk;
          let nl: number;
          while ((nl = pending.indexOf(0x0a)) >= 0) {
            const line = pending.subarray(0, nl).toString("utf8").trim();
            pending = pending.subarray(nl + 1);
            if (!line) continue;
            let event: OutputEvent;
            try {
              event = parseOutputEvent(line);
            } catch (e) {
              throw new MoatError({ status: 200, code: "bad_response", message: `a line of ${this.path} is not JSON: ${line.slice(0, 200)}`, cause: e });
            }
            const next = offsetAfter(event);
            if (next !== undefined) this.offset = next;
            failures = 0;
            if (event.type === "exit" || event.type === "end") this.final = event;
            // The consumer's own time does not count as silence.
            if (idle) clearTimeout(idle);
            yield event;
            if (this.final) return;
            armIdle();
          }
        }
      } catch (e) {
        if (e instanceof MoatError && e.code === "bad_response") throw e;
        broken = e;
      } finally {
        if (idle) clearTimeout(idle);
        signal?.removeEventListener("abort", onAbort);
        req.destroy();
        this.req = undefined;
      }
      if (this.closed) return;
      if (stop) throw stop;
      if (!follow && !broken) return;  // what there was, now
      // The connection ended without a final event: follow again from where
      // we are, a bounded number of times (a GET is safe to repeat).
      if (failures >= this.transport.maxRetries) {
        throw new MoatConnectionError(`the output stream of ${this.path} broke before the process ended`, broken);
      }
      await this.transport.backoff(failures++, signal);
    }
  }
}

/**
 * A handle on one process in an environment: its last known `info` and the
 * operations on it.
 */
export class Process {
  constructor(
    private readonly api: Processes,
    /** The environment's id. */
    readonly envId: string,
    /** What moatd last said about the process (see `refresh()`). */
    public info: ProcessInfo,
  ) {}

  /** moatd's id for the process (used in every path). */
  get id(): number {
    return this.info.id;
  }
  /** The process id inside the environment. */
  get pid(): number {
    return this.info.pid;
  }
  get state(): ProcessState {
    return this.info.state;
  }
  get exit_code(): number | undefined {
    return this.info.exit_code;
  }
  get output_offset(): number {
    return this.info.output_offset;
  }

  /** Fetches the process again and updates `info`. */
  async refresh(options: RequestOptions = {}): Promise<ProcessInfo> {
    this.info = (await this.api.get(this.envId, this.id, options)).info;
    return this.info;
  }

  /** Its output from `since` (default 0); with `follow`, until it ends. */
  output(options: OutputOptions = {}): OutputStream {
    return this.api.output(this.envId, this.id, options);
  }

  /**
   * Writes to its stdin (a Buffer goes as base64). While 1 MiB of earlier
   * input waits unread, it waits up to `waitMs` (default 30 s) for the
   * process to read, then throws ConflictError `stdin_full` (none of `data`
   * was taken: write it again).
   */
  write(data: string | Uint8Array, options: RequestOptions & { close?: boolean; waitMs?: number } = {}): Promise<void> {
    return this.api.writeStdin(this.envId, this.id, data, options);
  }

  /** Closes its stdin (EOF; on a terminal, the EOF character). */
  closeStdin(options: RequestOptions = {}): Promise<void> {
    return this.api.closeStdin(this.envId, this.id, options);
  }

  /** Sends a signal (`"TERM"`, `"SIGINT"`, 9) to its process group. */
  signal(signal: string | number, options: RequestOptions = {}): Promise<void> {
    return this.api.signal(this.envId, this.id, signal, options);
  }

  /** Resizes a pty process's terminal. */
  resize(rows: number, cols: number, options: RequestOptions = {}): Promise<void> {
    return this.api.resize(this.envId, this.id, rows, cols, options);
  }

  /**
   * Waits until the process ends (following its output from the end known so
   * far, without keeping it) and returns the final event; `info` is refreshed.
   */
  async wait(options: Omit<OutputOptions, "since" | "follow"> = {}): Promise<FinalEvent | undefined> {
    const stream = this.output({ ...options, since: this.info.output_offset, follow: true });
    for await (const event of stream) void event;
    if (stream.final?.type === "exit") await this.refresh(options).catch(() => undefined);
    return stream.final;
  }
}

export class Processes {
  constructor(private readonly transport: Transport) {}

  private base(envId: string, id?: number, action?: string): string {
    let p = `/v1/environments/${seg(envId)}/processes`;
    if (id !== undefined) p += `/${seg(id)}`;
    if (action) p += `/${action}`;
    return p;
  }

  /**
   * Starts a command in the background; returns at once with its handle (once
   * the gate allows it: see GatedOptions for `approval: "async"`).
   */
  async start(envId: string, request: StartProcessRequest, options: GatedOptions = {}): Promise<Process> {
    const info = await this.transport.json<ProcessInfo>({ method: "POST", path: this.base(envId), json: request, ...gatedCall(options) });
    return new Process(this, envId, info);
  }

  /** The environment's processes (execs and shells included). */
  async list(envId: string, options: RequestOptions = {}): Promise<Process[]> {
    const answer = await this.transport.json<{ processes: ProcessInfo[] }>({ method: "GET", path: this.base(envId), ...options });
    return answer.processes.map((info) => new Process(this, envId, info));
  }

  async get(envId: string, id: number, options: RequestOptions = {}): Promise<Process> {
    const info = await this.transport.json<ProcessInfo>({ method: "GET", path: this.base(envId, id), ...options });
    return new Process(this, envId, info);
  }

  /** Output events from `since`; see OutputStream. */
  output(envId: string, id: number, options: OutputOptions = {}): OutputStream {
    return new OutputStream(this.transport, this.base(envId, id, "output"), options);
  }

  async writeStdin(
    envId: string,
    id: number,
    data: string | Uint8Array,
    options: RequestOptions & { close?: boolean; waitMs?: number } = {},
  ): Promise<void> {
    const { close, waitMs, ...rest } = options;
    const encoding: Encoding = typeof data === "string" ? "utf8" : "base64";
    const body: Record<string, unknown> = {
      data: typeof data === "string" ? data : Buffer.from(data).toString("base64"),
      encoding,
    };
    if (close) body.close = true;
    if (waitMs !== undefined) body.wait_ms = waitMs;
    await this.transport.json({ method: "POST", path: this.base(envId, id, "stdin"), json: body, ...rest });
  }

  async closeStdin(envId: string, id: number, options: RequestOptions = {}): Promise<void> {
    await this.transport.json({ method: "POST", path: this.base(envId, id, "stdin"), json: { close: true }, ...options });
  }

  async signal(envId: string, id: number, signal: string | number, options: RequestOptions = {}): Promise<void> {
    await this.transport.json({ method: "POST", path: this.base(envId, id, "signal"), json: { signal }, ...options });
  }

  async resize(envId: string, id: number, rows: number, cols: number, options: RequestOptions = {}): Promise<void> {
    await this.transport.json({ method: "POST", path: this.base(envId, id, "resize"), json: { rows, cols }, ...options });
  }
}
