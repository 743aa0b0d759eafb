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
  /** Whether this host runs microVM environments, and on what. */
  microvm: { available: boolean; accel?: "kvm" | "tcg" };
}

// ---- environments -----------------------------------------------------------

export type EnvironmentState = "creating" | "running" | "paused" | "destroying" | "gone" | "failed";

/**
 * Whether an environment's time to live goes on while it is paused (`runs`:
 * it may expire paused) or stops (`stops`, the default: a resume moves
 * `expires_at` on by the pause's length). docs/PAUSE.md.
 */
export type TtlWhilePaused = "stops" | "runs";
/** What the end of the time to live does (docs/PAUSE.md, "At expiry"). */
export type OnExpiry = "destroy" | "pause" | "checkpoint";

/** What bounds an environment (docs/MICROVM.md). */
export type Isolation = "namespaces" | "microvm";

export interface Spec {
  cpus: number;
  ram_mb: number;
  storage_gb: number;
  pids: number;
  isolation: Isolation;
}

export interface CreateEnvironmentRequest {
  /** The caller's name for the task (at most 256 bytes); filterable. */
  task_id?: string;
  /**
   * A template's name (`host`, the default, or one imported or built:
   * `moat.templates`, docs/TEMPLATES.md), or an absolute root file system
   * directory (master token only).
   */
  template?: string;
  spec?: Partial<Spec>;
  /** Seconds until the environment expires (1 to 604800, default 3600). */
  ttl_s?: number;
  /** Whether the time to live goes on while it is paused (`"runs"`) or stops (`"stops"`, the default). */
  ttl_while_paused?: TtlWhilePaused;
  /**
   * `"destroy"` (the default) or `"pause"`: the environment is paused when its time runs out, and a
   * resume gives it `ttl_s` again. `"pause"` needs `ttl_while_paused: "stops"`.
   */
  on_expiry?: OnExpiry;
  labels?: Record<string, string>;
  /** Variables every command in the environment gets. */
  env?: Record<string, string>;
  /**
   * What the gate lets the environment do (docs/GATE.md). Scopes left out get
   * moatd's defaults (read_file, write_file, run_command allow; network deny).
   */
  permissions?: Permissions;
  /**
   * Egress (docs/EGRESS.md): `"none"` (the default: loopback only), `"open"`,
   * or a policy object (an allowlist unless it says otherwise). Needs moatd's
   * egress control: a moatd run with `--no-egress` answers anything but
   * `"none"` with UnavailableError (503). Errors name the field (`network.allow[0]`).
   * A host no entry matches is the gate's to decide: `permissions.network`.
   */
  network?: EgressPolicy;
  /**
   * Credentials the environment never sees: each variable `name` holds a
   * `moat-secret-...` placeholder, which the egress proxy replaces with the
   * value in requests to the secret's `hosts` only (at most 64; a name may
   * not also be in `env`).
   */
  secrets?: SecretRequest[];
  /**
   * Start from this snapshot's files (one of the caller's own). The template
   * is the snapshot's (giving `template` too is an InvalidRequestError).
   */
  snapshot?: string;
}

/** A snapshot of an environment's files (docs/API.md, "Snapshots"). */
export interface Snapshot {
  id: string;
  environment_id: string;
  name: string;
  template: string;
  storage_gb: number;
  /** What it was taken of ran in; environments made from it are the same. */
  isolation: "namespaces" | "microvm";
  created_at: string;
}

/** What a fork may change; everything else is the source's. */
export interface ForkRequest {
  task_id?: string;
  labels?: Record<string, string>;
  ttl_s?: number;
  /** Its running processes too, going on in the fork where they were (microvm environments; docs/PAUSE.md). */
  memory?: boolean;
}

/**
 * An environment as moatd describes it (a plain record: what
 * `moat.environments.*` return). `moat.create`/`get`/`list` return the
 * Environment handle instead, which carries these same fields.
 */
export interface EnvironmentInfo {
  id: string;
  task_id: string;
  template: string;
  state: EnvironmentState;
  /** Present for gone and failed environments: `destroyed`, `expired`, `failed: ...`. */
  reason?: string;
  spec: Spec;
  /** A microVM environment's accelerator. */
  accel?: "kvm" | "tcg";
  created_at: string;
  /** When it expires; while paused with `ttl_while_paused: "stops"`, the resume moves it on by the pause's length. */
  expires_at: string;
  /** Whether its time to live goes on while paused. */
  ttl_while_paused?: TtlWhilePaused;
  /** What the end of its time to live does. */
  on_expiry?: OnExpiry;
  /** When the pause that holds it began; present only while paused. */
  paused_at?: string;
  /** Where its memory is while paused (present only while paused). */
  paused_memory?: PausedMemory;
  /** True while a checkpoint a file read brought back into RAM waits to go back to disk. */
  back_to_disk?: boolean;
  labels: Record<string, string>;
  /** The environment's first permission layer (every scope spelled out). */
  permissions?: Permissions;
  /** How many permission layers it has, when more than one. */
  permission_layers?: number;
  /** The network mode; the whole policy is `environments.network.get(id)`. */
  network: NetworkMode;
  /** Its secrets, without their values; absent when it has none. */
  secrets?: SecretPublic[];
}

/** POST /v1/agents (docs/AGENTS.md). */
export interface CreateAgentRequest {
  instruction: string;
  provider: {
    kind: "anthropic" | "openai";
    model: string;
    base_url?: string;
    api_key?: string;
    /** A variable of moatd's own environment (master token only). */
    api_key_env?: string;
    max_tokens?: number;
  };
  max_iterations?: number;
  timeout_s?: number;
  /** Input and output tokens in all; once spent after a turn, the run ends `stopped`. */
  token_budget?: number;
  keep_environment?: boolean;
  labels?: Record<string, string>;
  spec?: Partial<Spec>;
  template?: string;
  snapshot?: string;
  permissions?: Permissions;
  network?: EgressPolicy;
  secrets?: SecretRequest[];
}

export type AgentState = "running" | "waiting_approval" | "completed" | "failed" | "max_iterations" | "stopped";

export interface AgentRun {
  id: string;
  state: AgentState;
  environment: string;
  keep_environment: boolean;
  iterations: number;
  max_iterations: number;
  usage: { input_tokens: number; output_tokens: number };
  provider: { kind: "anthropic" | "openai"; model: string; base_url: string };
  labels: Record<string, string>;
  created_at: string;
  ended_at?: string;
  /** The model's final text (completed runs). */
  result?: string;
  /** Why it failed or stopped. */
  error?: string;
}

/** One step of a run's transcript. */
export interface AgentStep {
  seq: number;
  at: string;
  kind: "instruction" | "model" | "tool_result" | "retry" | "end";
  text?: string;
  tool_calls?: { id: string; name: string; arguments: unknown }[];
  usage?: { input_tokens: number; output_tokens: number };
  id?: string;
  name?: string;
  is_error?: boolean;
  content?: string;
  redacted?: number;
  reason?: string;
  state?: AgentState;
  iterations?: number;
}

/** What a running environment uses now, beside its limits (`GET .../stats`). */
export interface EnvironmentStats {
  id: string;
  /** When it was read. */
  at: string;
  /** CPU time since the environment began; null where the host cannot count it. */
  cpu_usec: number | null;
  cpus: number;
  memory_bytes: number;
  memory_limit_bytes: number;
  /** Processes and threads. */
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

export interface ListEnvironmentsFilter {
  /** Every label must match. */
  labels?: Record<string, string>;
  task_id?: string;
  /** Without it, gone environments are left out. */
  state?: EnvironmentState;
}

// ---- exec -------------------------------------------------------------------

export type Encoding = "utf8" | "base64";

/**
 * What a gated call (exec, starting a process, every file operation) does
 * when the environment's permissions say `ask`:
 * - `"wait"` (default): the request waits for a person's decision (up to
 *   moatd's `--approval-timeout`, 120 s by default; give the call a
 *   `timeoutMs` longer than that), then runs or throws DeniedByPolicyError.
 * - `"async"`: sends `Prefer: respond-async`; the call throws
 *   ApprovalPendingError at once, carrying the pending `approval`. Follow it
 *   with `client.approvals.get(id, { wait: 60 })` and, once approved, repeat
 *   the same call: the approval is a one-time grant for exactly that action.
 */
export type ApprovalMode = "wait" | "async";

/** Where a paused environment's memory is: in RAM, or saved to disk (a checkpoint, microVMs). */
export type PausedMemory = "ram" | "disk";

/** RequestOptions of a pause. */
export interface PauseOptions extends RequestOptions {
  /** `"disk"`: its memory is saved to disk and released (docs/PAUSE.md, "To disk"). */
  memory?: PausedMemory;
}

/** RequestOptions of a call the gate checks. */
export interface GatedOptions extends RequestOptions {
  approval?: ApprovalMode;
}

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
  /** Never drop output: the process waits for its slowest follower (at most 512 KiB ahead). */
  lossless?: boolean;
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
  /** Output waits for followers instead of being dropped (false once the last follower left). */
  lossless: boolean;
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

export interface ReadFileOptions extends GatedOptions {
  offset?: number;
  /** At most 8 MiB per request. */
  length?: number;
}

export interface WriteFileOptions extends GatedOptions {
  append?: boolean;
  /** Permission bits of a new file (a number like 0o755, or an octal string "755"). */
  mode?: number | string;
}

// ---- keys -------------------------------------------------------------------------

/**
 * `approve`: decide approvals (give it to people's tools, not to agents).
 * `permissions`: replace an environment's permissions (which can loosen them).
 * `audit`: read the audit events of the key's own environments.
 */
export type Scope =
  | "create" | "read" | "exec" | "files" | "destroy" | "timeout" | "approve" | "permissions" | "audit" | "snapshots"
  | "templates" | "ports";

export interface CreateKeyRequest {
  name?: string;
  scopes: Scope[];
  /** A ceiling for every environment the key acts on; scopes left out are not limited. */
  permissions?: Permissions;
}

export interface ApiKey {
  id: string;
  name: string;
  scopes: Scope[];
  created_at: string;
  revoked: boolean;
  /** The key's ceiling, if it has one. */
  permissions?: Permissions;
}

export interface ApiKeyCreated extends ApiKey {
  /** `moat_<id>_<secret>`: shown this once. */
  token: string;
}

// ---- the gate: permissions and approvals (docs/GATE.md) -------------------------

export type PermissionAction = "allow" | "ask" | "deny";

/**
 * run_command rule: `match` is one glob per argument (a last `"*"` matches any
 * number of remaining arguments); a first pattern without `/` names a program.
 * No `match`: a catch-all.
 */
export interface CommandRule {
  match?: string[];
  action: PermissionAction;
}

/** read_file / write_file rule: `path` globs the normalized absolute path (`**` crosses `/`). */
export interface FileRule {
  path?: string;
  action: PermissionAction;
}

/** network rule: `host` is a case-insensitive glob; `port` optional. */
export interface NetworkRule {
  host?: string;
  port?: number;
  action: PermissionAction;
}

/**
 * Per scope one word, or rules tried in order: the first match wins, and when
 * none matches the answer is deny (end a list with `{ action: ... }`).
 */
export interface Permissions {
  read_file?: PermissionAction | FileRule[];
  write_file?: PermissionAction | FileRule[];
  run_command?: PermissionAction | CommandRule[];
  network?: PermissionAction | NetworkRule[];
}

/** `GET /v1/environments/{id}/permissions`. */
export interface PermissionsView {
  /** The first layer. */
  permissions: Permissions;
  /** Every layer; each must allow an action (the strictest verdict wins). */
  layers: Permissions[];
  /** The calling key's ceiling, if it has one. */
  ceiling?: Permissions;
}

export interface SetPermissionsOptions extends RequestOptions {
  /**
   * Replace every layer with this one (can loosen: needs the master token or
   * the `permissions` scope). Without it, a layer is added (only tightens).
   */
  replace?: boolean;
}

export type GateScope = "read_file" | "write_file" | "run_command" | "network";

/** The exact action the gate judged. */
export interface GateAction {
  scope: GateScope;
  /** `exec`, `process`, `shell`, `read`, `write`, `stat`, `list`, `mkdir`, `remove`, `move`, ... */
  op?: string;
  /** run_command */
  argv?: string[];
  /** read_file, write_file */
  path?: string;
  /** write_file: bytes written. */
  size?: number;
  /** network */
  host?: string;
  port?: number;
}

export type ApprovalState = "pending" | "approved" | "denied" | "expired";

export interface Approval {
  id: string;
  environment: string;
  scope: GateScope;
  action: GateAction;
  /** `master` or the asking key's id. */
  requester: string;
  created_at: string;
  state: ApprovalState;
  /** Set once decided (or expired). */
  decided_by?: string;
  decided_at?: string;
  reason?: string;
  remember?: boolean;
}

export interface ListApprovalsFilter {
  state?: ApprovalState;
  environment?: string;
}

export interface GetApprovalOptions extends RequestOptions {
  /** Seconds (at most 300) to wait while the approval is pending. */
  wait?: number;
}

export interface DecideOptions extends RequestOptions {
  reason?: string;
  /** Turn the decision into a rule for exactly this action in the environment's first layer. */
  remember?: boolean;
}

// ---- egress: network policies and secrets (docs/EGRESS.md) ------------------------

/**
 * `none`: loopback only. `allowlist`: the hosts an `allow` entry matches (and
 * no `deny` entry does), through moatd's proxy. `open`: any public host,
 * through the proxy, `deny` entries still apply.
 */
export type NetworkMode = "none" | "allowlist" | "open";

/**
 * An entry with conditions: `host` in any of the string forms (a name glob,
 * an IPv4 address or range, with an optional `:port`), and optionally the
 * ports, HTTP methods and paths it covers. Paths are globs on the normalized
 * path (`*` within a segment, `**` across them); method and path rules make
 * the proxy look inside HTTPS.
 */
export interface EgressEntryObject {
  host: string;
  /** 1 to 64 ports (1-65535). */
  ports?: number[];
  /** 1 to 16 methods, e.g. `["GET", "HEAD"]`. */
  methods?: string[];
  /** 1 to 64 path globs, each starting with `/`. */
  paths?: string[];
}

/**
 * An `allow` or `deny` entry: `"pypi.org"`, `"*.pypi.org"` (any run of
 * characters: matches `files.pypi.org`, not `pypi.org`),
 * `"files.pythonhosted.org:443"`, `"203.0.113.7"`, `"203.0.113.0/24"` (each
 * with an optional `:port`), or an object with conditions. IPv6 is refused.
 */
export type EgressEntry = string | EgressEntryObject;

/** A policy object; without `mode` it is an allowlist. */
export interface EgressPolicyObject {
  /** Default `allowlist`. */
  mode?: NetworkMode;
  /** At most 1024 entries; the first match allows. */
  allow?: EgressEntry[];
  /** At most 1024 entries; checked first, the first match refuses (in `open` too). */
  deny?: EgressEntry[];
  /** Connections open at once (1 to 4096, default 64). */
  max_connections?: number;
  /** Both directions together (0.01 to 100000); no limit when left out. */
  bandwidth_mbps?: number;
}

/** `"none"` and `"open"` are shorthands for `{ mode: "none" }` and `{ mode: "open" }`. */
export type EgressPolicy = "none" | "open" | EgressPolicyObject;

/** A policy as moatd stores it: every field written out. */
export interface EgressPolicyView {
  mode: NetworkMode;
  allow: EgressEntry[];
  deny: EgressEntry[];
  max_connections: number;
  /** Present when the policy limits bandwidth. */
  bandwidth_mbps?: number;
}

/** The environment's end of its link into moatd's egress namespace. */
export interface EgressLink {
  /** The environment's address (`eth0`, in 100.64.0.0/10). */
  address: string;
  /** moatd's side: the resolver, and the default route. */
  gateway: string;
  /** The proxy URL its `HTTP_PROXY`/`HTTPS_PROXY` name: `http://<gateway>:3128`. */
  proxy: string;
}

/** `GET` / `PUT /v1/environments/{id}/network`. */
export interface EgressState {
  network: EgressPolicyView;
  /** Present while the environment has a link (any mode but `none`). */
  link?: EgressLink;
}

/** A secret as given on create. */
export interface SecretRequest {
  /** The variable that holds the placeholder (`[A-Za-z_][A-Za-z0-9_]*`, at most 128 bytes). */
  name: string;
  /** The real value (1 to 16384 bytes, no line breaks): never shown again, never in the environment. */
  value: string;
  /**
   * 1 to 64 host names or globs that may receive it. A glob stays inside one
   * registered domain (`*.example.com`); `*`, `*.com`, `*.co.uk`,
   * `*.github.io` and other public suffixes are refused (docs/EGRESS.md).
   */
  hosts: string[];
  /**
   * `"Name"` or `"Name: text with {value}"` (e.g. `"Authorization: Bearer
   * {value}"`): a header the proxy sets on every request to `hosts`.
   */
  header?: string;
}

/** A secret as moatd shows it: no value, and of `header` only the header's name. */
export interface SecretPublic {
  name: string;
  hosts: string[];
  header?: string;
}

// ---- templates (docs/TEMPLATES.md) ------------------------------------------------

export type TemplateState = "importing" | "building" | "ready" | "failed";

/** What an image says a command runs with: defaults every environment made from it gets. */
export interface TemplateConfig {
  /** `K=V` strings. */
  env: string[];
  working_dir: string;
  user: string;
  entrypoint: string[];
  cmd: string[];
}

export interface Template {
  /** `^[a-z0-9][a-z0-9._:-]{0,63}$`, not `host` (so `python:3.12` is a name). */
  name: string;
  /** Where it came from: `docker://...`, `oci:DIR[:TAG]`, `oci-archive:FILE`, `docker-archive:FILE`, a recipe, or `builtin`. */
  source: string;
  state: TemplateState;
  /** state `failed`: why. */
  error?: { code: string; message: string };
  /** While importing or building: what it is doing. */
  progress?: { stage: string; bytes?: number };
  size_bytes?: number;
  created_at: string;
  config?: TemplateConfig;
}

/** `POST /v1/templates` with a recipe: an environment from `base` runs `run`, then becomes the template. */
export interface TemplateRecipe {
  /** The template the recipe starts from (`host` or another template's name). */
  base: string;
  /** Shell lines, run in order; the first that fails fails the build. */
  run: string[];
  env?: Record<string, string>;
}

// ---- previews (docs/PORTS.md) -------------------------------------------------------

/** `POST /v1/environments/{id}/previews`: the url (holding its secret) is shown only here. */
export interface PreviewCreated {
  id: string;
  port: number;
  /** Opens in a browser without the token until `expires_at` or revocation. */
  url: string;
  expires_at: string;
}

/** A preview as listed (without its url). */
export interface Preview {
  id: string;
  port: number;
  expires_at: string;
  created_at: string;
}
