// moatd's REST API as the board uses it: same origin, authenticated by the
// session cookie (HttpOnly: the page never sees it), with the CSRF token in
// the X-Moat-CSRF header of every state-changing request. The token lives in
// this module's variable only: never in storage, a cookie or a URL.

let csrf = "";
let onUnauthorized: (message: string) => void = () => {};

export function setCsrf(token: string): void {
  csrf = token;
}

/** What to do when moatd no longer knows the session (a restart, a revoked key). */
export function setUnauthorizedHandler(handler: (message: string) => void): void {
  onUnauthorized = handler;
}

export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly body: unknown,
  ) {
    super(message);
  }
}

interface ErrorBody {
  error?: { code?: unknown; message?: unknown };
}

async function errorOf(res: Response): Promise<ApiError> {
  const text = await res.text().catch(() => "");
  let body: unknown = text;
  let code = `http_${res.status}`;
  let message = text.trim() || `${res.status} ${res.statusText}`;
  try {
    body = JSON.parse(text) as unknown;
    const e = (body as ErrorBody).error;
    if (e && typeof e.message === "string") message = e.message;
    if (e && typeof e.code === "string") code = e.code;
  } catch {
    // not JSON: the text itself is the message
  }
  return new ApiError(res.status, code, message, body);
}

export interface RequestOptions {
  /** A JSON value (sent as application/json) or raw bytes. */
  body?: unknown;
  signal?: AbortSignal;
  headers?: Record<string, string>;
}

/** A request to moatd; a non-2xx answer throws ApiError with moatd's message. */
export async function request(method: string, path: string, opts: RequestOptions = {}): Promise<Response> {
  const headers: Record<string, string> = { ...opts.headers };
  if (method !== "GET" && method !== "HEAD") headers["X-Moat-CSRF"] = csrf;
  let body: BodyInit | undefined;
  if (opts.body instanceof Blob || opts.body instanceof ArrayBuffer || opts.body instanceof Uint8Array) {
    body = opts.body as BodyInit;
    headers["Content-Type"] ??= "application/octet-stream";
  } else if (opts.body !== undefined) {
    body = JSON.stringify(opts.body);
    headers["Content-Type"] = "application/json";
  }
  let res: Response;
  try {
    res = await fetch(path, {
      method,
      headers,
      body: body ?? null,
      credentials: "same-origin",
      cache: "no-store",
      signal: opts.signal ?? null,
    });
  } catch (e) {
    if (e instanceof DOMException && e.name === "AbortError") throw e;
    throw new ApiError(0, "network", `${method} ${path}: moatd did not answer (${String(e)})`, null);
  }
  if (!res.ok) {
    const err = await errorOf(res);
    if (res.status === 401 && path.startsWith("/v1/")) onUnauthorized(err.message);
    throw err;
  }
  return res;
}

export async function getJson<T>(path: string, signal?: AbortSignal): Promise<T> {
  const res = await request("GET", path, signal ? { signal } : {});
  return (await res.json()) as T;
}

export async function send<T>(method: string, path: string, body?: unknown): Promise<T> {
  const res = await request(method, path, body === undefined ? {} : { body });
  if (res.status === 204) return undefined as T;
  const text = await res.text();
  return (text ? JSON.parse(text) : undefined) as T;
}

/** A query string from the non-empty values. */
export function query(params: Record<string, string | number | undefined>): string {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== "") q.set(k, String(v));
  const s = q.toString();
  return s ? `?${s}` : "";
}

export const enc = encodeURIComponent;

// ---- what moatd answers (docs/API.md, docs/GATE.md, docs/AGENTS.md) ----

export interface Principal {
  master: boolean;
  key?: string;
  name?: string;
  scopes?: string[];
}

export interface SessionInfo {
  csrf: string;
  principal: Principal;
}

export type EnvState = "creating" | "running" | "paused" | "destroying" | "gone" | "failed";

export interface Environment {
  id: string;
  task_id: string;
  template: string;
  state: EnvState;
  reason?: string;
  spec: { cpus: number; ram_mb: number; storage_gb: number; pids: number };
  created_at: string;
  expires_at: string;
  /** Present while paused: when the pause began (docs/PAUSE.md). */
  paused_at?: string;
  /** Present while paused: where its memory is ("disk": a microVM's checkpoint). */
  paused_memory?: "ram" | "disk";
  /** True while a checkpoint a file read brought back into RAM waits to go back to disk. */
  back_to_disk?: boolean;
  /** Whether its time to live goes on while paused. */
  ttl_while_paused?: "stops" | "runs";
  labels: Record<string, string>;
  network: string;
  permissions?: unknown;
}

export interface EnvStats {
  id: string;
  cpu_usec: number | null;
  cpus: number;
  memory_bytes: number;
  memory_limit_bytes: number;
  pids: number;
  pids_limit: number;
  oom_kills: number;
  /** Bytes its writable layer holds on the host; null where not counted. */
  storage_bytes: number | null;
  storage_limit_bytes: number;
  /** Bytes sent and received over its egress link; null under moatd --no-egress. */
  network_sent_bytes: number | null;
  network_received_bytes: number | null;
}

export interface FleetStats {
  at: string;
  environments: EnvStats[];
}

export interface GateAction {
  scope: string;
  op?: string;
  argv?: string[];
  env?: Record<string, string>;
  program?: string;
  parents?: string[];
  path?: string;
  size?: number;
  sha256?: string;
  tree?: boolean;
  host?: string;
  port?: number;
}

export interface Approval {
  id: string;
  environment: string;
  scope: string;
  action: GateAction;
  requester: string;
  created_at: string;
  state: "pending" | "approved" | "denied" | "expired";
  decided_by?: string;
  decided_at?: string;
  reason?: string;
  remember?: boolean;
}

export interface AuditEvent {
  id: number;
  time: string;
  time_ms: number;
  type: string;
  environment: string;
  actor: string;
  data: Record<string, unknown>;
  prev_hash?: string;
  hash?: string;
}

export interface AgentRun {
  id: string;
  state: string;
  environment?: string;
  keep_environment?: boolean;
  iterations: number;
  max_iterations: number;
  usage?: { input_tokens?: number; output_tokens?: number };
  provider?: { kind?: string; model?: string; base_url?: string };
  labels?: Record<string, string>;
  created_at: string;
  ended_at?: string;
  result?: string;
  error?: string;
}

/** A background process or shell in an environment (docs/API.md, "Processes"). */
export interface Process {
  id: number;
  pid: number;
  cmd: string[];
  kind: string;
  pty: boolean;
  state: string;
  started_at?: string;
}

export interface TranscriptStep {
  seq: number;
  at: string;
  kind: string;
  text?: string;
  iteration?: number;
  tool_calls?: { id: string; name: string; arguments: unknown }[];
  stop_reason?: string;
  id?: string;
  name?: string;
  is_error?: boolean;
  content?: string;
  redacted?: number;
  reason?: string;
  state?: string;
  iterations?: number;
}

export interface Transcript {
  id: string;
  steps: TranscriptStep[];
  streaming?: string;
}

export interface FileEntry {
  name: string;
  type: string;
  size: number;
  mode: string | number;
  mtime: string | number;
}

export interface VerifyResult {
  ok: boolean;
  checked: number;
  last?: { id: number; hash: string };
  first_broken?: { id: number; reason: string };
}
