// The client: `new Moat()` (moatd's address and token found as the CLI finds
// them) or `new Moat({ baseUrl, token })`. `moat.create()` returns an
// Environment handle; `moat.environments.*` are the same calls on plain records.

import { Agents } from "./agents.js";
import { Approvals } from "./approvals.js";
import { type MoatOptions, Transport } from "./client.js";
import { Environment } from "./environment.js";
import { Environments } from "./environments.js";
import { Keys } from "./keys.js";
import { Previews } from "./previews.js";
import { Snapshots } from "./snapshots.js";
import { Templates } from "./templates.js";
import type { CreateEnvironmentRequest, Health, ListEnvironmentsFilter, RequestOptions } from "./types.js";

export class Moat {
  /** Environments as plain records, and under them exec, files, processes and the shell (the handle's calls take the id). */
  readonly environments: Environments;
  /** Templates environments start from: list, import, build, remove (docs/TEMPLATES.md). */
  readonly templates: Templates;
  /** Preview URLs of environments' ports (`env.getUrl(port)` is the short way). */
  readonly previews: Previews;
  /** Snapshots of environments' files, restores and forks. */
  readonly snapshots: Snapshots;
  /** Scoped API keys (master token only). */
  readonly keys: Keys;
  /** What the gate asks a person (master token or the `approve` scope). */
  readonly approvals: Approvals;
  /** Agent runs moatd drives itself (docs/AGENTS.md); see also createAgent. */
  readonly agents: Agents;
  /** The transport every call goes through (base URL, token, timeouts, retries). */
  readonly transport: Transport;

  constructor(options: MoatOptions = {}) {
    this.transport = new Transport(options);
    this.environments = new Environments(this.transport);
    this.templates = new Templates(this.transport);
    this.previews = new Previews(this.transport);
    this.snapshots = new Snapshots(this.transport);
    this.keys = new Keys(this.transport);
    this.approvals = new Approvals(this.transport);
    this.agents = new Agents(this.transport);
  }

  /**
   * Creates an environment and returns its handle (never retried: a POST).
   * See CreateEnvironmentRequest for the fields (`template`, `spec`,
   * `ttl_s`, `network`, ...).
   */
  async create(request: CreateEnvironmentRequest = {}, options: RequestOptions = {}): Promise<Environment> {
    return new Environment(this, await this.environments.create(request, options));
  }

  /** The handle of an existing environment (NotFoundError when there is none, or it is another key's). */
  async get(id: string, options: RequestOptions = {}): Promise<Environment> {
    return new Environment(this, await this.environments.get(id, options));
  }

  /** Handles of the environments, newest first; without `state`, gone ones are left out. */
  async list(filter: ListEnvironmentsFilter = {}, options: RequestOptions = {}): Promise<Environment[]> {
    return (await this.environments.list(filter, options)).map((info) => new Environment(this, info));
  }

  /** `GET /healthz` (needs no token). */
  health(options: RequestOptions = {}): Promise<Health> {
    return this.transport.json<Health>({ method: "GET", path: "/healthz", ...options });
  }

  /** `GET /metrics`: Prometheus text. */
  async metrics(options: RequestOptions = {}): Promise<string> {
    const answer = await this.transport.request({ method: "GET", path: "/metrics", ...options });
    return answer.body.toString("utf8");
  }

  /** Closes idle keep-alive connections (open streams and shells are not touched). */
  close(): void {
    this.transport.close();
  }
}
