// Agent runs (docs/AGENTS.md): a card per run, linked to its environment's
// card, showing its state, turns, tokens and what the model said and called
// last; and the run's transcript, followed live, for the inspect panel.

import { type AgentRun, type Transcript, type TranscriptStep, enc, getJson, query, send } from "./api";
import { button, el, setText } from "./dom";
import { messageOf, report } from "./errors";
import { clock, cut, duration } from "./format";
import { may } from "./session";

const ENDED = new Set(["completed", "failed", "max_iterations", "stopped"]);
/** Tool calls an agent card shows (the newest). */
const CARD_TOOLS = 4;

export interface AgentHooks {
  showEnvironment(envId: string): void;
  inspectRun(runId: string, envId: string | undefined): void;
}

/** A step of a transcript in a line. */
export function stepLine(s: TranscriptStep): string {
  switch (s.kind) {
    case "instruction":
      return `instruction: ${s.text ?? ""}`;
    case "model": {
      const calls = (s.tool_calls ?? []).map((c) => `${c.name} ${JSON.stringify(c.arguments)}`);
      return `model (turn ${s.iteration ?? "?"}): ${s.text ?? ""}${calls.length ? `\n  calls: ${calls.join("\n         ")}` : ""}`;
    }
    case "tool_result":
      return `${s.name ?? "tool"} ${s.is_error ? "error" : "result"}${s.redacted ? ` (${s.redacted} redacted)` : ""}: ${s.content ?? ""}`;
    case "retry":
      return `retry: ${s.reason ?? ""}`;
    case "end":
      return `end: ${s.state ?? ""} after ${s.iterations ?? "?"} turns${s.reason ? `: ${s.reason}` : ""}`;
    default:
      return s.kind;
  }
}

class AgentCard {
  run: AgentRun;
  readonly node: HTMLElement;
  private readonly stateBadge: HTMLElement;
  private readonly meta = document.createTextNode("");
  private readonly envLink: HTMLButtonElement;
  private readonly text: HTMLElement;
  private readonly tools: HTMLElement;
  private readonly status: HTMLElement;
  private readonly stop: HTMLButtonElement;
  lastSeq = 0;
  search = "";

  constructor(run: AgentRun, hooks: AgentHooks) {
    this.run = run;
    this.stateBadge = el("span", { class: "badge state", "data-testid": "agent-state" });
    this.envLink = button("", { class: "link", "data-testid": "agent-env" }, () => {
      if (this.run.environment) hooks.showEnvironment(this.run.environment);
    });
    this.text = el("div", { class: "agent-text", "data-testid": "agent-text" });
    this.tools = el("ol", { class: "card-events", "data-testid": "agent-tools" });
    this.status = el("div", { class: "card-status", role: "status" });
    this.stop = button("Stop", { class: "danger", "data-testid": "agent-stop" }, () => this.stopRun());
    if (!may("destroy")) {
      this.stop.disabled = true;
      this.stop.title = "needs the 'destroy' scope";
    }
    this.node = el(
      "article",
      { class: "card agent-card", "data-testid": "agent-card", "data-run": run.id },
      el("header", { class: "card-head" }, el("span", { class: "card-id" }, `agent ${run.id}`), this.stateBadge),
      el("div", { class: "card-time" }, this.meta),
      el("div", {}, this.envLink),
      this.text,
      this.tools,
      el("div", { class: "card-actions" }, button("Transcript", { class: "primary", "data-testid": "agent-inspect" }, () => hooks.inspectRun(this.run.id, this.run.environment)), this.stop),
      this.status,
    );
    this.update(run);
  }

  update(run: AgentRun): void {
    this.run = run;
    this.node.dataset["state"] = run.state;
    setText(this.stateBadge, run.state);
    this.stateBadge.className = `badge state state-${ENDED.has(run.state) ? (run.state === "completed" ? "done" : "failed") : "running"}`;
    const tokens = run.usage ? `${run.usage.input_tokens ?? 0} in / ${run.usage.output_tokens ?? 0} out tokens` : "";
    const model = run.provider ? `${run.provider.kind ?? ""} ${run.provider.model ?? ""}` : "";
    const age = run.ended_at ? `ran ${duration(Date.parse(run.ended_at) - Date.parse(run.created_at))}` : `started ${clock(run.created_at)}`;
    setText(this.meta, `${model} · turn ${run.iterations}/${run.max_iterations} · ${tokens} · ${age}`);
    this.envLink.hidden = !run.environment;
    setText(this.envLink, run.environment ? `environment ${run.environment}` : "");
    if (run.result) setText(this.text, cut(run.result, 400));
    if (run.error) {
      setText(this.text, cut(run.error, 400));
      this.text.classList.add("error");
    }
    this.stop.hidden = ENDED.has(run.state);
    this.search = [run.id, run.state, run.environment ?? "", model].join(" ").toLowerCase();
  }

  /** New steps of the transcript: the model's latest text and tool calls. */
  steps(steps: TranscriptStep[]): void {
    for (const s of steps) {
      this.lastSeq = Math.max(this.lastSeq, s.seq);
      if (s.kind === "model") {
        if (s.text && !this.run.result && !this.run.error) setText(this.text, cut(s.text, 400));
        for (const c of s.tool_calls ?? []) {
          this.tools.prepend(el("li", { class: "ev tone-info", title: JSON.stringify(c.arguments) }, el("time", {}, clock(s.at)), " ", cut(`${c.name} ${JSON.stringify(c.arguments)}`, 160)));
        }
      } else if (s.kind === "tool_result") {
        const first = this.tools.firstElementChild;
        if (first && s.is_error) first.className = "ev tone-bad";
      }
    }
    while (this.tools.childElementCount > CARD_TOOLS) this.tools.lastElementChild?.remove();
  }

  private async stopRun(): Promise<void> {
    setText(this.status, "stopping…");
    try {
      this.update(await send<AgentRun>("POST", `/v1/agents/${enc(this.run.id)}/stop`));
      setText(this.status, "stopped");
    } catch (e) {
      setText(this.status, messageOf(e));
      report(`stop agent ${this.run.id}`, e);
    }
  }
}

export class Agents {
  readonly node: HTMLElement;
  private readonly grid: HTMLElement;
  private readonly runs = new Map<string, AgentCard>();
  private readonly refreshing = new Map<string, ReturnType<typeof setTimeout>>();
  private text = "";

  constructor(private readonly hooks: AgentHooks) {
    this.grid = el("div", { class: "grid agents-grid", "data-testid": "agent-cards" });
    this.node = el("section", { class: "agents", hidden: true, "data-testid": "agents" }, el("h2", {}, "Agent runs"), this.grid);
  }

  card(id: string): HTMLElement | undefined {
    return this.runs.get(id)?.node;
  }

  async load(): Promise<void> {
    const { agents } = await getJson<{ agents: AgentRun[] }>("/v1/agents");
    for (const run of [...agents].reverse()) this.upsert(run);
  }

  upsert(run: AgentRun): void {
    const card = this.runs.get(run.id);
    if (card) {
      card.update(run);
      return;
    }
    const fresh = new AgentCard(run, this.hooks);
    this.runs.set(run.id, fresh);
    this.grid.prepend(fresh.node);
    this.node.hidden = false;
    fresh.node.hidden = !!this.text && !fresh.search.includes(this.text);
    this.scheduleRefresh(run.id, 0);
  }

  /** An agent.* event: re-read the run and its new steps (at most a few times a second). */
  scheduleRefresh(id: string, delayMs = 250): void {
    if (this.refreshing.has(id)) return;
    this.refreshing.set(
      id,
      setTimeout(() => {
        this.refreshing.delete(id);
        void this.refresh(id);
      }, delayMs),
    );
  }

  private async refresh(id: string): Promise<void> {
    try {
      const run = await getJson<AgentRun>(`/v1/agents/${enc(id)}`);
      this.upsert(run);
      const card = this.runs.get(id);
      if (!card) return;
      const t = await getJson<Transcript>(`/v1/agents/${enc(id)}/transcript${query({ after: card.lastSeq || undefined })}`);
      card.steps(t.steps);
    } catch (e) {
      report(`agent ${id}`, e);
    }
  }

  setText(text: string): void {
    this.text = text;
    for (const c of this.runs.values()) c.node.hidden = !!text && !c.search.includes(text);
  }
}

/** A run's whole transcript, followed while the run goes on. */
export function openTranscript(runId: string): { node: HTMLElement; dispose(): void } {
  const list = el("ol", { class: "transcript", "data-testid": "transcript" });
  const streaming = el("pre", { class: "streaming", "data-testid": "transcript-streaming" });
  const status = el("div", { class: "timeline-status", role: "status" }, "reading the transcript…");
  const abort = new AbortController();
  let after = 0;

  const follow = async () => {
    for (;;) {
      let t: Transcript;
      try {
        t = await getJson<Transcript>(`/v1/agents/${enc(runId)}/transcript${query({ after: after || undefined, wait: after ? 30 : undefined })}`, abort.signal);
      } catch (e) {
        if (abort.signal.aborted) return;
        setText(status, `transcript: ${messageOf(e)}`);
        status.classList.add("error");
        return;
      }
      for (const s of t.steps) {
        after = Math.max(after, s.seq);
        list.append(el("li", { class: `step step-${s.kind}`, "data-testid": "transcript-step", "data-kind": s.kind }, el("time", {}, clock(s.at)), " ", el("pre", {}, stepLine(s))));
      }
      setText(streaming, t.streaming ?? "");
      const ended = t.steps.some((s) => s.kind === "end") || list.querySelector("[data-kind=end]") !== null;
      setText(status, `${list.childElementCount} steps${ended ? "; the run has ended" : "; following"}`);
      if (ended || abort.signal.aborted) return;
    }
  };
  void follow();
  return {
    node: el("div", { class: "transcript-view" }, status, list, streaming),
    dispose: () => abort.abort(),
  };
}
