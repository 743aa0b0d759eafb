// The transport: one HTTP/1.1 request to moatd over TCP or its unix socket,
// with the token, a timeout, an AbortSignal, typed errors and bounded retries
// of idempotent calls. Everything else in the SDK goes through here.

import http from "node:http";
import https from "node:https";
import type { Socket } from "node:net";
import { setTimeout as sleepTimer } from "node:timers/promises";

import { type TokenLookup, lookUpToken, noTokenMessage, resolveUrl } from "./discovery.js";
import {
  MoatAbortError,
  MoatConnectionError,
  MoatError,
  MoatTimeoutError,
  NoTokenError,
  errorFromResponse,
  pendingFromResponse,
} from "./errors.js";
import type { GatedOptions } from "./types.js";

export const SDK_VERSION = "0.1.0";

export interface MoatOptions {
  /**
   * `http://127.0.0.1:7070` (a path prefix is kept), `https://...` behind a
   * proxy, or `unix:/var/lib/moat/moatd.sock`. Default, as for the CLI:
   * `$MOAT_URL`, else `unix:<state>/moatd.sock`.
   */
  baseUrl?: string;
  /**
   * The master token or an API key. Default, as for the CLI: `$MOAT_TOKEN`,
   * else the file `<state>/master-token` (read when a request first needs
   * it). Without any, requests throw NoTokenError naming every place looked at.
   */
  token?: string;
  /** moatd's state directory (for the default address and token file). Default: `$MOAT_STATE`, else `/var/lib/moat`. */
  stateDir?: string;
  /** Per-request timeout in ms (default 60 000); each call may override it. 0 waits forever. */
  timeoutMs?: number;
  /**
   * How many times an idempotent call (GET, DELETE, PUT of a file) is retried
   * after a connection error or a 503/429 answer (default 2), waiting at
   * least what a 429's Retry-After asks (up to 30 s; a longer one is thrown
   * at once). POSTs never are.
   */
  maxRetries?: number;
  /** The first retry's delay in ms (default 200); it doubles each time, with jitter. */
  retryDelayMs?: number;
  /** Extra headers sent with every request. */
  headers?: Record<string, string>;
}

export type Method = "GET" | "POST" | "PUT" | "DELETE";
export type QueryValue = string | number | boolean | undefined | null | readonly string[];

export interface Call {
  method: Method;
  /** Starts with `/`; segments already escaped (see `seg`). */
  path: string;
  query?: Record<string, QueryValue>;
  /** Sent as JSON. */
  json?: unknown;
  /** Sent as is (application/octet-stream). */
  body?: Uint8Array;
  headers?: Record<string, string>;
  timeoutMs?: number | undefined;
  signal?: AbortSignal | undefined;
}

export interface Answer {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: Buffer;
}

export interface Upgraded {
  res: http.IncomingMessage;
  socket: Socket;
  head: Buffer;
}

interface Endpoint {
  module: typeof http | typeof https;
  host?: string;
  port?: number;
  socketPath?: string;
  prefix: string;
  display: string;
}

/**
 * The transport fields of a gated call's options: `approval: "async"` becomes
 * `Prefer: respond-async` (moatd then answers 202 instead of waiting for a
 * person, which the transport turns into an ApprovalPendingError).
 */
export function gatedCall(options: GatedOptions): Pick<Call, "headers" | "timeoutMs" | "signal"> {
  const call: Pick<Call, "headers" | "timeoutMs" | "signal"> = { timeoutMs: options.timeoutMs, signal: options.signal };
  if (options.approval === "async") call.headers = { Prefer: "respond-async" };
  else if (options.approval !== undefined && options.approval !== "wait") {
    throw new TypeError(`approval: "wait" or "async", not ${JSON.stringify(options.approval)}`);
  }
  return call;
}

/**
 * Escapes one path segment. `.` and `..` are escaped too (`%2E`), so an id
 * or name can never act as a dot-segment that a proxy in front of moatd
 * (or URL normalization) would resolve to another endpoint.
 */
export function seg(value: string | number): string {
  const text = String(value);
  if (text === "." || text === "..") return text.replace(/\./g, "%2E");
  return encodeURIComponent(text);
}

function parseBaseUrl(baseUrl: string): Endpoint {
  if (baseUrl.startsWith("unix:")) {
    let socketPath = baseUrl.slice("unix:".length);
    if (socketPath.startsWith("//")) socketPath = socketPath.slice(2);  // unix:///path
    if (!socketPath.startsWith("/")) throw new TypeError(`baseUrl ${baseUrl}: a unix socket needs an absolute path`);
    return { module: http, socketPath, prefix: "", display: baseUrl };
  }
  let url: URL;
  try {
    url = new URL(baseUrl);
  } catch {
    throw new TypeError(`baseUrl ${baseUrl} is neither http(s)://host:port nor unix:/path`);
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") {
    throw new TypeError(`baseUrl ${baseUrl}: only http:, https: and unix: are supported`);
  }
  const secure = url.protocol === "https:";
  return {
    module: secure ? https : http,
    host: url.hostname.replace(/^\[(.*)\]$/, "$1"),
    port: url.port ? Number(url.port) : secure ? 443 : 80,
    prefix: url.pathname.replace(/\/+$/, ""),
    display: `${url.protocol}//${url.host}${url.pathname.replace(/\/+$/, "")}`,
  };
}

function buildPath(prefix: string, path: string, query?: Record<string, QueryValue>): string {
  const params = new URLSearchParams();
  for (const [k, v] of Object.entries(query ?? {})) {
    if (v === undefined || v === null) continue;
    if (Array.isArray(v)) {
      for (const item of v) params.append(k, item);
    } else if (typeof v === "boolean") {
      params.append(k, v ? "1" : "0");
    } else {
      params.append(k, String(v));
    }
  }
  const qs = params.toString();
  return prefix + path + (qs ? `?${qs}` : "");
}

/** A Retry-After longer than this is not waited for: the error goes to the caller. */
const MAX_RETRY_AFTER_MS = 30_000;

/** Network-level failures worth another attempt of an idempotent call. */
function retryable(e: unknown): boolean {
  if (e instanceof MoatConnectionError) return true;
  return e instanceof MoatError && (e.status === 503 || e.status === 429);
}

export class Transport {
  readonly baseUrl: string;
  /** Where `baseUrl` came from (the option, $MOAT_URL, or the state directory's socket). */
  readonly baseUrlSource: string;
  readonly timeoutMs: number;
  readonly maxRetries: number;
  readonly retryDelayMs: number;
  private readonly endpoint: Endpoint;
  private readonly discovery: { token?: string | undefined; stateDir?: string | undefined };
  private tokenLookup: TokenLookup;
  private readonly extraHeaders: Record<string, string>;
  private readonly agent: http.Agent;

  constructor(options: MoatOptions = {}) {
    const url = resolveUrl(options);
    this.baseUrl = url.url;
    this.baseUrlSource = url.source;
    try {
      this.endpoint = parseBaseUrl(this.baseUrl);
    } catch (e) {
      // Say which setting holds the bad address.
      if (url.source === "$MOAT_URL") throw new TypeError(`MOAT_URL: ${(e as Error).message}`);
      throw e;
    }
    this.discovery = { token: options.token, stateDir: options.stateDir };
    this.tokenLookup = lookUpToken(this.discovery);
    this.timeoutMs = options.timeoutMs ?? 60_000;
    this.maxRetries = Math.max(0, options.maxRetries ?? 2);
    this.retryDelayMs = options.retryDelayMs ?? 200;
    this.extraHeaders = { ...(options.headers ?? {}) };
    // Idle sockets are dropped well before moatd's own idle limit (120 s), so
    // a request is never sent on a connection moatd is closing.
    const agentOptions = { keepAlive: true, timeout: 15_000 };
    this.agent = this.endpoint.module === https ? new https.Agent(agentOptions) : new http.Agent(agentOptions);
  }

  /**
   * The token requests carry, looked for as the CLI does; the state
   * directory's file is read again while it gives none.
   */
  private currentToken(): TokenLookup {
    if (this.tokenLookup.token === undefined) this.tokenLookup = lookUpToken(this.discovery);
    return this.tokenLookup;
  }

  /** Where the token came from (`the token option`, `$MOAT_TOKEN`, the file's path), or undefined when none was found. */
  get tokenSource(): string | undefined {
    const found = this.currentToken();
    return found.token === undefined ? undefined : found.source;
  }

  /** Closes idle keep-alive connections. The client stays usable. */
  close(): void {
    this.agent.destroy();
  }

  /** One call; error answers throw; idempotent calls are retried. */
  async request(call: Call): Promise<Answer> {
    return this.withRetries(call, () => this.once(call, "buffer") as Promise<Answer>);
  }

  /** A call whose JSON answer (or nothing, for 204) is returned. */
  async json<T>(call: Call): Promise<T> {
    const answer = await this.request(call);
    if (answer.status === 204 || answer.body.length === 0) return undefined as T;
    try {
      return JSON.parse(answer.body.toString("utf8")) as T;
    } catch (e) {
      throw new MoatError({
        status: answer.status,
        code: "bad_response",
        message: `moatd answered ${call.method} ${call.path} with a body that is not JSON`,
        cause: e,
      });
    }
  }

  /**
   * A call whose successful answer is handed over unread (a streamed body).
   * The caller must consume it or destroy `req`. The timeout covers only the
   * wait for the response head.
   */
  async stream(call: Call): Promise<{ req: http.ClientRequest; res: http.IncomingMessage }> {
    return this.withRetries(call, () => this.once(call, "stream") as Promise<{ req: http.ClientRequest; res: http.IncomingMessage }>);
  }

  /** A GET with the given upgrade headers, on a connection of its own. */
  async upgrade(call: Call): Promise<Upgraded> {
    return this.once(call, "upgrade") as Promise<Upgraded>;
  }

  /**
   * Waits before retry `attempt` (0-based): exponential with jitter, at most
   * 5 s, or as long as moatd asked (Retry-After, e.g. a key over its rate) when longer.
   */
  backoff(attempt: number, signal?: AbortSignal, atLeastMs = 0): Promise<void> {
    const base = Math.min(this.retryDelayMs * 2 ** attempt, 5_000);
    // Jitter on top of what moatd asked, so that refused clients do not all come back at once.
    const delay = Math.max(base / 2 + Math.random() * (base / 2), atLeastMs * (1 + Math.random() * 0.2));
    return sleepTimer(delay, undefined, signal ? { signal } : undefined).catch(() => {
      throw new MoatAbortError(signal?.reason);
    });
  }

  private async withRetries<T>(call: Call, attempt: () => Promise<T>): Promise<T> {
    const idempotent = call.method === "GET" || call.method === "DELETE" || call.method === "PUT";
    for (let i = 0; ; i++) {
      try {
        return await attempt();
      } catch (e) {
        if (!idempotent || i >= this.maxRetries || !retryable(e)) throw e;
        const asked = e instanceof MoatError ? e.retryAfterMs ?? 0 : 0;
        if (asked > MAX_RETRY_AFTER_MS) throw e;  // the caller decides whether to wait that long
        await this.backoff(i, call.signal, asked);
      }
    }
  }

  private once(call: Call, mode: "buffer" | "stream" | "upgrade"): Promise<unknown> {
    const { signal } = call;
    if (signal?.aborted) return Promise.reject(new MoatAbortError(signal.reason));
    const headers: Record<string, string> = {
      "User-Agent": `moat-sdk-typescript/${SDK_VERSION}`,
      ...this.extraHeaders,
      ...(call.headers ?? {}),
    };
    const found = this.currentToken();
    if (found.token !== undefined) {
      headers.Authorization = `Bearer ${found.token}`;
    } else if (call.path !== "/healthz") {
      // Every endpoint but /healthz needs a token: say where none was found
      // rather than send a request moatd can only refuse.
      return Promise.reject(new NoTokenError(noTokenMessage(found), found.looked));
    }
    let payload: Uint8Array | undefined;
    if (call.json !== undefined) {
      payload = Buffer.from(JSON.stringify(call.json), "utf8");
      headers["Content-Type"] = "application/json";
    } else if (call.body !== undefined) {
      payload = call.body;
      headers["Content-Type"] = "application/octet-stream";
    }
    if (payload !== undefined || call.method === "POST" || call.method === "PUT") {
      headers["Content-Length"] = String(payload?.length ?? 0);
    }
    const ep = this.endpoint;
    const path = buildPath(ep.prefix, call.path, call.query);
    const where = `${call.method} ${ep.display}${call.path}`;
    const timeoutMs = call.timeoutMs ?? this.timeoutMs;

    return new Promise((resolve, reject) => {
      let settled = false;
      const req = ep.module.request({
        method: call.method,
        path,
        headers,
        ...(ep.socketPath ? { socketPath: ep.socketPath } : { host: ep.host, port: ep.port }),
        ...(mode === "upgrade" ? { agent: false } : { agent: this.agent }),
      });
      const timer =
        timeoutMs > 0
          ? setTimeout(() => fail(new MoatTimeoutError(`${where}: no answer within ${timeoutMs} ms`)), timeoutMs)
          : undefined;
      const onAbort = () => fail(new MoatAbortError(signal?.reason));
      signal?.addEventListener("abort", onAbort, { once: true });
      const done = () => {
        settled = true;
        if (timer) clearTimeout(timer);
        signal?.removeEventListener("abort", onAbort);
      };
      function fail(err: Error) {
        if (settled) return;
        done();
        req.destroy();
        reject(err);
      }
      req.on("error", (e: NodeJS.ErrnoException) => {
        fail(new MoatConnectionError(`${where}: cannot reach moatd (${e.code ?? e.message}); the address is from ${this.baseUrlSource}`, e));
      });
      req.on("upgrade", (res, socket, head) => {
        if (settled) {
          socket.destroy();
          return;
        }
        done();
        resolve({ res, socket, head } satisfies Upgraded);
      });
      req.on("response", (res) => {
        const status = res.statusCode ?? 0;
        if (mode === "stream" && status < 300 && status !== 202) {
          done();
          resolve({ req, res });
          return;
        }
        const chunks: Buffer[] = [];
        res.on("data", (c: Buffer) => chunks.push(c));
        res.on("end", () => {
          if (settled) return;
          done();
          const body = Buffer.concat(chunks);
          // 202: the gate asks a person and the caller chose not to wait.
          const pending = status === 202 ? pendingFromResponse(body, res.headers.location) : undefined;
          if (pending) {
            reject(pending);
          } else if (status >= 400 || (mode === "upgrade" && status !== 101)) {
            const retryAfter = res.headers["retry-after"];
            reject(status >= 400 ? errorFromResponse(status, body, typeof retryAfter === "string" ? retryAfter : undefined)
                                 : new MoatError({ status, code: "bad_response", message: `${where}: expected a WebSocket upgrade, got HTTP ${status}` }));
          } else {
            resolve({ status, headers: res.headers, body } satisfies Answer);
          }
        });
        res.on("error", (e) => fail(new MoatConnectionError(`${where}: the connection broke (${e.message})`, e)));
        res.on("close", () => {
          if (!res.complete) fail(new MoatConnectionError(`${where}: the connection closed before the answer ended`));
        });
      });
      req.end(payload);
    });
  }
}
