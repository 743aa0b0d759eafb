// GET /v1/environments/{id}/shell: a terminal over a WebSocket. Binary
// frames carry terminal bytes both ways; text frames carry JSON control
// messages (resize and signal from us; exit, end and error from moatd).

import { EventEmitter } from "node:events";

import { type Transport, seg } from "./client.js";
import { WebSocketClient } from "./websocket.js";
import type { FinalEvent, ShellControlMessage, ShellOptions } from "./types.js";

export interface ShellEvents {
  /** Terminal output. */
  data: [chunk: Buffer];
  /** A control message from moatd (`hello`, `exit`, `end`, `error`). */
  message: [message: ShellControlMessage];
  /** The final event: how the session ended. */
  exit: [event: FinalEvent];
  close: [];
}

/**
 * An interactive terminal in an environment. Read its output with
 * `for await (const chunk of shell)` (or `shell.on("data", ...)`), write with
 * `write()`, and await `exited` for how it ended.
 */
export class Shell extends EventEmitter<ShellEvents> implements AsyncIterable<Buffer> {
  /**
   * Resolves with moatd's final event (`{type: "exit", exit_code, ...}` or
   * `{type: "end", reason}`) or, when the connection closed without one
   * (`close()`, a broken connection), an `end` event saying so. Never rejects.
   */
  readonly exited: Promise<FinalEvent>;
  /**
   * moatd's id of the terminal's process (from its first `hello` message):
   * other viewers attach with `{ process: shell.processId }`.
   */
  processId: number | undefined;
  /** Error messages moatd sent about control messages it could not apply. */
  readonly errors: string[] = [];
  private final: FinalEvent | undefined;
  private resolveExited!: (event: FinalEvent) => void;
  private readonly queue: Buffer[] = [];
  private waiter: (() => void) | undefined;
  private ended = false;
  private iterating = false;

  constructor(private readonly ws: WebSocketClient) {
    super();
    this.exited = new Promise((resolve) => (this.resolveExited = resolve));
    ws.on("message", (data, binary) => (binary ? this.onOutput(data) : this.onControl(data)));
    ws.on("close", (code, reason) => {
      this.settle({ type: "end", reason: `the shell connection closed (${code}${reason ? `: ${reason}` : ""})` });
      this.ended = true;
      this.wake();
      this.emit("close");
    });
  }

  /** Whether the WebSocket is still open. */
  get open(): boolean {
    return this.ws.state === "open";
  }

  /** Types into the terminal. */
  write(data: string | Uint8Array): Promise<void> {
    return this.ws.sendBinary(typeof data === "string" ? Buffer.from(data, "utf8") : data);
  }

  /** Resizes the terminal (the shell gets SIGWINCH). */
  resize(rows: number, cols: number): Promise<void> {
    return this.ws.sendText(JSON.stringify({ type: "resize", rows, cols }));
  }

  /** Sends a signal (`"INT"`, `"TERM"`, a number) to the terminal's process group. */
  signal(signal: string | number): Promise<void> {
    return this.ws.sendText(JSON.stringify({ type: "signal", signal }));
  }

  /**
   * Leaves the terminal. When the last viewer of a shell leaves, moatd hangs
   * it up (SIGHUP). Resolves once the connection is closed.
   */
  close(): Promise<void> {
    return this.ws.close(1000, "");
  }

  /** Terminal output until the session ends. Output is kept for the iterator until it is read. */
  async *[Symbol.asyncIterator](): AsyncGenerator<Buffer, void, undefined> {
    this.iterating = true;
    for (;;) {
      const chunk = this.queue.shift();
      if (chunk) {
        yield chunk;
        continue;
      }
      if (this.ended) return;
      await new Promise<void>((resolve) => (this.waiter = resolve));
    }
  }

  private wake(): void {
    const w = this.waiter;
    this.waiter = undefined;
    w?.();
  }

  private onOutput(data: Buffer): void {
    // With a 'data' listener and nobody iterating, do not hoard the output.
    if (this.iterating || this.listenerCount("data") === 0) this.queue.push(data);
    this.emit("data", data);
    this.wake();
  }

  private onControl(data: Buffer): void {
    let message: ShellControlMessage;
    try {
      message = JSON.parse(data.toString("utf8")) as ShellControlMessage;
    } catch {
      return;
    }
    this.emit("message", message);
    if (message.type === "hello" && typeof message.process === "number") this.processId = message.process;
    else if (message.type === "exit" || message.type === "end") this.settle(message as FinalEvent);
    else if (message.type === "error" && typeof message.message === "string") this.errors.push(message.message);
  }

  private settle(event: FinalEvent): void {
    if (this.final) return;
    this.final = event;
    this.emit("exit", event);
    this.resolveExited(event);
  }
}

export async function openShell(transport: Transport, envId: string, options: ShellOptions = {}): Promise<Shell> {
  const ws = await WebSocketClient.connect(transport, {
    path: `/v1/environments/${seg(envId)}/shell`,
    query: { rows: options.rows, cols: options.cols, process: options.process },
    timeoutMs: options.timeoutMs,
    signal: options.signal,
  });
  return new Shell(ws);
}
