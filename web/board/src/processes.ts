// What the terminal can attach to: an environment's running pty processes
// (GET /v1/environments/{id}/processes), shells of other viewers included
// (kind "shell"). A small list with an Attach button each, and "New shell"
// and "Refresh" above it.

import { type Process, enc, getJson } from "./api";
import { button, el, replace, setText } from "./dom";
import { messageOf } from "./errors";

export interface ProcessPicker {
  readonly node: HTMLElement;
  /** Reads the list again. */
  refresh(): Promise<void>;
  /** Marks the process the terminal shows (undefined: none yet). */
  attached(process: number | undefined): void;
}

/** `attach(undefined)` asks for a new shell; `attach(P)` for process P. */
export function processPicker(envId: string, attach: (process: number | undefined) => void): ProcessPicker {
  const list = el("ul", { class: "term-procs", "data-testid": "terminal-processes" });
  const note = el("span", { class: "muted", "data-testid": "terminal-processes-status", role: "status" });
  let current: number | undefined;
  let procs: Process[] = [];

  const render = () => {
    replace(
      list,
      ...procs.map((p) =>
        el(
          "li",
          { "data-testid": "terminal-process", "data-process": p.id, class: p.id === current ? "attached" : "" },
          el("span", { class: "mono" }, `#${p.id} ${p.kind} `, el("code", {}, p.cmd.join(" ")), ` (${p.state}, pid ${p.pid})`),
          p.id === current
            ? el("span", { class: "muted" }, " attached")
            : button("Attach", { "data-testid": "terminal-attach" }, () => attach(p.id)),
        ),
      ),
    );
    setText(note, procs.length ? "" : "no running terminal process");
  };

  const refresh = async () => {
    try {
      const { processes } = await getJson<{ processes: Process[] }>(`/v1/environments/${enc(envId)}/processes`);
      procs = processes.filter((p) => p.pty && (p.state === "running" || p.state === "starting"));
      render();
    } catch (e) {
      setText(note, messageOf(e));
    }
  };

  const node = el(
    "div",
    { class: "term-pick" },
    el(
      "div",
      { class: "row" },
      button("New shell", { "data-testid": "terminal-new-shell", title: "a new shell on a new terminal" }, () => attach(undefined)),
      button("Refresh", { "data-testid": "terminal-refresh", title: "the running terminal processes again" }, refresh),
      note,
    ),
    list,
  );
  return {
    node,
    refresh,
    attached(process) {
      current = process;
      render();
    },
  };
}
