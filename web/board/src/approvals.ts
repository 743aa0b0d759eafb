// Pending approvals (docs/GATE.md, "Approvals (ask)"): each shows the exact
// action a person is asked about, on its environment's card and in the queue
// panel, with Approve, Approve & remember (and the rule that would add) and
// Deny (with a reason). The page title counts them: "(N) moat".

import { ApiError, type Approval, type GateAction, enc, getJson, send } from "./api";
import type { Board } from "./cards";
import { button, el, setText } from "./dom";
import { messageOf, report } from "./errors";
import { clock } from "./format";
import { may } from "./session";

// Variables that let a command load code of the caller's choosing: a
// remembered command rule names the ones it ran with (docs/GATE.md).
const CODE_LOADING = /^(LD_.*|GCONV_PATH|BASH_ENV|ENV|NODE_OPTIONS|PERL5OPT|PERL5LIB|PERLLIB|PYTHONPATH|PYTHONHOME|PYTHONSTARTUP|RUBYOPT|RUBYLIB|LUA_INIT|JAVA_TOOL_OPTIONS)$/;

/** The exact action, a line per field, as text. */
export function actionLines(a: GateAction): string[] {
  const lines: string[] = [];
  if (a.op) lines.push(`op: ${a.op}`);
  if (a.argv) lines.push(`argv: ${JSON.stringify(a.argv)}`);
  if (a.program) lines.push(`program: ${a.program}`);
  if (a.env && Object.keys(a.env).length) lines.push(`env: ${JSON.stringify(a.env)}`);
  if (a.parents?.length) lines.push(`parents: ${a.parents.join(" ← ")}`);
  if (a.path !== undefined) lines.push(`path: ${a.path}${a.tree ? " (and everything below it)" : ""}`);
  if (a.size !== undefined) lines.push(`size: ${a.size} bytes`);
  if (a.sha256) lines.push(`sha256: ${a.sha256}`);
  if (a.host !== undefined) lines.push(`host: ${a.host}`);
  if (a.host !== undefined) lines.push(`port: ${a.port ?? "any"}`);
  return lines;
}

/** The rule "Approve & remember" would put first in every layer. */
export function rememberedRule(a: GateAction): string {
  switch (a.scope) {
    case "run_command": {
      const vars = Object.keys(a.env ?? {}).filter((k) => CODE_LOADING.test(k));
      return `allow run_command exactly ${JSON.stringify(a.argv ?? [])}${vars.length ? ` with ${vars.join(", ")}` : ""}`;
    }
    case "read_file":
    case "write_file":
      return `allow ${a.scope} ${a.op ?? ""} exactly ${a.path ?? ""}`;
    case "network":
      return `allow network ${a.host ?? ""}${a.port ? ` port ${a.port}` : " (any port)"}`;
    default:
      return `allow ${a.scope} exactly this action`;
  }
}

interface Item {
  approval: Approval;
  queueNode: HTMLElement;
  cardNode: HTMLElement;
}

export class Approvals {
  readonly panel: HTMLElement;
  private readonly list: HTMLElement;
  private readonly note: HTMLElement;
  private readonly items = new Map<string, Item>();
  private readonly countText = document.createTextNode("0");
  private refusal = "";
  beep = false;
  private audio: AudioContext | null = null;

  constructor(
    private readonly board: Board,
    private readonly onCount: (n: number) => void,
  ) {
    this.list = el("div", { class: "queue-list", "data-testid": "queue-list" });
    this.note = el("p", { class: "muted", "data-testid": "queue-note" }, "No approval is waiting.");
    this.panel = el(
      "section",
      { class: "queue", "data-testid": "queue" },
      el("h2", {}, "Approvals ", el("span", { class: "badge", "data-testid": "queue-count" }, this.countText)),
      this.note,
      this.list,
    );
  }

  get size(): number {
    return this.items.size;
  }

  /** Re-reads the pending approvals (at start and with every stats poll). */
  async refresh(): Promise<void> {
    if (!may("approve")) {
      // Listing needs `approve` too: the stream still brings this key's own.
      this.refuse("listing and deciding them needs the 'approve' scope");
      return;
    }
    if (this.refusal) return;
    let pending: Approval[];
    try {
      pending = (await getJson<{ approvals: Approval[] }>("/v1/approvals?state=pending")).approvals;
    } catch (e) {
      if (e instanceof ApiError && e.status === 403) {
        this.refuse(messageOf(e));
        return;
      }
      throw e;
    }
    const seen = new Set<string>();
    for (const a of pending) {
      seen.add(a.id);
      this.add(a);
    }
    for (const id of [...this.items.keys()]) if (!seen.has(id)) this.drop(id);
  }

  /** Says once, in the panel, why the queue is not complete. */
  private refuse(why: string): void {
    if (this.refusal) return;
    this.refusal = why;
    setText(this.note, `Only approvals of this key's own environments show: ${why}.`);
    this.note.hidden = false;
  }

  add(a: Approval): void {
    if (a.state !== "pending" || this.items.has(a.id)) return;
    const item: Item = { approval: a, queueNode: this.render(a, "queue"), cardNode: this.render(a, "card") };
    this.items.set(a.id, item);
    this.list.prepend(item.queueNode);
    this.board.card(a.environment)?.approvalsBox.append(item.cardNode);
    this.changed(true);
  }

  /** A card came to the board: the approvals already waiting for it go on it. */
  placeOnCard(envId: string): void {
    const card = this.board.card(envId);
    if (!card) return;
    for (const item of this.items.values()) {
      if (item.approval.environment === envId && !item.cardNode.isConnected) card.approvalsBox.append(item.cardNode);
    }
  }

  /** Decided (here or elsewhere) or expired: it leaves the card and the queue. */
  drop(id: string): void {
    const item = this.items.get(id);
    if (!item) return;
    item.queueNode.remove();
    item.cardNode.remove();
    this.items.delete(id);
    this.changed(false);
  }

  private changed(added: boolean): void {
    setText(this.countText, String(this.items.size));
    if (!this.refusal) setText(this.note, this.items.size ? "" : "No approval is waiting.");
    this.note.hidden = this.items.size > 0 && !this.refusal;
    this.onCount(this.items.size);
    if (added && this.beep) this.playBeep();
  }

  private playBeep(): void {
    try {
      this.audio ??= new AudioContext();
      const osc = this.audio.createOscillator();
      const gain = this.audio.createGain();
      gain.gain.value = 0.05;
      osc.frequency.value = 880;
      osc.connect(gain).connect(this.audio.destination);
      osc.start();
      osc.stop(this.audio.currentTime + 0.12);
    } catch {
      // no audio device: the title badge still counts
    }
  }

  private render(a: Approval, where: "queue" | "card"): HTMLElement {
    const reason = el("input", { type: "text", class: "approval-reason", placeholder: "reason (sent with the decision)", "data-testid": "approval-reason", maxlength: 1000 });
    const error = el("div", { class: "form-error", "data-testid": "approval-error", role: "alert" });
    const canDecide = may("approve");
    const decide = async (decision: "approve" | "deny", remember: boolean) => {
      setText(error, "");
      try {
        await send("POST", `/v1/approvals/${enc(a.id)}`, { decision, reason: reason.value, remember });
        this.drop(a.id);
      } catch (e) {
        if (e instanceof ApiError && e.status === 409) {
          // decided elsewhere, or it expired: it is no longer pending
          this.drop(a.id);
          report(`approval ${a.id}`, e);
          return;
        }
        setText(error, messageOf(e));
      }
    };
    const buttons = [
      button("Approve", { class: "primary", "data-testid": "approve" }, () => decide("approve", false)),
      button("Approve & remember", { "data-testid": "approve-remember", title: rememberedRule(a.action) }, () => decide("approve", true)),
      button("Deny", { class: "danger", "data-testid": "deny" }, () => decide("deny", false)),
    ];
    if (!canDecide) for (const b of buttons) {
      b.disabled = true;
      b.title = "needs the 'approve' scope";
    }
    const head = el(
      "div",
      { class: "approval-head" },
      el("b", {}, a.scope),
      where === "queue" ? ` · environment ${a.environment}` : "",
      ` · asked by ${a.requester} at ${clock(a.created_at)}`,
    );
    const node = el(
      "div",
      { class: "approval", "data-testid": "approval", "data-approval": a.id, "data-env": a.environment },
      head,
      el("pre", { class: "approval-action", "data-testid": "approval-action" }, actionLines(a.action).join("\n")),
      el("div", { class: "approval-rule", "data-testid": "approval-rule" }, "Approve & remember adds: ", el("code", {}, rememberedRule(a.action))),
      reason,
      el("div", { class: "approval-buttons" }, ...buttons),
      error,
    );
    if (where === "queue") {
      const jump = button("show card", { class: "link" }, () => {
        const card = this.board.card(a.environment);
        if (!card) return;
        card.node.hidden = false;
        card.node.scrollIntoView({ block: "center", behavior: "smooth" });
        card.node.classList.add("flash");
        setTimeout(() => card.node.classList.remove("flash"), 1500);
      });
      head.append(" ", jump);
    }
    return node;
  }
}
