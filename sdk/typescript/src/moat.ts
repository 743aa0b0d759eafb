// The client: `new Moat({ baseUrl, token })`.

import { Agents } from "./agents.js";
import { Approvals } from "./approvals.js";
import { type MoatOptions, Transport } from "./client.js";
import { Environments } from "./environments.js";
import { Keys } from "./keys.js";
import { Snapshots } from "./snapshots.js";
import type { Health, RequestOptions } from "./types.js";

export class Moat {
  /** Environments, and under them exec, files, processes and the shell. */
  readonly environments: Environments;
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
    this.snapshots = new Snapshots(this.transport);
    this.keys = new Keys(this.transport);
    this.approvals = new Approvals(this.transport);
    this.agents = new Agents(this.transport);
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
