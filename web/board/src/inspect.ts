// The inspect panel for one card: a terminal, the file browser, the
// changes since its template or a snapshot, the audit
// timeline and, for an agent run, its transcript. Each tab is made the
// first time it is shown and kept (a terminal stays connected) until the
// panel closes or shows another card.

import type { AuditEvent } from "./api";
import { openTranscript } from "./agents";
import { button, el, replace, setText } from "./dom";
import { openChanges } from "./changes";
import { openFiles } from "./files";
import { may, who } from "./session";
import { openTerminal } from "./terminal";
import { type TimelineView, openTimeline } from "./timeline";

type Tab = "terminal" | "files" | "changes" | "timeline" | "transcript";

interface Opened {
  node: HTMLElement;
  dispose?: () => void;
  /** Shown again (after another tab). */
  shown?: () => void;
}

export class Inspector {
  readonly node: HTMLElement;
  private readonly title = document.createTextNode("");
  private readonly tabBar: HTMLElement;
  private readonly body: HTMLElement;
  private envId: string | undefined;
  private runId: string | undefined;
  private views = new Map<Tab, Opened>();
  private timeline: TimelineView | null = null;
  private current: Tab | null = null;

  constructor() {
    this.tabBar = el("nav", { class: "tabs", role: "tablist" });
    this.body = el("div", { class: "inspect-body" });
    this.node = el(
      "aside",
      { class: "inspect", "data-testid": "inspect", hidden: true, "aria-label": "inspect" },
      el("header", { class: "inspect-head" }, el("h2", { "data-testid": "inspect-title" }, this.title), button("Close", { "data-testid": "inspect-close" }, () => this.close())),
      this.tabBar,
      this.body,
    );
    document.addEventListener("keydown", this.onKey);
  }

  // Escape closes the panel, unless it is typed into the panel (the terminal).
  private readonly onKey = (ev: KeyboardEvent) => {
    if (ev.key === "Escape" && !this.node.hidden && !this.node.contains(document.activeElement)) this.close();
  };

  dispose(): void {
    this.close();
    document.removeEventListener("keydown", this.onKey);
  }

  get environment(): string | undefined {
    return this.node.hidden ? undefined : this.envId;
  }

  /** Shows an environment (and, for an agent's, its run). */
  open(envId: string | undefined, runId?: string, tab?: Tab): void {
    if (this.node.hidden || envId !== this.envId || runId !== this.runId) {
      this.reset();
      this.envId = envId;
      this.runId = runId;
    }
    const tabs: Tab[] = [];
    if (envId) {
      if (may("exec")) tabs.push("terminal");
      if (may("files")) tabs.push("files", "changes");
      if (may("audit")) tabs.push("timeline");
    }
    if (runId) tabs.push("transcript");
    setText(this.title, [runId ? `agent ${runId}` : "", envId ? `environment ${envId}` : ""].filter(Boolean).join(" · "));
    replace(
      this.tabBar,
      ...tabs.map((t) => button(t, { role: "tab", class: "tab", "data-tab": t, "data-testid": `tab-${t}` }, () => this.show(t))),
    );
    if (tabs.length === 0) replace(this.body, el("p", { class: "muted" }, "This key may not look inside (exec, files or audit scope)."));
    this.node.hidden = false;
    document.body.classList.add("inspecting");
    const first = tab && tabs.includes(tab) ? tab : tabs[0];
    if (first) this.show(first);
  }

  show(tab: Tab): void {
    this.current = tab;
    for (const b of this.tabBar.querySelectorAll<HTMLElement>(".tab")) b.setAttribute("aria-selected", String(b.dataset["tab"] === tab));
    let view = this.views.get(tab);
    if (!view) {
      view = this.make(tab);
      this.views.set(tab, view);
      view.node.dataset["view"] = tab;
      this.body.append(view.node);
    } else view.shown?.();
    for (const [t, v] of this.views) v.node.hidden = t !== tab;
  }

  private make(tab: Tab): Opened {
    const env = this.envId ?? "";
    switch (tab) {
      case "terminal":
        return openTerminal(env);
      case "files":
        return openFiles(env);
      case "changes":
        return openChanges(env);
      case "timeline":
        this.timeline = openTimeline(env, who().master);
        return this.timeline;
      case "transcript":
        return openTranscript(this.runId ?? "");
    }
  }

  /** A live event: the timeline of the environment shown takes it. */
  live(e: AuditEvent): void {
    if (e.environment === this.envId) this.timeline?.live(e);
  }

  close(): void {
    this.reset();
    this.node.hidden = true;
    document.body.classList.remove("inspecting");
  }

  private reset(): void {
    for (const v of this.views.values()) v.dispose?.();
    this.views.clear();
    this.timeline = null;
    this.current = null;
    replace(this.body);
  }

  get tab(): Tab | null {
    return this.current;
  }
}
