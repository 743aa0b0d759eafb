// /v1/environments: create, list, get, destroy, TTL, pause/resume, exec; files, processes,
// the shell, permissions and the network policy hang off it.

import { type Transport, gatedCall, seg } from "./client.js";
import { Files } from "./files.js";
import { EnvironmentNetwork } from "./network.js";
import { EnvironmentPermissions } from "./permissions.js";
import { Processes } from "./processes.js";
import { Shell, openShell } from "./shell.js";
import type {
  CreateEnvironmentRequest,
  EnvironmentInfo,
  EnvironmentStats,
  ExecRequest,
  ExecResponse,
  ExecResult,
  GatedOptions,
  ListEnvironmentsFilter,
  PauseOptions,
  RequestOptions,
  ShellOptions,
} from "./types.js";

/** How much longer than its own `timeout_ms` an exec call waits for moatd's answer. */
export const EXEC_MARGIN_MS = 15_000;

export class Environments {
  /** Files inside environments. */
  readonly files: Files;
  /** Background processes in environments. */
  readonly processes: Processes;
  /** What the gate lets each environment do (its permission layers). */
  readonly permissions: EnvironmentPermissions;
  /** Where each environment may connect (its egress policy, docs/EGRESS.md). */
  readonly network: EnvironmentNetwork;

  constructor(private readonly transport: Transport) {
    this.files = new Files(transport);
    this.processes = new Processes(transport);
    this.permissions = new EnvironmentPermissions(transport);
    this.network = new EnvironmentNetwork(transport);
  }

  /**
   * Creates an environment (never retried: a POST). With a `network` policy
   * other than `"none"`, or `secrets`, it needs moatd's egress control
   * (UnavailableError from a moatd run with `--no-egress`).
   */
  create(request: CreateEnvironmentRequest = {}, options: RequestOptions = {}): Promise<EnvironmentInfo> {
    return this.transport.json<EnvironmentInfo>({ method: "POST", path: "/v1/environments", json: request, ...options });
  }

  /** Environments, newest first; without `state`, gone ones are left out. */
  async list(filter: ListEnvironmentsFilter = {}, options: RequestOptions = {}): Promise<EnvironmentInfo[]> {
    const labels = Object.entries(filter.labels ?? {}).map(([k, v]) => `${k}=${v}`);
    const answer = await this.transport.json<{ environments: EnvironmentInfo[] }>({
      method: "GET",
      path: "/v1/environments",
      query: { task_id: filter.task_id, state: filter.state, label: labels },
      ...options,
    });
    return answer.environments;
  }

  get(id: string, options: RequestOptions = {}): Promise<EnvironmentInfo> {
    return this.transport.json<EnvironmentInfo>({ method: "GET", path: `/v1/environments/${seg(id)}`, ...options });
  }

  /** What a running environment uses now (CPU time, memory, pids) beside its limits. */
  stats(id: string, options: RequestOptions = {}): Promise<EnvironmentStats> {
    return this.transport.json<EnvironmentStats>({
      method: "GET",
      path: `/v1/environments/${seg(id)}/stats`,
      ...options,
    });
  }

  /** Destroys an environment; destroying a gone one is fine (idempotent). */
  async destroy(id: string, options: RequestOptions = {}): Promise<void> {
    await this.transport.json({ method: "DELETE", path: `/v1/environments/${seg(id)}`, ...options });
  }

  /** Makes the environment expire `ttlS` seconds from now (longer or shorter). */
  setTimeout(id: string, ttlS: number, options: RequestOptions = {}): Promise<EnvironmentInfo> {
    return this.transport.json<EnvironmentInfo>({
      method: "POST",
      path: `/v1/environments/${seg(id)}/timeout`,
      json: { ttl_s: ttlS },
      ...options,
    });
  }

  /**
   * Stops every process of the environment where it is (docs/PAUSE.md):
   * `state` becomes `"paused"`, with `paused_at`. While paused, exec,
   * new processes, shells and file changes throw ConflictError (409);
   * file reads, snapshots and forks still work. Its time to live stops
   * unless it was created with `ttl_while_paused: "runs"`. Pausing a paused
   * one is no error. With `memory: "disk"` (microVMs) its memory is then
   * saved to disk and released; a file read brings it back into RAM, still
   * paused, until no read came for a while (docs/PAUSE.md, "To disk").
   * Never retried: a POST.
   */
  pause(id: string, options: PauseOptions = {}): Promise<EnvironmentInfo> {
    const { memory, ...rest } = options;
    return this.transport.json<EnvironmentInfo>({
      method: "POST",
      path: `/v1/environments/${seg(id)}/pause`,
      json: memory ? { memory } : {},
      ...rest,
    });
  }

  /**
   * Lets a paused environment's processes go on (`state` `"running"`); its
   * `expires_at` moves on by the pause's length unless its time to live ran
   * while paused. Resuming a running one is no error. Never retried: a POST.
   */
  resume(id: string, options: RequestOptions = {}): Promise<EnvironmentInfo> {
    return this.transport.json<EnvironmentInfo>({
      method: "POST",
      path: `/v1/environments/${seg(id)}/resume`,
      json: {},
      ...options,
    });
  }

  /**
   * Runs a command to its end. A failing command is a normal result (its
   * exit_code and stderr), not an error. Waits `timeout_ms` plus a margin
   * (the client's default when the request has no `timeout_ms`). Never
   * retried: a POST.
   *
   * The gate checks the command first: a denied one throws
   * DeniedByPolicyError; one that asks a person waits for the decision, or
   * with `{ approval: "async" }` throws ApprovalPendingError at once.
   */
  async exec(id: string, request: ExecRequest, options: GatedOptions = {}): Promise<ExecResult> {
    const body: Record<string, unknown> = { ...request };
    if (request.stdin !== undefined && typeof request.stdin !== "string") {
      body.stdin = Buffer.from(request.stdin).toString("base64");
      body.encoding = "base64";
    } else if (request.stdin !== undefined && request.encoding === "base64") {
      body.stdin = Buffer.from(request.stdin, "utf8").toString("base64");
    }
    const timeoutMs =
      options.timeoutMs ??
      (request.timeout_ms ? Math.max(this.transport.timeoutMs, request.timeout_ms + EXEC_MARGIN_MS) : undefined);
    const answer = await this.transport.json<ExecResponse>({
      method: "POST",
      path: `/v1/environments/${seg(id)}/exec`,
      json: body,
      ...gatedCall(options),
      timeoutMs,
    });
    const encoding = answer.encoding === "base64" ? "base64" : "utf8";
    const stdoutRaw = Buffer.from(answer.stdout, encoding);
    const stderrRaw = Buffer.from(answer.stderr, encoding);
    return {
      ...answer,
      stdout: encoding === "base64" ? stdoutRaw.toString("utf8") : answer.stdout,
      stderr: encoding === "base64" ? stderrRaw.toString("utf8") : answer.stderr,
      stdout_raw: stdoutRaw,
      stderr_raw: stderrRaw,
    };
  }

  /** Opens an interactive terminal (a WebSocket); see Shell. */
  shell(id: string, options: ShellOptions = {}): Promise<Shell> {
    return openShell(this.transport, id, options);
  }
}
