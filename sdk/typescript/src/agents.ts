// Agent runs moatd drives itself (docs/AGENTS.md): the model loop on the
// host, the model's tool calls in an environment of the run's own, each
// through the gate.
//
//   const agent = createAgent({ provider: "anthropic", model: "claude-sonnet-5",
//     permissions: { read_file: "allow", write_file: "ask", run_command: "ask", network: "deny" },
//     maxIterations: 30 });
//   const run = await agent.run("Install deps in the sandbox and report the build status");

import { type Transport, seg } from "./client.js";
import { Moat } from "./moat.js";
import type {
  AgentRun,
  AgentStep,
  CreateAgentRequest,
  EgressPolicy,
  Permissions,
  RequestOptions,
  SecretRequest,
  Spec,
} from "./types.js";

const ENDED = new Set(["completed", "failed", "max_iterations", "stopped"]);

export class Agents {
  constructor(private readonly transport: Transport) {}

  /** Starts a run (and its environment). Never retried: a POST. */
  start(request: CreateAgentRequest, options: RequestOptions = {}): Promise<AgentRun> {
    return this.transport.json<AgentRun>({ method: "POST", path: "/v1/agents", json: request, ...options });
  }

  /** The caller's runs (every run for the master token), newest first. */
  async list(options: RequestOptions = {}): Promise<AgentRun[]> {
    const answer = await this.transport.json<{ agents: AgentRun[] }>({ method: "GET", path: "/v1/agents", ...options });
    return answer.agents;
  }

  get(id: string, options: RequestOptions = {}): Promise<AgentRun> {
    return this.transport.json<AgentRun>({ method: "GET", path: `/v1/agents/${seg(id)}`, ...options });
  }

  /** Ends a run now; answers once it has ended. */
  stop(id: string, options: RequestOptions = {}): Promise<AgentRun> {
    return this.transport.json<AgentRun>({ method: "POST", path: `/v1/agents/${seg(id)}/stop`, ...options });
  }

  /** The steps after the `after`-th; with `wait` (s, at most 60), waits for one or the run's end. */
  async transcript(
    id: string,
    query: { after?: number; wait?: number } = {},
    options: RequestOptions = {},
  ): Promise<AgentStep[]> {
    const answer = await this.transport.json<{ steps: AgentStep[] }>({
      method: "GET",
      path: `/v1/agents/${seg(id)}/transcript`,
      query: { after: query.after, wait: query.wait },
      timeoutMs: ((query.wait ?? 0) + 30) * 1000,
      ...options,
    });
    return answer.steps;
  }

  /** Every step of the run as it happens, until the run ends. */
  async *follow(id: string, options: RequestOptions = {}): AsyncGenerator<AgentStep, AgentRun> {
    let seen = 0;
    for (;;) {
      for (const step of await this.transcript(id, { after: seen, wait: 20 }, options)) {
        seen = Math.max(seen, step.seq);
        yield step;
      }
      const run = await this.get(id, options);
      if (ENDED.has(run.state) && run.ended_at) {
        for (const step of await this.transcript(id, { after: seen }, options)) yield step;
        return run;
      }
    }
  }
}

/** The options of createAgent: the seed's names. */
export interface AgentOptions {
  provider: "anthropic" | "openai";
  model: string;
  /** As the provider's SDK takes it, e.g. http://127.0.0.1:11434/v1 for Ollama. */
  baseUrl?: string;
  /** Default: $ANTHROPIC_API_KEY or $OPENAI_API_KEY of this process (sent to moatd for the run only). */
  apiKey?: string;
  permissions?: Permissions;
  /** The runaway bound: model turns at most (default 30). */
  maxIterations?: number;
  timeoutS?: number;
  /** Input and output tokens in all (default: no bound). */
  tokenBudget?: number;
  keepEnvironment?: boolean;
  labels?: Record<string, string>;
  spec?: Partial<Spec>;
  network?: EgressPolicy;
  secrets?: SecretRequest[];
  /** The moatd to use (default: `new Moat()`, from MOAT_URL and MOAT_TOKEN). */
  client?: Moat;
}

export class Agent {
  readonly client: Moat;
  constructor(readonly options: AgentOptions) {
    this.client = options.client ?? new Moat();
  }

  /** Starts a run of `instruction` and returns at once. */
  start(instruction: string): Promise<AgentRun> {
    const o = this.options;
    const apiKey = o.apiKey ?? process.env[o.provider === "anthropic" ? "ANTHROPIC_API_KEY" : "OPENAI_API_KEY"];
    const request: CreateAgentRequest = {
      instruction,
      provider: { kind: o.provider, model: o.model, base_url: o.baseUrl, api_key: apiKey || undefined },
      permissions: o.permissions,
      max_iterations: o.maxIterations,
      timeout_s: o.timeoutS,
      token_budget: o.tokenBudget,
      keep_environment: o.keepEnvironment,
      labels: o.labels,
      spec: o.spec,
      network: o.network,
      secrets: o.secrets,
    };
    return this.client.agents.start(JSON.parse(JSON.stringify(request)) as CreateAgentRequest);
  }

  /** Runs `instruction` to its end (`onStep` hears each step) and returns the ended run. */
  async run(instruction: string, onStep?: (step: AgentStep) => void): Promise<AgentRun> {
    const started = await this.start(instruction);
    const steps = this.client.agents.follow(started.id);
    for (;;) {
      const next = await steps.next();
      if (next.done) return next.value;
      onStep?.(next.value);
    }
  }
}

export function createAgent(options: AgentOptions): Agent {
  return new Agent(options);
}
