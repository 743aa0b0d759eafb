// A minimal RFC 6455 WebSocket client over node:http's `upgrade` (Node 20 has
// no global WebSocket and the SDK has no dependencies): the handshake with
// Sec-WebSocket-Accept checked, masked client frames, text, binary, ping,
// pong, close and fragmented messages.

import { createHash, randomBytes } from "node:crypto";
import { EventEmitter } from "node:events";
import type { Socket } from "node:net";

import type { Call, Transport } from "./client.js";
import { MoatConnectionError, MoatError } from "./errors.js";

const GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
const MAX_MESSAGE = 64 * 1024 * 1024;
const CLOSE_WAIT_MS = 2_000;

export const Opcode = {
  continuation: 0x0,
  text: 0x1,
  binary: 0x2,
  close: 0x8,
  ping: 0x9,
  pong: 0xa,
} as const;

/** The Sec-WebSocket-Accept a server must answer to `key`. */
export function acceptKey(key: string): string {
  return createHash("sha1").update(key + GUID).digest("base64");
}

/** One frame; a client masks what it sends (a server must not). */
export function encodeFrame(opcode: number, payload: Uint8Array, mask = true, fin = true): Buffer {
  const n = payload.length;
  const lengthBytes = n < 126 ? 0 : n < 65536 ? 2 : 8;
  const head = Buffer.alloc(2 + lengthBytes + (mask ? 4 : 0));
  head[0] = (fin ? 0x80 : 0) | opcode;
  head[1] = (mask ? 0x80 : 0) | (n < 126 ? n : n < 65536 ? 126 : 127);
  if (lengthBytes === 2) head.writeUInt16BE(n, 2);
  if (lengthBytes === 8) head.writeBigUInt64BE(BigInt(n), 2);
  if (!mask) return Buffer.concat([head, payload]);
  const key = randomBytes(4);
  key.copy(head, 2 + lengthBytes);
  const body = Buffer.allocUnsafe(n);
  for (let i = 0; i < n; i++) body[i] = payload[i]! ^ key[i & 3]!;
  return Buffer.concat([head, body]);
}

export interface Frame {
  fin: boolean;
  opcode: number;
  payload: Buffer;
}

export class WebSocketProtocolError extends Error {
  constructor(
    message: string,
    readonly closeCode = 1002,
  ) {
    super(message);
  }
}

/** Splits received bytes into frames; `expectMasked` is false on a client. */
export class FrameParser {
  private buffer: Buffer = Buffer.alloc(0);

  constructor(private readonly expectMasked = false) {}

  push(chunk: Buffer): Frame[] {
    this.buffer = this.buffer.length ? Buffer.concat([this.buffer, chunk]) : chunk;
    const frames: Frame[] = [];
    for (;;) {
      const b = this.buffer;
      if (b.length < 2) break;
      const fin = (b[0]! & 0x80) !== 0;
      if (b[0]! & 0x70) throw new WebSocketProtocolError("reserved bits set");
      const opcode = b[0]! & 0x0f;
      const masked = (b[1]! & 0x80) !== 0;
      if (masked !== this.expectMasked) {
        throw new WebSocketProtocolError(this.expectMasked ? "client frames must be masked" : "server frames must not be masked");
      }
      let length = b[1]! & 0x7f;
      let pos = 2;
      if (length === 126) {
        if (b.length < 4) break;
        length = b.readUInt16BE(2);
        pos = 4;
      } else if (length === 127) {
        if (b.length < 10) break;
        const big = b.readBigUInt64BE(2);
        if (big > BigInt(MAX_MESSAGE)) throw new WebSocketProtocolError("frame too large", 1009);
        length = Number(big);
        pos = 10;
      }
      if (opcode >= 0x8 && (length > 125 || !fin)) throw new WebSocketProtocolError("bad control frame");
      if (length > MAX_MESSAGE) throw new WebSocketProtocolError("frame too large", 1009);
      const maskAt = pos;
      if (masked) pos += 4;
      if (b.length < pos + length) break;
      let payload = Buffer.from(b.subarray(pos, pos + length));
      if (masked) for (let i = 0; i < length; i++) payload[i] = payload[i]! ^ b[maskAt + (i & 3)]!;
      frames.push({ fin, opcode, payload });
      this.buffer = b.subarray(pos + length);
      if (this.buffer.length === 0) this.buffer = Buffer.alloc(0);
    }
    return frames;
  }
}

export interface WebSocketEvents {
  message: [data: Buffer, binary: boolean];
  close: [code: number, reason: string];
}

/**
 * An open WebSocket. Events: `message` (data, binary) and `close` (code,
 * reason), which comes exactly once.
 */
export class WebSocketClient extends EventEmitter<WebSocketEvents> {
  /** `open`, `closing` (our close frame sent) or `closed`. */
  state: "open" | "closing" | "closed" = "open";
  /** The close code and reason, once closed (1006: the connection broke without a close frame). */
  closeCode = 0;
  closeReason = "";
  private readonly parser = new FrameParser(false);
  private fragments: Buffer[] = [];
  private fragmentOpcode = 0;
  private fragmentBytes = 0;
  private closeSent = false;
  private closeTimer: NodeJS.Timeout | undefined;
  private readonly closedPromise: Promise<void>;

  /** Opens a WebSocket with a GET through `transport` (token included). */
  static async connect(transport: Transport, call: Omit<Call, "method">): Promise<WebSocketClient> {
    const key = randomBytes(16).toString("base64");
    const { res, socket, head } = await transport.upgrade({
      ...call,
      method: "GET",
      headers: {
        ...(call.headers ?? {}),
        Connection: "Upgrade",
        Upgrade: "websocket",
        "Sec-WebSocket-Version": "13",
        "Sec-WebSocket-Key": key,
      },
    });
    const accept = res.headers["sec-websocket-accept"];
    if (res.statusCode !== 101 || String(res.headers.upgrade ?? "").toLowerCase() !== "websocket" || accept !== acceptKey(key)) {
      socket.destroy();
      throw new MoatError({
        status: res.statusCode ?? 0,
        code: "bad_handshake",
        message: `${call.path}: the WebSocket handshake failed (Sec-WebSocket-Accept ${accept ? "does not match" : "missing"})`,
      });
    }
    return new WebSocketClient(socket, head);
  }

  constructor(
    private readonly socket: Socket,
    head: Buffer = Buffer.alloc(0),
  ) {
    super();
    socket.setNoDelay(true);
    socket.setTimeout(0);
    this.closedPromise = new Promise((resolve) => this.once("close", () => resolve()));
    socket.on("error", () => undefined);  // 'close' follows and reports it
    socket.on("end", () => socket.end());
    socket.on("close", () => this.finish(this.closeCode || 1006, this.closeReason || "the connection closed"));
    // Reading starts on the next turn of the event loop, so whoever awaited
    // the connection has attached its 'message' listener by then. Until a
    // 'data' listener is attached the upgraded socket does not flow.
    setImmediate(() => {
      if (head.length) this.receive(head);
      socket.on("data", (chunk: Buffer) => this.receive(chunk));
    });
  }

  /** Resolves once the connection is closed. */
  get closed(): Promise<void> {
    return this.closedPromise;
  }

  /** Sends a text frame; resolves when written. */
  sendText(text: string): Promise<void> {
    return this.send(Opcode.text, Buffer.from(text, "utf8"));
  }

  /** Sends a binary frame; resolves when written. */
  sendBinary(data: Uint8Array): Promise<void> {
    return this.send(Opcode.binary, data);
  }

  ping(data: Uint8Array = Buffer.alloc(0)): Promise<void> {
    return this.send(Opcode.ping, data);
  }

  /** Starts the closing handshake; resolves once the connection is closed. */
  close(code = 1000, reason = ""): Promise<void> {
    if (this.state === "open") {
      this.state = "closing";
      this.sendClose(code, reason);
      this.closeTimer = setTimeout(() => this.socket.destroy(), CLOSE_WAIT_MS);
    }
    return this.closedPromise;
  }

  /** Drops the connection without a closing handshake. */
  terminate(): void {
    this.socket.destroy();
  }

  private send(opcode: number, payload: Uint8Array): Promise<void> {
    if (this.state !== "open") {
      return Promise.reject(new MoatConnectionError("the WebSocket is closed"));
    }
    return new Promise((resolve, reject) => {
      this.socket.write(encodeFrame(opcode, payload), (err) =>
        err ? reject(new MoatConnectionError(`the WebSocket broke (${err.message})`, err)) : resolve(),
      );
    });
  }

  private sendClose(code: number, reason: string): void {
    if (this.closeSent || this.socket.destroyed) return;
    this.closeSent = true;
    const payload = code ? Buffer.concat([Buffer.from([code >> 8, code & 0xff]), Buffer.from(reason, "utf8").subarray(0, 123)]) : Buffer.alloc(0);
    this.socket.write(encodeFrame(Opcode.close, payload));
  }

  private fail(code: number, reason: string): void {
    this.closeCode = code;
    this.closeReason = reason;
    this.sendClose(code, reason);
    this.socket.end();
    this.closeTimer ??= setTimeout(() => this.socket.destroy(), CLOSE_WAIT_MS);
  }

  private receive(chunk: Buffer): void {
    if (this.state === "closed") return;
    let frames: Frame[];
    try {
      frames = this.parser.push(chunk);
    } catch (e) {
      const err = e as WebSocketProtocolError;
      this.fail(err.closeCode ?? 1002, err.message);
      return;
    }
    for (const frame of frames) {
      if (this.closeCode) return;  // closed, or a close frame came
      this.handle(frame);
    }
  }

  private handle({ fin, opcode, payload }: Frame): void {
    switch (opcode) {
      case Opcode.ping:
        if (this.state === "open") void this.send(Opcode.pong, payload).catch(() => undefined);
        return;
      case Opcode.pong:
        return;
      case Opcode.close: {
        this.closeCode = payload.length >= 2 ? payload.readUInt16BE(0) : 1005;
        this.closeReason = payload.length > 2 ? payload.subarray(2).toString("utf8") : "";
        // Echo the close (once) and let the server end the TCP connection.
        this.sendClose(payload.length >= 2 ? this.closeCode : 1000, "");
        this.state = "closing";
        this.socket.end();
        this.closeTimer ??= setTimeout(() => this.socket.destroy(), CLOSE_WAIT_MS);
        return;
      }
      case Opcode.text:
      case Opcode.binary:
        if (this.fragmentOpcode) return this.fail(1002, "a new message inside a fragmented one");
        if (fin) {
          this.emit("message", payload, opcode === Opcode.binary);
          return;
        }
        this.fragmentOpcode = opcode;
        this.fragments = [payload];
        this.fragmentBytes = payload.length;
        return;
      case Opcode.continuation: {
        if (!this.fragmentOpcode) return this.fail(1002, "a continuation without a message");
        this.fragments.push(payload);
        this.fragmentBytes += payload.length;
        if (this.fragmentBytes > MAX_MESSAGE) return this.fail(1009, "message too large");
        if (!fin) return;
        const data = Buffer.concat(this.fragments);
        const binary = this.fragmentOpcode === Opcode.binary;
        this.fragments = [];
        this.fragmentOpcode = 0;
        this.fragmentBytes = 0;
        this.emit("message", data, binary);
        return;
      }
      default:
        this.fail(1002, `unknown opcode ${opcode}`);
    }
  }

  private finish(code: number, reason: string): void {
    if (this.state === "closed") return;
    this.state = "closed";
    this.closeCode = code;
    this.closeReason = reason;
    if (this.closeTimer) clearTimeout(this.closeTimer);
    this.socket.destroy();
    this.emit("close", code, reason);
  }
}
