// One environment's audit timeline (GET /v1/events?environment=ID), oldest
// first, a page at a time and then live; with the master token, the hash
// chain's verification (GET /v1/audit/verify) above it.

import { type AuditEvent, type VerifyResult, getJson } from "./api";
import { button, el, setText } from "./dom";
import { messageOf } from "./errors";
import { PAGE, describeEvent, eventsPage } from "./events";
import { dateTime } from "./format";

export interface TimelineView {
  readonly node: HTMLElement;
  /** A live event of this environment (from the board's stream). */
  live(e: AuditEvent): void;
}

export function openTimeline(envId: string, master: boolean): TimelineView {
  const verify = el("div", { class: "verify", "data-testid": "audit-verify", role: "status" });
  const rows = el("tbody", { "data-testid": "timeline-rows" });
  const status = el("div", { class: "timeline-status", "data-testid": "timeline-status" });
  const more = button("Load more", { hidden: true, "data-testid": "timeline-more" }, () => load());
  let last = 0;
  let atEnd = false;

  const row = (e: AuditEvent) => {
    const said = describeEvent(e);
    return el(
      "tr",
      { class: `tone-${said.tone}`, "data-testid": "timeline-event", "data-type": e.type },
      el("td", { class: "num" }, String(e.id)),
      el("td", {}, dateTime(e.time)),
      el("td", { class: "mono" }, e.type),
      el("td", {}, e.actor),
      el("td", { class: "what" }, said.text),
      el("td", { class: "mono muted", title: e.hash ?? "" }, (e.hash ?? "").slice(0, 10)),
    );
  };

  const load = async () => {
    setText(status, "reading the log…");
    try {
      const page = await eventsPage({ environment: envId, since: last });
      for (const e of page) {
        if (e.id <= last) continue;
        rows.append(row(e));
        last = e.id;
      }
      atEnd = page.length < PAGE;
      more.hidden = atEnd;
      setText(status, `${rows.childElementCount} events${atEnd ? ", live" : ""}`);
    } catch (e) {
      setText(status, `the log: ${messageOf(e)}`);
      status.classList.add("error");
    }
  };

  const check = async () => {
    setText(verify, "verifying the audit chain…");
    try {
      const r = await getJson<VerifyResult>("/v1/audit/verify");
      verify.className = `verify ${r.ok ? "ok" : "bad"}`;
      setText(
        verify,
        r.ok
          ? `The audit chain holds: ${r.checked} events checked${r.last ? `, up to event ${r.last.id} (${r.last.hash.slice(0, 12)}…)` : ""}.`
          : `The audit chain is broken at event ${r.first_broken?.id ?? "?"}: ${r.first_broken?.reason ?? "?"} (${r.checked} checked before it).`,
      );
    } catch (e) {
      verify.className = "verify bad";
      setText(verify, `verify: ${messageOf(e)}`);
    }
  };

  const node = el(
    "div",
    { class: "timeline", "data-testid": "timeline" },
    master ? el("div", { class: "verify-bar" }, verify, " ", button("Verify again", {}, check)) : el("p", { class: "muted" }, "Chain verification needs the master token."),
    status,
    el("table", { class: "timeline-table" }, el("thead", {}, el("tr", {}, el("th", {}, "id"), el("th", {}, "time"), el("th", {}, "type"), el("th", {}, "actor"), el("th", {}, "what"), el("th", {}, "hash"))), rows),
    more,
  );
  void load();
  if (master) void check();
  return {
    node,
    live(e) {
      if (!atEnd || e.environment !== envId || e.id <= last) return;
      rows.append(row(e));
      last = e.id;
      setText(status, `${rows.childElementCount} events, live`);
    },
  };
}
