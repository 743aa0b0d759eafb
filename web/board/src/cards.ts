// The board's environment cards: one per environment, kept in a Map by id
// and updated in place (state, times, stats, events, approvals), so a fleet
// of hundreds stays smooth: nothing re-renders the whole grid. Work for a
// card out of view (its sparklines, its clock) waits until it scrolls in.

import { type AuditEvent, type EnvStats, type Environment, enc, getJson, send } from "./api";
import { confirmDialog } from "./dialog";
import { button, el, replace, setText } from "./dom";
import { messageOf, report } from "./errors";
import { describeEvent } from "./events";
import { bytes, clock, cut, duration, labelPairs, percent } from "./format";
import { PLOT_STATES, type PlotState, Sparkline } from "./plots";
import { may } from "./session";

/** Events a card shows (the newest). */
const CARD_EVENTS = 5;
/** Stats samples a sparkline shows: a minute at the 2 s poll. */
export const HISTORY = 30;
/** A gone environment's card leaves the board this long after it ended. */
const GONE_KEEP_MS = 5 * 60_000;

export interface CardHooks {
  inspect(id: string): void;
  showAgent(runId: string): void;
}

export interface Filter {
  labels: [string, string | null][];
  state: string;
  text: string;
}

export function parseFilter(labels: string, state: string, text: string): Filter {
  const pairs: [string, string | null][] = [];
  for (const term of labels.split(/[\s,]+/)) {
    if (!term) continue;
    const at = term.indexOf("=");
    pairs.push(at < 0 ? [term, null] : [term.slice(0, at), term.slice(at + 1)]);
  }
  return { labels: pairs, state, text: text.trim().toLowerCase() };
}

const LIVE_STATES = new Set(["creating", "running", "paused", "destroying", "failed"]);

class Metric {
  readonly value = document.createTextNode("–");
  readonly spark: Sparkline;
  readonly node: HTMLElement;
  readonly history: number[] = [];

  constructor(name: string) {
    this.spark = new Sparkline(name);
    this.node = el("div", { class: `metric metric-${name}`, "data-testid": `metric-${name}` }, el("span", { class: "metric-name" }, name), el("span", { class: "metric-value" }, this.value), this.spark.node);
  }

  push(v: number): void {
    this.history.push(v);
    if (this.history.length > HISTORY) this.history.shift();
  }
}

export class EnvCard {
  env: Environment;
  readonly node: HTMLElement;
  readonly approvalsBox: HTMLElement;
  private readonly idText: HTMLElement;
  private readonly stateBadge: HTMLElement;
  private readonly netBadge: HTMLElement;
  private readonly agentLink: HTMLButtonElement;
  private readonly task: HTMLElement;
  private readonly labels: HTMLElement;
  private readonly timeText = document.createTextNode("");
  private readonly reasonText: HTMLElement;
  private readonly events: HTMLElement;
  private readonly status: HTMLElement;
  private readonly oom: HTMLElement;
  private readonly cpu = new Metric("cpu");
  private readonly mem = new Metric("mem");
  private readonly pids = new Metric("pids");
  private readonly disk = new Metric("disk");
  private readonly net = new Metric("net");
  private pidsMax = 8;
  private memMax = 1 << 20;
  private diskMax = 1 << 20;
  private netMax = 1024;
  private lastCpu: { usec: number; atMs: number } | null = null;
  private lastNet: { bytes: number; atMs: number } | null = null;
  private readonly actionButtons: HTMLButtonElement[] = [];
  /** Pause or Resume, by state (docs/PAUSE.md). */
  private readonly pauseButton: HTMLButtonElement;
  /** In the viewport (IntersectionObserver): only then are sparklines and clocks redrawn. */
  inView = false;
  /** When this page first saw the environment (a list older than that may not have it yet). */
  readonly seenAt = Date.now();
  private dirty = false;
  goneAtMs = 0;
  search = "";

  constructor(env: Environment, private readonly hooks: CardHooks) {
    this.env = env;
    this.idText = el("span", { class: "card-id", "data-testid": "card-id" }, env.id);
    this.stateBadge = el("span", { class: "badge state", "data-testid": "card-state" });
    this.netBadge = el("span", { class: "badge net", "data-testid": "card-network" });
    this.agentLink = button("agent", { class: "link agent-link", "data-testid": "card-agent", hidden: true }, () => {
      const run = this.env.labels["moat-agent-run"];
      if (run) this.hooks.showAgent(run);
    });
    this.task = el("div", { class: "card-task", "data-testid": "card-task" });
    this.labels = el("ul", { class: "card-labels", "data-testid": "card-labels" });
    this.reasonText = el("div", { class: "card-reason", "data-testid": "card-reason" });
    this.events = el("ol", { class: "card-events", "data-testid": "card-events" });
    this.status = el("div", { class: "card-status", "data-testid": "card-status", role: "status" });
    this.oom = el("span", { class: "badge oom", hidden: true });
    this.approvalsBox = el("div", { class: "card-approvals", "data-testid": "card-approvals" });

    const act = (label: string, testid: string, scope: string, fn: () => Promise<unknown> | void) => {
      const b = button(label, { "data-testid": testid, class: testid === "terminate" ? "danger" : "" }, fn);
      if (!may(scope)) {
        b.disabled = true;
        b.title = `needs the '${scope}' scope`;
      } else {
        this.actionButtons.push(b);
      }
      return b;
    };
    const actions = el(
      "div",
      { class: "card-actions" },
      button("Inspect", { "data-testid": "inspect", class: "primary" }, () => this.hooks.inspect(this.env.id)),
      act("Snapshot", "snapshot", "snapshots", () => this.snapshot()),
      act("Fork", "fork", "create", () => this.fork()),
      (this.pauseButton = act("Pause", "pause", "pause", () => this.togglePause())),
      act("+10 min", "extend", "timeout", () => this.extend()),
      act("Terminate", "terminate", "destroy", () => this.confirmTerminate()),
    );

    this.node = el(
      "article",
      { class: "card", "data-testid": "card", "data-env": env.id },
      el("header", { class: "card-head" }, this.idText, this.stateBadge, this.netBadge, this.oom, this.agentLink),
      this.task,
      this.labels,
      el("div", { class: "card-time", "data-testid": "card-time" }, this.timeText),
      this.reasonText,
      el("div", { class: "card-metrics" }, this.cpu.node, this.mem.node, this.pids.node, this.disk.node, this.net.node),
      this.approvalsBox,
      this.events,
      actions,
      this.status,
    );
    this.update(env);
  }

  get id(): string {
    return this.env.id;
  }

  get live(): boolean {
    return LIVE_STATES.has(this.env.state);
  }

  update(env: Environment): void {
    const prev = this.env;
    this.env = env;
    this.node.dataset["state"] = env.state;
    setText(this.stateBadge, env.state);
    this.stateBadge.className = `badge state state-${env.state}`;
    setText(this.netBadge, `net ${env.network ?? "none"}`);
    setText(this.task, env.task_id || "(no task id)");
    this.task.classList.toggle("muted", !env.task_id);
    if (prev === env || JSON.stringify(prev.labels) !== JSON.stringify(env.labels) || this.labels.childElementCount === 0) {
      replace(this.labels, ...labelPairs(env.labels).map((p) => el("li", { class: "label", "data-testid": "card-label", title: p }, cut(p, 48))));
    }
    const run = env.labels["moat-agent-run"];
    this.agentLink.hidden = !run;
    if (run) setText(this.agentLink, `agent ${run}`);
    setText(this.reasonText, env.reason ?? "");
    const ended = env.state === "gone" || env.state === "failed";
    for (const b of this.actionButtons) b.disabled = ended || env.state === "destroying";
    setText(this.pauseButton, env.state === "paused" ? "Resume" : "Pause");
    this.node.classList.toggle("paused", env.state === "paused");
    if (env.state === "gone" && !this.goneAtMs) this.goneAtMs = Date.now();
    this.search = [env.id, env.task_id, env.state, env.template, env.network, env.reason ?? "", ...labelPairs(env.labels)].join(" ").toLowerCase();
    this.tick(Date.now());
  }

  /** Age and time left (redrawn every second while in view). */
  tick(nowMs: number): void {
    if (!this.inView) return;
    const created = Date.parse(this.env.created_at);
    const expires = Date.parse(this.env.expires_at);
    let text = `age ${duration(nowMs - created)}`;
    if (this.env.state === "paused" && this.env.paused_at) {
      // On disk, or back in RAM for a file read (Inspect's) until left alone.
      const where =
        this.env.paused_memory === "disk" ? " on disk" : this.env.back_to_disk ? " (in RAM for reads)" : "";
      text += ` · paused${where} ${duration(nowMs - Date.parse(this.env.paused_at))}`;
      // Stopped with the pause: what is left is what was left.
      const left = expires - (this.env.ttl_while_paused === "runs" ? nowMs : Date.parse(this.env.paused_at));
      text += left > 0 ? ` · ${duration(left)} left` : " · expiring";
    } else if (this.env.state === "running" || this.env.state === "creating") {
      const left = expires - nowMs;
      text += left > 0 ? ` · ${duration(left)} left` : " · expiring";
      this.node.classList.toggle("expiring", left < 60_000);
    }
    setText(this.timeText, text);
  }

  setInView(inView: boolean): void {
    this.inView = inView;
    if (inView) {
      this.tick(Date.now());
      if (this.dirty) this.drawStats();
    }
  }

  applyStats(s: EnvStats, atMs: number): void {
    if (s.cpu_usec !== null) {
      if (this.lastCpu && atMs > this.lastCpu.atMs) {
        const used = (s.cpu_usec - this.lastCpu.usec) / ((atMs - this.lastCpu.atMs) * 1000);
        this.cpu.push((Math.max(0, used) / Math.max(0.01, s.cpus)) * 100);
      }
      this.lastCpu = { usec: s.cpu_usec, atMs };
    }
    this.mem.push(s.memory_bytes);
    this.pids.push(s.pids);
    // CPU is drawn against its limit; memory and pids against their recent
    // peak (their limits dwarf a quiet environment's use; the text gives both).
    this.pidsMax = Math.max(8, ...this.pids.history.map((v) => v * 1.25));
    this.memMax = Math.max(1 << 20, ...this.mem.history.map((v) => v * 1.25));
    const cpuNow = this.cpu.history[this.cpu.history.length - 1];
    const cpuLabel = s.cpus === 1 ? "1 CPU" : `${s.cpus} CPUs`;
    this.cpu.value.data = s.cpu_usec === null ? `n/a (${cpuLabel})` : `${cpuNow === undefined ? "…" : percent(cpuNow)} of ${cpuLabel}`;
    this.mem.value.data = `${bytes(s.memory_bytes)} / ${bytes(s.memory_limit_bytes)}`;
    this.pids.value.data = `${s.pids} / ${s.pids_limit}`;
    // Storage against its recent peak; the network as bytes a second both
    // ways (its line: the totals sent and received).
    if (s.storage_bytes !== null) {
      this.disk.push(s.storage_bytes);
      this.diskMax = Math.max(1 << 20, ...this.disk.history.map((v) => v * 1.25));
    }
    this.disk.value.data = s.storage_bytes === null ? "n/a" : `${bytes(s.storage_bytes)} / ${bytes(s.storage_limit_bytes)}`;
    if (s.network_sent_bytes !== null && s.network_received_bytes !== null) {
      const total = s.network_sent_bytes + s.network_received_bytes;
      if (this.lastNet && atMs > this.lastNet.atMs) {
        this.net.push((Math.max(0, total - this.lastNet.bytes) * 1000) / (atMs - this.lastNet.atMs));
        this.netMax = Math.max(1024, ...this.net.history.map((v) => v * 1.25));
      }
      this.lastNet = { bytes: total, atMs };
      this.net.value.data = `↑${bytes(s.network_sent_bytes)} ↓${bytes(s.network_received_bytes)}`;
    } else {
      this.net.value.data = "n/a";
    }
    this.oom.hidden = s.oom_kills === 0;
    if (s.oom_kills) setText(this.oom, `OOM ×${s.oom_kills}`);
    this.dirty = true;
    if (this.inView) this.drawStats();
  }

  private drawStats(): void {
    this.dirty = false;
    this.cpu.spark.draw(this.cpu.history, 100, HISTORY);
    this.mem.spark.draw(this.mem.history, this.memMax, HISTORY);
    this.pids.spark.draw(this.pids.history, this.pidsMax, HISTORY);
    this.disk.spark.draw(this.disk.history, this.diskMax, HISTORY);
    this.net.spark.draw(this.net.history, this.netMax, HISTORY);
  }

  /** The newest events first; at most CARD_EVENTS. */
  addEvent(e: AuditEvent): void {
    const said = describeEvent(e);
    const process = typeof e.data?.["process"] === "number" ? String(e.data["process"]) : undefined;
    const li = el(
      "li",
      { class: `ev tone-${said.tone}`, "data-testid": "card-event", "data-type": e.type, "data-process": process, title: said.text },
      el("time", {}, clock(e.time)),
      " ",
      cut(said.text, 200),
    );
    // A command's end takes the place of its start (the line says both).
    if (process !== undefined && e.type.endsWith(".ended")) {
      for (const old of this.events.querySelectorAll<HTMLElement>("li[data-process]")) {
        if (old.dataset["process"] === process && old.dataset["type"] === e.type.replace(".ended", ".started")) old.remove();
      }
    }
    this.events.prepend(li);
    while (this.events.childElementCount > CARD_EVENTS) this.events.lastElementChild?.remove();
  }

  say(text: string, error = false): void {
    this.status.textContent = text;
    this.status.classList.toggle("error", error);
  }

  private async run(what: string, fn: () => Promise<string>): Promise<void> {
    this.say(`${what}…`);
    try {
      this.say(await fn());
    } catch (e) {
      this.say(`${what}: ${messageOf(e)}`, true);
      report(`${what} ${this.id}`, e);
    }
  }

  private snapshot(): Promise<void> {
    return this.run("snapshot", async () => {
      const snap = await send<{ id: string }>("POST", `/v1/environments/${enc(this.id)}/snapshots`, { name: `board ${new Date().toISOString()}` });
      return `snapshot ${snap.id} taken`;
    });
  }

  private fork(): Promise<void> {
    return this.run("fork", async () => {
      const labels = { ...this.env.labels };
      delete labels["moat-agent-run"];
      delete labels["moat-agent"];
      const forked = await send<Environment>("POST", `/v1/environments/${enc(this.id)}/fork`, { labels });
      return `forked into ${forked.id}`;
    });
  }

  private togglePause(): Promise<void> {
    const resume = this.env.state === "paused";
    return this.run(resume ? "resume" : "pause", async () => {
      this.update(await send<Environment>("POST", `/v1/environments/${enc(this.id)}/${resume ? "resume" : "pause"}`, {}));
      return resume ? "resumed" : "paused: its processes are stopped";
    });
  }

  private extend(): Promise<void> {
    return this.run("extend", async () => {
      const left = Math.max(0, Math.round((Date.parse(this.env.expires_at) - Date.now()) / 1000));
      const ttl = Math.min(604800, left + 600);
      await send("POST", `/v1/environments/${enc(this.id)}/timeout`, { ttl_s: ttl });
      this.update(await getJson<Environment>(`/v1/environments/${enc(this.id)}`));
      return `expires in ${duration(ttl * 1000)}`;
    });
  }

  private confirmTerminate(): void {
    confirmDialog({
      title: `Terminate ${this.id}?`,
      body: [
        `Environment ${this.id}${this.env.task_id ? ` (task ${this.env.task_id})` : ""} and every process in it end now; its files go with it (snapshots stay).`,
      ],
      confirm: "Terminate",
      danger: true,
      action: async () => {
        await send("DELETE", `/v1/environments/${enc(this.id)}`);
        this.say("terminated");
      },
    });
  }

  matches(f: Filter): boolean {
    const e = this.env;
    if (f.state === "live" ? !LIVE_STATES.has(e.state) : f.state !== "any" && f.state !== e.state) return false;
    for (const [k, v] of f.labels) {
      if (!(k in e.labels)) return false;
      if (v !== null && e.labels[k] !== v) return false;
    }
    return !f.text || this.search.includes(f.text);
  }
}

/** The grid of environment cards. */
export class Board {
  readonly node: HTMLElement;
  private readonly cards = new Map<string, EnvCard>();
  private readonly pendingEvents = new Map<string, AuditEvent[]>();
  private filter: Filter = parseFilter("", "live", "");
  private readonly observer: IntersectionObserver;
  private readonly countText = document.createTextNode("");
  readonly countNode: HTMLElement;

  constructor(private readonly hooks: CardHooks) {
    this.node = el("div", { class: "grid", "data-testid": "cards" });
    this.countNode = el("span", { class: "count", "data-testid": "card-count" }, this.countText);
    this.observer = new IntersectionObserver(
      (entries) => {
        for (const entry of entries) {
          const id = (entry.target as HTMLElement).dataset["env"];
          const card = id ? this.cards.get(id) : undefined;
          card?.setInView(entry.isIntersecting);
        }
      },
      { rootMargin: "200px" },
    );
  }

  card(id: string): EnvCard | undefined {
    return this.cards.get(id);
  }

  all(): IterableIterator<EnvCard> {
    return this.cards.values();
  }

  /** Adds or updates cards; new ones go first (newest first, like the API's list). */
  upsert(envs: Environment[], atEnd = false): void {
    const fresh = document.createDocumentFragment();
    for (const env of envs) {
      const existing = this.cards.get(env.id);
      if (existing) {
        existing.update(env);
        existing.node.hidden = !existing.matches(this.filter);
        continue;
      }
      const card = new EnvCard(env, this.hooks);
      this.cards.set(env.id, card);
      card.node.hidden = !card.matches(this.filter);
      for (const e of this.pendingEvents.get(env.id) ?? []) card.addEvent(e);
      this.pendingEvents.delete(env.id);
      fresh.append(card.node);
      this.observer.observe(card.node);
    }
    if (atEnd) this.node.append(fresh);
    else this.node.prepend(fresh);
    this.updateCount();
  }

  /** An environment ended (its destroyed event): the card stays a while, marked. */
  ended(id: string, state: "gone" | "failed", reason: string): void {
    const card = this.cards.get(id);
    if (!card) return;
    card.update({ ...card.env, state, reason });
    card.node.hidden = !card.matches(this.filter);
    this.updateCount();
  }

  remove(id: string): void {
    const card = this.cards.get(id);
    if (!card) return;
    this.observer.unobserve(card.node);
    card.node.remove();
    this.cards.delete(id);
    this.updateCount();
  }

  /** An event for a card; events of an environment not on the board yet wait for its card. */
  addEvent(e: AuditEvent): void {
    if (!e.environment) return;
    const card = this.cards.get(e.environment);
    if (card) {
      card.addEvent(e);
      return;
    }
    const waiting = this.pendingEvents.get(e.environment) ?? [];
    waiting.push(e);
    if (waiting.length > CARD_EVENTS) waiting.shift();
    this.pendingEvents.set(e.environment, waiting);
    if (this.pendingEvents.size > 2000) {
      const oldest = this.pendingEvents.keys().next().value;
      if (oldest !== undefined) this.pendingEvents.delete(oldest);
    }
  }

  applyStats(stats: EnvStats[], atMs: number): void {
    for (const s of stats) this.cards.get(s.id)?.applyStats(s, atMs);
  }

  setFilter(f: Filter): void {
    this.filter = f;
    for (const card of this.cards.values()) {
      const hidden = !card.matches(f);
      if (card.node.hidden !== hidden) card.node.hidden = hidden;
    }
    this.updateCount();
  }

  /** The live cards the filter shows (what "Terminate all" ends). */
  selected(): EnvCard[] {
    return [...this.cards.values()].filter((c) => c.matches(this.filter) && c.live && c.env.state !== "destroying");
  }

  tick(nowMs: number): void {
    for (const card of this.cards.values()) {
      if (card.goneAtMs && nowMs - card.goneAtMs > GONE_KEEP_MS) this.remove(card.id);
      else if (card.inView) card.tick(nowMs);
    }
  }

  counts(): Record<PlotState, number> {
    const counts = Object.fromEntries(PLOT_STATES.map((s) => [s, 0])) as Record<PlotState, number>;
    for (const card of this.cards.values()) counts[card.env.state as PlotState]++;
    return counts;
  }

  private updateCount(): void {
    let shown = 0;
    for (const c of this.cards.values()) if (!c.node.hidden) shown++;
    setText(this.countText, `${shown} of ${this.cards.size} environments shown`);
  }
}
