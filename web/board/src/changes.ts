// What an environment changed, for review before approving its next step
// (GET /v1/environments/{id}/changes): against its template or one of its
// snapshots, file by file, each text file's unified diff shown as lines of
// text. Paths, link targets and diffs are the environment's: text only.

import { enc, getJson, query } from "./api";
import { button, el, replace, setText } from "./dom";
import { messageOf } from "./errors";
import { bytes } from "./format";

export interface Change {
  path: string;
  change: "added" | "modified" | "deleted";
  type: "file" | "directory" | "symlink" | "other";
  size?: number;
  size_before?: number;
  mode?: string;
  target?: string;
  diff?: string;
  diff_omitted?: string;
}

interface Changes {
  against: string;
  truncated: boolean;
  changes: Change[];
}

interface Snapshot {
  id: string;
  name: string;
  created_at: string;
}

const OMITTED: Record<string, string> = {
  binary: "binary: no diff",
  too_large: "too large to diff",
  too_different: "too different to diff",
  budget: "no diff: the answer's diff budget is spent",
};

function sizeOf(c: Change): string {
  if (c.type === "directory") return "";
  if (c.change === "added") return bytes(c.size ?? 0);
  if (c.change === "deleted") return `was ${bytes(c.size_before ?? 0)}`;
  return c.size === c.size_before ? bytes(c.size ?? 0) : `${bytes(c.size_before ?? 0)} → ${bytes(c.size ?? 0)}`;
}

/** A unified diff as lines, each a text node in a span classed by its kind. */
function diffView(diff: string): HTMLElement {
  const pre = el("pre", { class: "diff", "data-testid": "change-diff" });
  for (const line of diff.split("\n")) {
    if (line === "") continue;
    const kind = line.startsWith("@@") ? "hunk" : line.startsWith("+") ? "add" : line.startsWith("-") ? "del" : "ctx";
    pre.append(el("span", { class: `diff-${kind}` }, line), "\n");
  }
  return pre;
}

function changeRow(c: Change): HTMLElement {
  const details: (HTMLElement | string)[] = [];
  if (c.mode) details.push(`mode ${c.mode}`);
  if (c.type === "symlink") details.push(`→ ${c.target ?? ""}`);
  const head = el(
    "div",
    { class: "change-head" },
    el("span", { class: `change-kind change-${c.change}` }, c.change),
    " ",
    el("span", { class: "mono change-path", "data-testid": "change-path" }, c.type === "directory" ? `${c.path}/` : c.path),
    " ",
    el("span", { class: "muted" }, [sizeOf(c), ...details].filter(Boolean).join(" · ")),
  );
  const body: (HTMLElement | string)[] = [];
  if (c.diff) body.push(diffView(c.diff));
  else if (c.diff_omitted) body.push(el("p", { class: "muted" }, OMITTED[c.diff_omitted] ?? c.diff_omitted));
  return el("li", { class: "change", "data-testid": "change", "data-change": c.change }, head, ...body);
}

export function openChanges(envId: string): { node: HTMLElement } {
  const against = el("select", { "data-testid": "changes-against", "aria-label": "against" }, el("option", { value: "template" }, "its template"));
  const status = el("div", { class: "changes-status", "data-testid": "changes-status", role: "status" });
  const list = el("ul", { class: "changes", "data-testid": "changes-list" });

  const load = async () => {
    setText(status, "comparing…");
    status.classList.remove("error");
    try {
      const r = await getJson<Changes>(`/v1/environments/${enc(envId)}/changes${query({ against: against.value })}`);
      replace(list, ...r.changes.map(changeRow));
      const what = against.value === "template" ? "its template" : `snapshot ${against.value}`;
      setText(
        status,
        r.changes.length === 0
          ? `nothing changed since ${what}`
          : `${r.changes.length} change${r.changes.length === 1 ? "" : "s"} since ${what}${r.truncated ? " (more not listed)" : ""}`,
      );
    } catch (e) {
      replace(list);
      setText(status, `changes: ${messageOf(e)}`);
      status.classList.add("error");
    }
  };

  const snapshots = async () => {
    try {
      const r = await getJson<{ snapshots: Snapshot[] }>(`/v1/environments/${enc(envId)}/snapshots`);
      for (const s of r.snapshots) {
        against.append(el("option", { value: s.id }, `snapshot ${s.name ? `“${s.name}” ` : ""}${s.id}`));
      }
    } catch {
      // Without the snapshots scope: the template only.
    }
  };

  against.addEventListener("change", () => void load());
  const node = el(
    "section",
    { class: "changes-view" },
    el("div", { class: "changes-bar" }, "Changes since ", against, " ", button("Refresh", { "data-testid": "changes-refresh" }, () => load())),
    status,
    list,
  );
  void snapshots();
  void load();
  return { node };
}
