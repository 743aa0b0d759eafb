// The audit log (docs/API.md, "Audit"): read a page at a time, followed live
// with an EventSource, and each event said in one line for a card.

import { type AuditEvent, query, request } from "./api";
import { argvLine, bytes, cut } from "./format";

/** Events per answer without follow (moatd's page). */
export const PAGE = 1000;

// An EventSource hands named events (`event: exec.ended`) only to listeners
// of that name, so the board listens for every type moatd records.
export const EVENT_TYPES = [
  "environment.created", "environment.failed", "environment.destroyed", "environment.ttl_set",
  "environment.reattached", "environment.restored", "environment.paused", "environment.resumed",
  "exec.started", "exec.ended", "process.started", "process.ended", "program.started",
  "process.input", "process.signal", "terminal.attached", "terminal.detached", "terminal.input",
  "file.written", "file.read", "file.removed", "file.moved", "dir.created",
  "gate.denied", "approval.requested", "approval.decided", "policy.changed",
  "egress.allowed", "egress.denied", "network.changed",
  "snapshot.created", "snapshot.deleted", "snapshot.failed",
  "agent.started", "agent.turn", "agent.tool", "agent.ended",
  "auth.failed", "auth.denied", "key.created", "key.revoked", "session.opened", "session.closed",
  "audit.summarized", "audit.checkpoint", "audit.prune_failed",
];

/** The events of an SSE answer (frames of `id:`, `event:`, `data:` lines). */
export function parseSse(text: string): AuditEvent[] {
  const out: AuditEvent[] = [];
  for (const frame of text.split("\n\n")) {
    let data = "";
    for (const line of frame.split("\n")) {
      if (line.startsWith("data:")) data += line.slice(line.startsWith("data: ") ? 6 : 5);
    }
    if (data) out.push(JSON.parse(data) as AuditEvent);
  }
  return out;
}

export interface PageQuery {
  since?: number;
  environment?: string;
  type?: string;
}

/** Up to PAGE events after `since`, oldest first. */
export async function eventsPage(q: PageQuery, signal?: AbortSignal): Promise<AuditEvent[]> {
  const res = await request("GET", `/v1/events${query({ ...q })}`, signal ? { signal } : {});
  return parseSse(await res.text());
}

/**
 * The newest event id the caller may see, and the newest events (up to a
 * page) to fill the cards with. moatd's pages run oldest first, so this
 * searches for the end: doubling steps past the newest full page until a
 * page comes back empty, then halving, each probe one page (a log of a
 * million events takes about 20 requests, a short one one; ids may be
 * sparse: a key sees only its own environments' events).
 */
export async function latestEvents(): Promise<{ last: number; recent: AuditEvent[] }> {
  const first = await eventsPage({ since: 0 });
  if (first.length < PAGE) return { last: lastOf(first, 0), recent: first };
  // A full page ends at `lo`: the log goes at least that far.
  let lo = lastOf(first, 0);
  let loPage = first;
  let hi = Infinity; // no event after hi
  // A probe that finds the end returns its page (every event after x).
  const probe = async (x: number): Promise<AuditEvent[] | null> => {
    const page = await eventsPage({ since: x });
    if (page.length === 0) hi = x;
    else if (page.length < PAGE) return page;
    else {
      lo = lastOf(page, x);
      loPage = page;
    }
    return null;
  };
  for (let step = Math.max(lo, PAGE); hi === Infinity; step *= 2) {
    const end = await probe(lo + step);
    if (end) return recentEnd(end, loPage);
  }
  while (hi - lo > PAGE) {
    const end = await probe(Math.floor((lo + hi) / 2));
    if (end) return recentEnd(end, loPage);
  }
  // At most a page of ids lies after lo: one read has every event after it.
  const tail = await eventsPage({ since: lo });
  return { last: lastOf(tail, lo), recent: [...loPage, ...tail].slice(-PAGE) };
}

function lastOf(page: AuditEvent[], fallback: number): number {
  return page[page.length - 1]?.id ?? fallback;
}

/**
 * `end` holds every event after some id; when it is short, one more read
 * further back (as far as the density of `before`, a full page, says about
 * nine tenths of a page reaches) gives the cards more history.
 */
async function recentEnd(end: AuditEvent[], before: AuditEvent[]): Promise<{ last: number; recent: AuditEvent[] }> {
  const last = lastOf(end, 0);
  if (end.length >= PAGE / 2 || before.length === 0) return { last, recent: end };
  const span = lastOf(before, 0) - (before[0]?.id ?? 0) + 1;
  const back = Math.ceil((0.9 * PAGE * span) / before.length);
  const more = await eventsPage({ since: Math.max(0, last - back) });
  // A full page may stop short of the end: then it is no use.
  const reaches = more.length < PAGE && lastOf(more, 0) === last;
  return { last, recent: reaches && more.length > end.length ? more : end };
}

export type StreamState = "connecting" | "live" | "reconnecting";

/** Wait before opening the stream again after moatd refused or ended it. */
const REOPEN_MS = 3000;

/**
 * Follows the log from `since`: every event after it, live. After a broken
 * connection the browser reconnects by itself and sends the last id it saw
 * (Last-Event-ID), so none is lost or repeated; after an answer that is not
 * a stream (moatd restarting: 503; signed out: 401), which ends an
 * EventSource for good, a new one starts from the last id seen.
 */
export function followEvents(
  since: number,
  onEvent: (e: AuditEvent) => void,
  onState: (s: StreamState) => void,
): { close(): void } {
  let last = since;
  let source: EventSource | null = null;
  let timer: ReturnType<typeof setTimeout> | undefined;
  let closed = false;
  const handle = (m: MessageEvent<string>) => {
    let e: AuditEvent;
    try {
      e = JSON.parse(m.data) as AuditEvent;
    } catch {
      return;
    }
    if (e.id <= last) return;
    last = e.id;
    onEvent(e);
  };
  const open = () => {
    source = new EventSource(`/v1/events${query({ follow: 1, since: last })}`);
    for (const t of EVENT_TYPES) source.addEventListener(t, handle as EventListener);
    source.addEventListener("message", handle as EventListener);
    source.addEventListener("open", () => onState("live"));
    source.addEventListener("error", () => {
      onState("reconnecting");
      if (source?.readyState === EventSource.CLOSED && !closed) {
        source = null;
        timer = setTimeout(open, REOPEN_MS);
      }
    });
  };
  onState("connecting");
  open();
  return {
    close() {
      closed = true;
      clearTimeout(timer);
      source?.close();
    },
  };
}

// ---- one line per event ----

export type Tone = "ok" | "bad" | "ask" | "info";

export interface Said {
  text: string;
  tone: Tone;
}

const str = (v: unknown): string => (typeof v === "string" ? v : v === undefined || v === null ? "" : JSON.stringify(v));
const num = (v: unknown): number | undefined => (typeof v === "number" ? v : undefined);

/** What a gate action is about, in a line: the command, the path, the host. */
export function actionLine(action: unknown): string {
  if (!action || typeof action !== "object") return "";
  const a = action as Record<string, unknown>;
  const scope = str(a["scope"]);
  if (scope === "run_command") return `${str(a["op"]) || "run"} ${argvLine(a["argv"])}`;
  if (scope === "read_file" || scope === "write_file") {
    const size = num(a["size"]);
    return `${str(a["op"])} ${str(a["path"])}${a["tree"] ? " (tree)" : ""}${size ? ` (${bytes(size)})` : ""}`;
  }
  if (scope === "network") {
    const port = num(a["port"]);
    return `connect ${str(a["host"])}${port ? `:${port}` : ""}`;
  }
  return JSON.stringify(a);
}

export function describeEvent(e: AuditEvent): Said {
  const d = e.data ?? {};
  const argv = argvLine(d["argv"]);
  switch (e.type) {
    case "exec.started":
    case "process.started":
      return { text: `$ ${argv}`, tone: "info" };
    case "exec.ended":
    case "process.ended": {
      const state = str(d["state"]);
      if (state === "failed") return { text: `$ ${argv}: ${str(d["error"]) || "could not start"}`, tone: "bad" };
      if (state === "lost") return { text: `$ ${argv}: lost (${str(d["reason"])})`, tone: "bad" };
      const code = num(d["exit_code"]) ?? 0;
      const ms = num(d["duration_ms"]);
      const timedOut = d["timed_out"] === true ? ", timed out" : "";
      return {
        text: `$ ${argv} → exit ${code}${timedOut}${ms !== undefined ? ` (${ms} ms)` : ""}`,
        tone: code === 0 ? "ok" : "bad",
      };
    }
    case "program.started":
      return { text: `program ${argvLine((d["action"] as Record<string, unknown> | undefined)?.["argv"])}`, tone: "info" };
    case "file.written": {
      if (d["error"]) return { text: `write ${str(d["path"])} failed: ${str(d["error"])}`, tone: "bad" };
      const size = num(d["size"]) ?? 0;
      return { text: `${d["append"] ? "appended" : "wrote"} ${str(d["path"])} (${bytes(size)})`, tone: "ok" };
    }
    case "file.read":
      if (d["error"]) return { text: `read ${str(d["path"])} failed: ${str(d["error"])}`, tone: "bad" };
      return { text: `${str(d["op"]) || "read"} ${str(d["path"])}`, tone: "info" };
    case "file.removed":
      return { text: `removed ${str(d["path"])}${d["recursive"] ? " (recursive)" : ""}`, tone: "info" };
    case "file.moved":
      return { text: `moved ${str(d["from"])} → ${str(d["to"])}`, tone: "info" };
    case "dir.created":
      return { text: `mkdir ${str(d["path"])}`, tone: "info" };
    case "egress.allowed":
    case "egress.denied": {
      const allowed = e.type === "egress.allowed";
      const port = num(d["port"]);
      const target = `${str(d["host"]) || str(d["address"])}${port ? `:${port}` : ""}`;
      const req = d["method"] ? ` ${str(d["method"])} ${cut(str(d["path"]), 60)}` : "";
      const why = allowed ? (d["rule"] ? ` (${str(d["rule"])})` : "") : `: ${str(d["reason"])}`;
      return { text: `egress ${allowed ? "allowed" : "denied"} ${target}${req}${why}`, tone: allowed ? "ok" : "bad" };
    }
    case "gate.denied":
      return { text: `denied: ${actionLine(d["action"])}`, tone: "bad" };
    case "approval.requested":
      return { text: `asks: ${actionLine(d["action"])}`, tone: "ask" };
    case "approval.decided": {
      const state = str(d["state"]);
      const reason = str(d["reason"]);
      return {
        text: `${state} by ${str(d["decided_by"])}: ${actionLine(d["action"])}${reason ? ` (${reason})` : ""}`,
        tone: state === "approved" ? "ok" : "bad",
      };
    }
    case "policy.changed":
      return { text: "permissions changed", tone: "info" };
    case "environment.created":
      return {
        text: `created${d["forked_from"] ? ` (fork of ${str(d["forked_from"])})` : ""}${d["from_snapshot"] ? ` from ${str(d["from_snapshot"])}` : ""}${d["warm"] ? " (warm)" : ""}`,
        tone: "info",
      };
    case "environment.destroyed":
      return { text: `ended: ${str(d["reason"])}`, tone: "bad" };
    case "environment.failed":
      return { text: `failed: ${str(d["error"])}`, tone: "bad" };
    case "environment.ttl_set":
      return { text: `ttl set to ${num(d["ttl_s"]) ?? "?"} s`, tone: "info" };
    case "environment.restored":
      return { text: `restored from ${str(d["snapshot"])}`, tone: "info" };
    case "environment.paused":
      return { text: "paused", tone: "info" };
    case "environment.resumed":
      return { text: `resumed${num(d["paused_ms"]) !== undefined ? ` after ${Math.round((num(d["paused_ms"]) ?? 0) / 1000)} s` : ""}`, tone: "info" };
    case "snapshot.created":
      return { text: `snapshot ${str(d["snapshot"]) || str(d["id"])}${d["name"] ? ` "${str(d["name"])}"` : ""}`, tone: "ok" };
    case "terminal.input":
      return { text: `typed ${cut(JSON.stringify(str(d["text"])), 60)}`, tone: "info" };
    case "agent.started":
      return { text: `agent ${str(d["run"])} started (${str(d["provider"])} ${str(d["model"])})`, tone: "info" };
    case "agent.turn": {
      const tools = Array.isArray(d["tool_calls"]) ? (d["tool_calls"] as unknown[]).map(str).join(", ") : "";
      return { text: `agent turn ${num(d["iteration"]) ?? "?"}${tools ? `: ${tools}` : ": answered"}`, tone: "info" };
    }
    case "agent.tool":
      return { text: `agent tool ${str(d["name"])}${d["is_error"] ? " (error)" : ""}`, tone: d["is_error"] ? "bad" : "ok" };
    case "agent.ended":
      return { text: `agent ${str(d["state"])}${d["reason"] ? `: ${cut(str(d["reason"]), 120)}` : ""}`, tone: str(d["state"]) === "completed" ? "ok" : "bad" };
    default:
      return { text: e.type, tone: "info" };
  }
}
