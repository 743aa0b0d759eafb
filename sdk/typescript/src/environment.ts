// The environment handle: `const env = await moat.create(...)`, then
// `env.run(...)`, `env.files.write(...)`, `env.destroy()`: every call knows
// its environment. It also carries the record's fields (`env.state`,
// `env.spec`, ...: what moatd last said, see `refresh()`), so code written for
// the plain records of `moat.environments.*` reads a handle the same way.

import {
  type Command,
  type CommandHandle,
  type RunOptions,
  type RunResult,
  type StartOptions,
  runCommand,
  startCommand,
} from "./commands.js";
import type { Environments } from "./environments.js";
import type { CreatePreviewOptions, Previews } from "./previews.js";
import type { Process } from "./processes.js";
import type { Shell } from "./shell.js";
import type { Snapshots } from "./snapshots.js";
import type {
  EnvironmentInfo,
  EnvironmentState,
  EnvironmentStats,
  ExecRequest,
  ExecResult,
  FileInfo,
  ForkRequest,
  GatedOptions,
  NetworkMode,
  OnExpiry,
  PauseOptions,
  Permissions,
  Preview,
  PreviewCreated,
  ReadFileOptions,
  RequestOptions,
  SecretPublic,
  ShellOptions,
  Snapshot,
  Spec,
  TtlWhilePaused,
  WriteFileOptions,
} from "./types.js";

/** The APIs a handle calls (a Moat client's). */
export interface EnvironmentApis {
  readonly environments: Environments;
  readonly snapshots: Snapshots;
  readonly previews: Previews;
}

/** The files of one environment: the methods of `moat.environments.files` without the id. */
export class EnvironmentFiles {
  constructor(
    private readonly apis: EnvironmentApis,
    private readonly envId: string,
  ) {}

  /** The file's bytes (at most 8 MiB per request; use offset/length for more). */
  read(path: string, options?: ReadFileOptions): Promise<Buffer>;
  /** The file as text in that encoding. */
  read(path: string, options: ReadFileOptions & { encoding: BufferEncoding }): Promise<string>;
  read(path: string, options: ReadFileOptions & { encoding?: BufferEncoding } = {}): Promise<Buffer | string> {
    return this.apis.environments.files.read(this.envId, path, options as ReadFileOptions & { encoding: BufferEncoding });
  }

  /** The file as UTF-8 text. */
  readText(path: string, options: ReadFileOptions = {}): Promise<string> {
    return this.apis.environments.files.readText(this.envId, path, options);
  }

  /** Writes (or with `append`, appends to) a file, at most 16 MiB; parents are created. */
  write(path: string, data: string | Uint8Array, options: WriteFileOptions = {}): Promise<void> {
    return this.apis.environments.files.write(this.envId, path, data, options);
  }

  /** The entries of a directory. */
  list(path: string, options: GatedOptions = {}): Promise<FileInfo[]> {
    return this.apis.environments.files.list(this.envId, path, options);
  }

  /** lstat of a path. */
  stat(path: string, options: GatedOptions = {}): Promise<FileInfo> {
    return this.apis.environments.files.stat(this.envId, path, options);
  }

  exists(path: string, options: GatedOptions = {}): Promise<boolean> {
    return this.apis.environments.files.exists(this.envId, path, options);
  }

  mkdir(path: string, options: GatedOptions & { parents?: boolean } = {}): Promise<void> {
    return this.apis.environments.files.mkdir(this.envId, path, options);
  }

  /** Removes a file or an empty directory; `recursive` removes a tree. */
  remove(path: string, options: GatedOptions & { recursive?: boolean } = {}): Promise<void> {
    return this.apis.environments.files.remove(this.envId, path, options);
  }

  move(from: string, to: string, options: GatedOptions = {}): Promise<void> {
    return this.apis.environments.files.move(this.envId, from, to, options);
  }
}

/** The background processes of one environment (those of start(), execs and shells). */
export class EnvironmentProcesses {
  constructor(
    private readonly apis: EnvironmentApis,
    private readonly envId: string,
  ) {}

  /** Every process moatd keeps for the environment, oldest first. */
  list(options: RequestOptions = {}): Promise<Process[]> {
    return this.apis.environments.processes.list(this.envId, options);
  }

  /** One process by moatd's id (`handle.id`): reattach to its output with `output({ since, follow })`. */
  get(id: number, options: RequestOptions = {}): Promise<Process> {
    return this.apis.environments.processes.get(this.envId, id, options);
  }
}

/** The preview URLs of one environment (docs/PORTS.md). */
export class EnvironmentPreviews {
  constructor(
    private readonly apis: EnvironmentApis,
    private readonly envId: string,
  ) {}

  /** A new preview of `port`; its `url` is shown only here. */
  create(port: number, options: CreatePreviewOptions = {}): Promise<PreviewCreated> {
    return this.apis.previews.create(this.envId, port, options);
  }

  list(options: RequestOptions = {}): Promise<Preview[]> {
    return this.apis.previews.list(this.envId, options);
  }

  /** Its URL stops working at once. */
  revoke(previewId: string, options: RequestOptions = {}): Promise<void> {
    return this.apis.previews.revoke(this.envId, previewId, options);
  }
}

/**
 * One environment. Made by `moat.create()`, `moat.get(id)`, `moat.list()`
 * and `env.fork()`. Its record fields are what moatd last said; `refresh()`
 * asks again (calls that answer with the environment, like `restore`,
 * `setTimeout`, `pause` and `resume`, update it too).
 */
export class Environment implements EnvironmentInfo {
  /** Its files: `env.files.write("/workspace/a.py", code)`. */
  readonly files: EnvironmentFiles;
  /** Its background processes (reattach to one by id). */
  readonly processes: EnvironmentProcesses;
  /** Its preview URLs; `getUrl(port)` is the short way. */
  readonly previews: EnvironmentPreviews;
  private record: EnvironmentInfo;

  constructor(
    private readonly apis: EnvironmentApis,
    info: EnvironmentInfo,
  ) {
    this.record = info;
    this.files = new EnvironmentFiles(apis, info.id);
    this.processes = new EnvironmentProcesses(apis, info.id);
    this.previews = new EnvironmentPreviews(apis, info.id);
  }

  /** What moatd last said about the environment (a plain record). */
  get info(): EnvironmentInfo {
    return this.record;
  }

  get id(): string {
    return this.record.id;
  }
  get task_id(): string {
    return this.record.task_id;
  }
  get template(): string {
    return this.record.template;
  }
  get state(): EnvironmentState {
    return this.record.state;
  }
  get reason(): string | undefined {
    return this.record.reason;
  }
  get spec(): Spec {
    return this.record.spec;
  }
  get created_at(): string {
    return this.record.created_at;
  }
  get expires_at(): string {
    return this.record.expires_at;
  }
  get ttl_while_paused(): TtlWhilePaused | undefined {
    return this.record.ttl_while_paused;
  }
  get on_expiry(): OnExpiry | undefined {
    return this.record.on_expiry;
  }
  get paused_at(): string | undefined {
    return this.record.paused_at;
  }
  get labels(): Record<string, string> {
    return this.record.labels;
  }
  get permissions(): Permissions | undefined {
    return this.record.permissions;
  }
  get permission_layers(): number | undefined {
    return this.record.permission_layers;
  }
  get network(): NetworkMode {
    return this.record.network;
  }
  get secrets(): SecretPublic[] | undefined {
    return this.record.secrets;
  }

  /** JSON.stringify(env) gives the record. */
  toJSON(): EnvironmentInfo {
    return this.record;
  }

  /** Asks moatd again; updates and returns `info`. */
  async refresh(options: RequestOptions = {}): Promise<EnvironmentInfo> {
    this.record = await this.apis.environments.get(this.id, options);
    return this.record;
  }

  /**
   * Runs a command to its end: a string is a shell line (`/bin/sh -c`), an
   * array is argv. `onStdout`/`onStderr` get the output as it is produced, in
   * order, all of it before the promise resolves. A failing command is a
   * result (`exitCode`, `stderr`), not an error. An AbortSignal kills it.
   */
  run(cmd: Command, options: RunOptions = {}): Promise<RunResult> {
    return runCommand(this.apis.environments.processes, this.id, cmd, options);
  }

  /**
   * Starts a command in the background and returns its handle at once:
   * output goes to `onStdout`/`onStderr` as it comes, `onExit` gets the
   * result; `handle.wait()`, `handle.kill()`.
   */
  start(cmd: Command, options: StartOptions = {}): Promise<CommandHandle> {
    return startCommand(this.apis.environments.processes, this.id, cmd, options);
  }

  /** The raw exec call (`POST .../exec`, argv, output limits): see `moat.environments.exec`. */
  exec(request: ExecRequest, options: GatedOptions = {}): Promise<ExecResult> {
    return this.apis.environments.exec(this.id, request, options);
  }

  /** An interactive terminal (a WebSocket). */
  shell(options: ShellOptions = {}): Promise<Shell> {
    return this.apis.environments.shell(this.id, options);
  }

  /** CPU time, memory and pids in use, beside the limits. */
  stats(options: RequestOptions = {}): Promise<EnvironmentStats> {
    return this.apis.environments.stats(this.id, options);
  }

  /** Makes it expire `ttlS` seconds from now; updates `info`. */
  async setTimeout(ttlS: number, options: RequestOptions = {}): Promise<EnvironmentInfo> {
    this.record = await this.apis.environments.setTimeout(this.id, ttlS, options);
    return this.record;
  }

  /**
   * Stops every process where it is (docs/PAUSE.md); updates `info` (`state`
   * `"paused"`, `paused_at`). Until `resume()`, commands, processes, shells
   * and file changes throw ConflictError; file reads still work (with
   * `memory: "disk"`, a microVM's checkpoint, they too wait).
   */
  async pause(options: PauseOptions = {}): Promise<EnvironmentInfo> {
    this.record = await this.apis.environments.pause(this.id, options);
    return this.record;
  }

  /** Lets its processes go on after a `pause()`; updates `info` (`state` `"running"`, `expires_at`). */
  async resume(options: RequestOptions = {}): Promise<EnvironmentInfo> {
    this.record = await this.apis.environments.resume(this.id, options);
    return this.record;
  }

  /** Snapshots its files now (a name, or `{ name }`, is optional). */
  snapshot(name?: string | { name?: string }, options: RequestOptions = {}): Promise<Snapshot> {
    const request = typeof name === "string" ? { name } : name ?? {};
    return this.apis.snapshots.create(this.id, request, options);
  }

  /** Its snapshots, newest first. */
  snapshots(options: RequestOptions = {}): Promise<Snapshot[]> {
    return this.apis.snapshots.list({ environment_id: this.id }, options);
  }

  /** Puts its files back as the snapshot (or snapshot id) has them; its processes end. Updates `info`. */
  async restore(snapshot: string | Pick<Snapshot, "id">, options: GatedOptions = {}): Promise<EnvironmentInfo> {
    const id = typeof snapshot === "string" ? snapshot : snapshot.id;
    this.record = await this.apis.snapshots.restore(this.id, id, options);
    return this.record;
  }

  /** A new environment with a copy of its files and settings. */
  async fork(request: ForkRequest = {}, options: RequestOptions = {}): Promise<Environment> {
    return new Environment(this.apis, await this.apis.snapshots.fork(this.id, request, options));
  }

  /**
   * A URL that opens `port` inside the environment in a browser, without
   * the token, until `ttlS` seconds pass (moatd's default when left out),
   * the preview is revoked (`env.previews`), or the environment ends.
   */
  async getUrl(port: number, options: CreatePreviewOptions = {}): Promise<string> {
    return (await this.apis.previews.create(this.id, port, options)).url;
  }

  /** Destroys it (idempotent); `info` then says `gone`. */
  async destroy(options: RequestOptions = {}): Promise<void> {
    await this.apis.environments.destroy(this.id, options);
    this.record = { ...this.record, state: "gone", reason: this.record.reason ?? "destroyed" };
  }
}
