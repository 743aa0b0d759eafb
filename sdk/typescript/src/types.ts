// The wire types of moatd's API (docs/API.md, api/openapi.yaml). Field names
// are moatd's own (snake_case), so a JSON body in the docs reads the same here.

/** Options every call accepts as its last argument. */
export interface RequestOptions {
  /** Overrides the client's request timeout for this call (ms). */
  timeoutMs?: number;
  /** Aborts the call; it then rejects with a MoatAbortError. */
  signal?: AbortSignal;
}

// ---- service ----------------------------------------------------------------

export interface Health {
  status: "ok";
}

// ---- environments -----------------------------------------------------------

export type EnvironmentState = "creating" | "running" | "destroying" | "gone" | "failed";

export interface Spec {
  cpus: number;
  ram_mb: number;
  storage_gb: number;
  pids: number;
}

export interface CreateEnvironmentRequest {
  /** The caller's name for the task (at most 256 bytes); filterable. */
  task_id?: string;
  /** `host` (default) or an absolute root file system directory (master token only). */
  template?: string;
  spec?: Partial<Spec>;
  /** Seconds until the environment expires (1 to 604800, default 3600). */
  ttl_s?: number;
  labels?: Record<string, string>;
  /** Variables every command in the environment gets. */
  env?: Record<string, string>;
}

export interface Environment {
  id: string;
  task_id: string;
  template: string;
  state: EnvironmentState;
  /** Present for gone and failed environments: `destroyed`, `expired`, `failed: ...`. */
  reason?: string;
  spec: Spec;
  created_at: string;
  expires_at: string;
  labels: Record<string, string>;
}

export interface ListEnvironmentsFilter {
  /** Every label must match. */
  labels?: Record<string, string>;
  task_id?: string;
  /** Without it, gone environments are left out. */
  state?: EnvironmentState;
}

// ---- exec -------------------------------------------------------------------

export type Encoding = "utf8" | "base64";

export interface ExecRequest {
  /** argv, no shell. */
  cmd: string[];
  /** Kills the command's process group after this long. The call waits this long plus a margin. */
  timeout_ms?: number;
  env?: Record<string, string>;
  cwd?: string;
  /** Fed to stdin. A Buffer is sent as base64 (and so is the output, which the SDK decodes). */
  stdin?: string | Uint8Array;
  /** `base64` asks moatd to always send base64 (the SDK decodes either way). */
  encoding?: Encoding;
  /** Bytes kept per stream (default 1 MiB, at most 16 MiB). */
  output_limit?: number;
}

/** What moatd answers, before the SDK decodes it. */
export interface ExecResponse {
  exit_code: number;
  /** The killing signal, 0 if none; absent when the command did not start (126/127). */
  signal?: number;
  stdout: string;
  stderr: string;
  timed_out: boolean;
  duration_ms: number;
  stdout_truncated: boolean;
  stderr_truncated: boolean;
  encoding: Encoding;
}

/**
 * An exec's result. `stdout`/`stderr` are always decoded text (a lossy UTF-8
 * decoding when the output was not valid UTF-8); `stdout_raw`/`stderr_raw` are
 * the exact bytes. `encoding` is what moatd used on the wire: `base64` when
 * the output was not UTF-8 (or base64 was asked for).
 */
export interface ExecResult extends ExecResponse {
  stdout_raw: Buffer;
  stderr_raw: Buffer;
}

// ---- processes ----------------------------------------------------------------

export type ProcessState = "running" | "exited" | "failed" | "lost";

export interface StartProcessRequest {
  cmd: string[];
  env?: Record<string, string>;
  cwd?: string;
  timeout_ms?: number;
  /** Default true: a pipe the process reads until it is closed through the API. */
  stdin?: boolean;
  /** Run on a terminal (stdout and stderr are the terminal, shown as stdout). */
  pty?: boolean;
  /** Only with pty (1 to 1000). */
  rows?: number;
  cols?: number;
}

export interface ProcessInfo {
  /** moatd's id (1, 2, ... per environment). */
  id: number;
  /** The process id inside the environment. */
  pid: number;
  cmd: string[];
  kind: "process" | "exec" | "shell" | string;
  pty: boolean;
  state: ProcessState;
  stdin_open: boolean;
  started_at: string;
  stdout_bytes: number;
  stderr_bytes: number;
  stdout_dropped: number;
  stderr_dropped: number;
  /** The end of the output so far (both streams share one offset space). */
  output_offset: number;
  ended_at?: string;
  /** exited and failed: 128+N when signal N killed it; 127/126 when it could not start. */
  exit_code?: number;
  signal?: number;
  timed_out?: boolean;
  duration_ms?: number;
  /** failed: why it could not start. */
  error?: string;
  /** lost: why it can no longer be followed. */
  reason?: string;
}

export interface OutputOptions extends RequestOptions {
  /** Where to start reading (a byte offset; default 0). */
  since?: number;
  /** Keep the stream open until the process ends (`exit`) or cannot be followed (`end`). */
  follow?: boolean;
  /** `base64` asks moatd to always send base64 (the SDK decodes either way). */
  encoding?: Encoding;
  /**
   * With follow: give up (MoatTimeoutError) after this long without a line;
   * moatd sends a heartbeat every 15 s. Default 60 000. 0 disables it.
   */
  idleTimeoutMs?: number;
}

export interface OutputChunkEvent {
  type: "output";
  stream: "stdout" | "stderr";
  offset: number;
  /** The decoded bytes. */
  data: Buffer;
  /** How moatd sent them (`base64` when the chunk was not valid UTF-8). */
  encoding: Encoding;
}

export interface DroppedEvent {
  type: "dropped";
  offset: number;
  /** Bytes no longer kept (moatd keeps the last 1 MiB per stream). */
  bytes: number;
}

export interface HeartbeatEvent {
  type: "heartbeat";
  offset: number;
}

export interface ExitEvent {
  type: "exit";
  offset: number;
  state: "exited" | "failed";
  exit_code: number;
  signal?: number;
  timed_out?: boolean;
  /** state "failed": why the command did not start ("command not found: ..."). */
  error?: string;
}

export interface EndEvent {
  type: "end";
  offset?: number;
  state?: "lost";
  reason: string;
}

export type FinalEvent = ExitEvent | EndEvent;
export type OutputEvent = OutputChunkEvent | DroppedEvent | HeartbeatEvent | ExitEvent | EndEvent;

// ---- shell ----------------------------------------------------------------------

export interface ShellOptions {
  /** Terminal size of a new shell (default 24x80). */
  rows?: number;
  cols?: number;
  /** Attach to this existing pty process instead of starting a shell. */
  process?: number;
  /** How long the handshake may take (default: the client's request timeout). */
  timeoutMs?: number;
  signal?: AbortSignal;
}

/** A control message from moatd on a shell: the final event or an error about a control message. */
/** The first message of every session: which process the terminal is. */
export interface ShellHello {
  type: "hello";
  process: number;
  pid: number;
  cmd: string[];
}

export type ShellControlMessage = FinalEvent | ShellHello | { type: "error"; message: string } | { type: string; [k: string]: unknown };

// ---- files ----------------------------------------------------------------------

export type FileType = "file" | "dir" | "symlink" | "other";

export interface FileInfo {
  /** The entry's name in a list; the path as given in stat. */
  name: string;
  type: FileType;
  size: number;
  /** Permission bits, decimal (420 is 0644). */
  mode: number;
  /** Unix seconds. */
  mtime: number;
}

export interface FileList {
  path: string;
  entries: FileInfo[];
}

export interface ReadFileOptions extends RequestOptions {
  offset?: number;
  /** At most 8 MiB per request. */
  length?: number;
}

export interface WriteFileOptions extends RequestOptions {
  append?: boolean;
  /** Permission bits of a new file (a number like 0o755, or an octal string "755"). */
  mode?: number | string;
}

// ---- keys -------------------------------------------------------------------------

export type Scope = "create" | "read" | "exec" | "files" | "destroy" | "timeout";

export interface CreateKeyRequest {
  name?: string;
  scopes: Scope[];
}

export interface ApiKey {
  id: string;
  name: string;
  scopes: Scope[];
  created_at: string;
  revoked: boolean;
}

export interface ApiKeyCreated extends ApiKey {
  /** `moat_<id>_<secret>`: shown this once. */
  token: string;
}
